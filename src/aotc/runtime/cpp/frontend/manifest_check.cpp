// The manifest's records checked as artifact/schema/manifest.py parse_manifest checks them (the
// fields of the manifest, its producer, model, options, target and native kernels, weights;
// at least one entry; the files the format requires listed), so that a manifest Python refuses
// is refused here too. Its entries are plan_check.cpp's; its files, levels and state are
// checked where the front end reads them (files.cpp, module.cpp).
#include "checks.h"
#include "plan_check.h"

namespace aotc::fe {

namespace {

using namespace checks;

void target(const Field& t, std::vector<std::string>& need) {
  keys(t, rules::kTargetRequired, rules::kTargetOptional);
  for (size_t i = 0, n = t["archs"].size(16); i < n; ++i) matching(t["archs"][i], rules::kArchPattern, rules::kMaxStr);
  t["portable"].boolean();
  Field n = t["native"];
  if (n.type() == Value::Type::Null) return;
  if (n.has("kind")) {
    keys(n, rules::kTritonNativeRequired, rules::kTritonNativeOptional);
    choice(n["kind"], std::array<std::string_view, 1>{"triton"});
    text(n["triton"], 64);
    for (size_t i = 0, m = n["archs"].size(16); i < m; ++i) matching(n["archs"][i], rules::kArchPattern, rules::kMaxStr);
    for (size_t i = 0, m = n["kernels"].size(1 << 16); i < m; ++i) {
      const std::string& k = ident(n["kernels"][i]);
      need.push_back("kernels/" + k + ".json"), need.push_back("kernels/" + k + ".py");
    }
    if (n.has("autotune") && n["autotune"].type() != Value::Type::Null) n["autotune"].members(rules::kMaxList);
    return;
  }
  keys(n, rules::kCppNativeRequired, rules::kCppNativeOptional);
  for (const auto& [level, path] : n["libraries"].members(64))
    if (path.type == Value::Type::String) need.push_back(path.s);   // each level's: module.cpp
  text(n["compiler"], 512);
  if (str(n["source"]) != rules::kCppSource) n["source"].fail(std::string("one of [\"") + rules::kCppSource + "\"]", n["source"].found());
  need.push_back(rules::kCppSource);
  if (n.has("table")) n["table"].boolean();
}

void weights(const Field& w, std::vector<std::string>& need) {
  keys(w, rules::kWeightsRequired, rules::kWeightsOptional);
  for (const auto& [k, v] : w["aliases"].members(rules::kMaxList)) weight_name(w["aliases"].member(k, v), 1024);
  for (size_t i = 0, n = w["shards"].size(100000); i < n; ++i) need.push_back(str(w["shards"][i], 256));
}

}  // namespace

void check_manifest(const Artifact& art) {
  Field m = art.field();
  keys(m, rules::kManifestRequired, rules::kManifestOptional);
  const auto& entries = m["entries"].members(rules::kMaxEntries);
  if (entries.empty()) m["entries"].fail("at least one entry point", "none");
  keys(m["producer"], rules::kProducerRequired, rules::kProducerOptional);
  for (const auto& [k, v] : m["producer"].members(32)) text(m["producer"].member(k, v), 256);
  keys(m["model"], rules::kModelRequired, rules::kModelOptional);
  for (const char* k : {"name", "source"})
    if (m["model"][k].type() != Value::Type::Null) weight_name(m["model"][k], 4096);
  for (const auto& [k, v] : m["options"].members(64)) {
    Field o = m["options"].member(k, v);
    if (!matches(k, rules::kNamePattern)) o.fail("option names", json::dump(k));
    if (v.type == Value::Type::Array || v.type == Value::Type::Object) o.fail("a scalar option value", o.found());
  }
  std::vector<std::string> need;
  for (const auto& [name, v] : entries) need.push_back("plans/" + name + ".json");
  target(m["target"], need);
  weights(m["weights"], need);
  for (const auto& rel : need)   // manifest.py _check_listed
    if (!art.listed(rel)) m["files"].fail(rel + " listed (the artifact needs it)", "does not list " + rel);
}

}  // namespace aotc::fe
