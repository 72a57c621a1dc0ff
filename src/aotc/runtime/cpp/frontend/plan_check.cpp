// plans/<entry>.json and the manifest's entries checked as artifact/schema/plan.py, flow.py and
// manifest.py check them (plan_check.h): the fields of each record, their types and ranges,
// names and ops from the tables, sizes in the grammar, and the plan as a program (every slot a
// step reads bound and not freed, outputs bound at the end).
#include "plan_check.h"

#include <algorithm>
#include <regex>
#include <string_view>
#include <vector>

#include "checks.h"
#include "rules.h"

namespace aotc::fe {

namespace {

using json::Field;
using json::Value;
using namespace checks;

struct Slot {
  std::string kind, producer;
  bool tensor = false;
};

Slot slot(const Field& a, size_t i, const Names& symbols) {
  keys(a, std::array<std::string_view, 2>{"id", "kind"}, rules::kSlotKeys);
  if (a["id"].integer(0, rules::kMaxSlots) != int64_t(i)) a["id"].fail("slot id " + std::to_string(i), a["id"].found());
  Slot s{choice(a["kind"], rules::kSlotKinds), "", a.has("dtype")};
  if (s.tensor) {
    if (sizes(a["stride"], symbols) != sizes(a["shape"], symbols)) a["stride"].fail("one stride per dim", "another length");
    choice(a["dtype"], rules::kDtypes);
    a["contiguous"].boolean();
  } else if (a.has("shape") || a.has("stride") || a.has("contiguous")) {
    a.fail("a non-tensor slot without shape", "a shape but no dtype");
  }
  if (a.has("producer")) s.producer = choice(a["producer"], rules::kStepKinds);
  if (a.has("base")) a["base"].integer(0, rules::kMaxSlots);
  std::set<std::string> allowed;
  if (s.kind == "weight") {
    weight_name(a["weight"], 1024), allowed = {"weight", "layout", "memory_format"};
    if (a.has("layout")) choice(a["layout"], rules::kSlotLayouts);
    if (a.has("memory_format")) choice(a["memory_format"], rules::kSlotMemoryFormats);
  } else if (s.kind == "input") {
    weight_name(a["name"], 256), allowed = {"name"};
  } else if (s.kind == "state") {
    weight_name(a["state"], 1024), allowed = {"state"};
  }
  for (const char* k : {"weight", "state", "layout", "memory_format", "name"})
    if (a.has(k) && !allowed.count(k)) a[k].fail(std::string("no ") + k + " on a " + s.kind + " slot", a[k].found());
  if ((s.kind == "weight" || s.kind == "state") && !s.tensor) a.fail("a " + s.kind + " slot with a dtype", "no tensor");
  return s;
}

// plan.py _arg: the slots it reads are added to `reads`
void arg(const Field& a, int64_t n, const Names& symbols, std::vector<int64_t>& reads, int depth = 0) {
  switch (a.type()) {
    case Value::Type::Null: case Value::Type::Bool: case Value::Type::Int: case Value::Type::Float: return;
    case Value::Type::String: str(a, 256); return;
    case Value::Type::Array:
      if (depth >= 4) a.fail("arguments nested at most 4 lists deep", "deeper");
      for (size_t i = 0, m = a.size(1 << 16); i < m; ++i) arg(a[i], n, symbols, reads, depth + 1);
      return;
    default: break;
  }
  keys(a, std::array<std::string_view, 0>{}, rules::kArgKeys);
  if (a.value().members.size() != 1) a.fail("one tag: slot, sym, dtype, layout, memory_format, device, float", a.found());
  const auto& [tag, v] = a.value().members[0];
  Field t = a.member(tag, v);
  if (tag == "slot") return reads.push_back(t.integer(0, n - 1));
  if (tag == "sym") return check_expr(t, symbols, false);
  if (tag == "dtype") choice(t, rules::kTagDtype);
  if (tag == "layout") choice(t, rules::kTagLayout);
  if (tag == "memory_format") choice(t, rules::kTagMemoryFormat);
  if (tag == "device") choice(t, rules::kTagDevice);
  if (tag == "float") choice(t, rules::kTagFloat);
}

bool extern_op(const std::string& op);

struct Step {
  std::string kind, name;
  std::vector<int64_t> reads, out, slots, donate;
  std::vector<std::pair<int64_t, int64_t>> reuse;   // (out slot, donor)
};

Step kernel_step(const Field& a, int64_t n, const Names& symbols) {
  keys(a, rules::kKernelRequired, rules::kKernelOptional);
  Step s{"kernel", matching(a["name"], rules::kKernelNamePattern, 64), ints(a["args"], n - 1), ints(a["out"], n - 1)};
  if (a.has("sizes"))
    for (size_t i = 0, m = a["sizes"].size(64); i < m; ++i)
      if (!symbols.count(ident(a["sizes"][i]))) a["sizes"][i].fail("a declared size symbol", a["sizes"][i].found());
  if (a.has("reuse"))
    for (const auto& [k, v] : a["reuse"].members(1 << 12)) {
      Field d = a["reuse"].member(k, v);
      bool digits = !k.empty() && k.size() < 8 && std::all_of(k.begin(), k.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!digits || std::stoll(k) >= n) d.fail("a slot number below " + std::to_string(n), json::dump(k));
      s.reuse.emplace_back(std::stoll(k), d.integer(0, n - 1));
    }
  if (a.has("launch")) {
    Field la = a["launch"];
    keys(la, rules::kLaunchRequired, rules::kLaunchOptional);
    if (la["grid"].size(3) != 3) la["grid"].fail("3 items", la["grid"].found());
    for (size_t i = 0; i < 3; ++i) check_expr(la["grid"][i], symbols, false);
    if (str(la["spec"], 256) != "kernels/" + s.name + ".json") la["spec"].fail("the launch spec kernels/" + s.name + ".json", la["spec"].found());
    if (la.has("error_code") && la["error_code"].type() != Value::Type::Null) la["error_code"].integer(1, 1 << 30);
  }
  if (a.has("checks"))
    for (size_t i = 0, m = a["checks"].size(64); i < m; ++i) {
      Field c = a["checks"][i];
      keys(c, rules::kCheckRequired, rules::kCheckOptional);
      if (c["arg"].type() != Value::Type::Null && c["arg"].integer(0, 4096) >= int64_t(s.reads.size()))
        c["arg"].fail("an argument position below " + std::to_string(s.reads.size()), c["arg"].found());
      size(c["size"], symbols);
      c["wraps"].boolean();
      matching(c["op"], rules::kOpNamePattern, rules::kMaxStr);
    }
  if (a.has("fused"))
    for (size_t i = 0, m = a["fused"].size(rules::kMaxList); i < m; ++i)
      keys(a["fused"][i], std::array<std::string_view, 0>{}, std::array<std::string_view, 2>{"buffers", "ops"});
  if (a.has("reasons"))
    for (size_t i = 0, m = a["reasons"].size(rules::kMaxList); i < m; ++i) text(a["reasons"][i], rules::kMaxStr);
  if (s.out.empty()) a["out"].fail("a kernel that writes at least one slot", "nothing");
  return s;
}

Step call_step(const Field& a, const std::string& kind, int64_t n, const Names& symbols) {
  keys(a, rules::kCallRequired, rules::kCallOptional);
  Step s{kind};
  Field op = a["op"];
  if (op.type() != Value::Type::String || !extern_op(op.value().s)) {
    matching(op, rules::kOpNamePattern, 128);
    op.fail("an ATen op aotc's codegen emits (the runtime's op table)", op.found());
  }
  for (const auto& [k, v] : a["kwargs"].members(64)) {
    arg(a["kwargs"].member(k, v), n, symbols, s.reads);
    if (!matches(k, rules::kNamePattern)) a["kwargs"].member(k, v).fail("an argument name (an identifier)", json::dump(k));
  }
  for (size_t i = 0, m = a["args"].size(64); i < m; ++i) arg(a["args"][i], n, symbols, s.reads);
  for (int64_t o : ints(a["out"], n - 1, true))
    if (o >= 0) s.out.push_back(o);
  if (a.has("single")) a["single"].boolean();
  if (a.has("source")) weight_name(a["source"], 1024);
  if (a.has("binds"))
    for (const auto& [k, v] : a["binds"].members(16)) {
      Field b = a["binds"].member(k, v);
      if (!matches(k, rules::kNamePattern) || !symbols.count(k)) b.fail("a symbol the manifest declares", json::dump(k));
      if (b.size(2) != 2) b.fail("[result, dim]", b.found());
      b[0].integer(0, 64);
      if (b[1].type() != Value::Type::Null) b[1].integer(0, 15);
    }
  return s;
}

Step step(const Field& a, int64_t n, const Names& symbols) {
  const std::string& kind = choice(a["kind"], rules::kStepKinds);
  if (kind == "kernel") return kernel_step(a, n, symbols);
  if (kind != "free") return call_step(a, kind, n, symbols);
  keys(a, rules::kFreeRequired, rules::kFreeOptional);
  Step s{kind};
  s.slots = ints(a["slots"], n - 1);
  if (a.has("donate")) s.donate = ints(a["donate"], n - 1);
  return s;
}

// flow.py _check_step: what a step reads is bound, what it binds is new
void flow(const Field& at, const Step& s, const std::vector<Slot>& slots, std::set<int64_t>& bound, std::set<int64_t>& donated) {
  for (int64_t r : s.reads)
    if (!bound.count(r)) at.fail("slot " + std::to_string(r) + " bound before this step", "reads slot " + std::to_string(r) + ", which is not bound here (never bound, or freed)");
  if (s.kind == "free") {
    for (const auto* list : {&s.slots, &s.donate})
      for (int64_t x : *list) {
        if (!bound.count(x) || slots[x].kind == "weight" || slots[x].kind == "state")
          at.fail("bound input or value slots", "frees slot " + std::to_string(x) + ", which it may not");
        bound.erase(x);
      }
    donated.insert(s.donate.begin(), s.donate.end());
    bound.insert(s.donate.begin(), s.donate.end());
    return;
  }
  for (int64_t o : s.out) {
    if (slots[o].kind != "value" || bound.count(o)) at.fail("new value slots for what the step binds", "binds slot " + std::to_string(o) + " again");
    if (s.kind != "kernel" && slots[o].producer == "kernel") at.fail("a slot said to be a kernel's bound by a kernel", "a " + s.kind + " step");
  }
  if (s.kind == "kernel") {
    for (const auto* list : {&s.reads, &s.out})
      for (int64_t x : *list)
        if (!slots[x].tensor) at.fail("tensor slots", "passes slot " + std::to_string(x) + ", which is no tensor");
    for (auto [out, donor] : s.reuse) {
      if (std::find(s.out.begin(), s.out.end(), out) == s.out.end() || !donated.count(donor) || !bound.count(donor))
        at.fail("storage donated by an earlier free step", "reuses slot " + std::to_string(donor));
      donated.erase(donor), bound.erase(donor);
    }
  }
  bound.insert(s.out.begin(), s.out.end());
}

void check_plan(const Field& p, const std::string& name, const Names& symbols) {
  keys(p, rules::kPlanRequired, rules::kPlanOptional);
  if (p["entry"].type() != Value::Type::String || p["entry"].value().s != name) p["entry"].fail("the entry name " + json::dump(name), p["entry"].found());
  std::vector<Slot> slots;
  for (size_t i = 0, n = p["slots"].size(rules::kMaxSlots); i < n; ++i) slots.push_back(slot(p["slots"][i], i, symbols));
  int64_t n = int64_t(slots.size());
  std::set<int64_t> bound, donated, declared;
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i].kind == "weight" || slots[i].kind == "state") bound.insert(i);
    if (slots[i].kind == "input") declared.insert(i);
  }
  Field inputs = p["inputs"];
  for (int64_t i : ints(inputs, n - 1)) {
    if (slots[i].kind != "input" || bound.count(i) || slots[i].producer == "kernel") inputs.fail("input slots, each listed once", "slot " + std::to_string(i));
    bound.insert(i);
  }
  for (int64_t i : declared)
    if (!bound.count(i)) inputs.fail("every input slot listed", "misses an input slot");
  for (size_t i = 0, m = p["steps"].size(rules::kMaxList); i < m; ++i) flow(p["steps"][i], step(p["steps"][i], n, symbols), slots, bound, donated);
  Field outs = p["outputs"];
  for (size_t i = 0, m = outs.size(rules::kMaxList); i < m; ++i) {
    Field o = outs[i];
    keys(o, rules::kOutputRequired, rules::kOutputOptional);
    if (o.has("slot") == o.has("const")) o.fail("either a slot or a constant", o.found());
    if (o.has("slot") && !bound.count(o["slot"].integer(0, n - 1))) o.fail("outputs bound at the end of the plan", o.found());
    if (o.has("const") && o["const"].type() == Value::Type::String) text(o["const"], 256);
    if (o.has("const") && (o["const"].type() == Value::Type::Array || o["const"].type() == Value::Type::Object))
      o["const"].fail("a constant: null, a boolean, a number or a string", o["const"].found());
  }
}

// trees.py parse_tree
void tree(const Field& a, size_t n_outputs, size_t depth = 0) {
  if (depth > rules::kMaxTreeDepth) a.fail("an output structure nested at most " + std::to_string(rules::kMaxTreeDepth) + " levels", "deeper");
  const std::string& kind = choice(a["kind"], rules::kTreeKinds);
  using A = std::array<std::string_view, 0>;
  if (kind == "tensor") {
    keys(a, std::array<std::string_view, 2>{"kind", "index"}, A{});
    if (n_outputs == 0) a.fail("no tensor leaf: the entry has no outputs", a.found());
    a["index"].integer(0, int64_t(n_outputs) - 1);
  } else if (kind == "const") {
    keys(a, std::array<std::string_view, 2>{"kind", "value"}, A{});
    auto t = a["value"].type();
    if (t == Value::Type::Array || t == Value::Type::Object) a["value"].fail("a constant: null, a boolean, a number or a string", a["value"].found());
    if (t == Value::Type::String) text(a["value"], 1024);
  } else {
    size_t items = a["items"].size(1 << 16);
    for (size_t i = 0; i < items; ++i) tree(a["items"][i], n_outputs, depth + 1);
    if (kind != "dict") return keys(a, std::array<std::string_view, 2>{"kind", "items"}, A{});
    keys(a, std::array<std::string_view, 3>{"kind", "keys", "items"}, std::array<std::string_view, 1>{"class"});
    if (a["keys"].size(1 << 16) != items) a.fail("one key per item", "unequal keys and items");
    for (size_t i = 0; i < items; ++i)
      a["keys"][i].type() == Value::Type::Int ? (void)a["keys"][i].integer(-(int64_t(1) << 62), int64_t(1) << 62) : (void)str(a["keys"][i], 256);
    if (a.has("class") && a["class"].type() != Value::Type::Null) text(a["class"], 128);
  }
}

// manifest.py _entry: returns its symbols
Names entry(const Field& a, const std::string& name, int version) {
  if (!matches(name, rules::kEntryPattern)) a.fail("an entry name (lowercase identifier)", json::dump(name));
  keys(a, rules::kEntryRequired, rules::kEntryOptional, version >= rules::kParametersSince ? "parameters" : "");
  if (str(a["plan"]) != "plans/" + name + ".json") a["plan"].fail("plans/" + name + ".json", a["plan"].found());
  Names symbols;
  for (const auto& [k, v] : a["symbols"].members(256)) {
    Field s = a["symbols"].member(k, v);
    if (!matches(k, rules::kNamePattern) || in(rules::kExprKeywords, k)) s.fail("a symbol name (an ASCII identifier)", json::dump(k));
    keys(s, rules::kSymbolRequired, rules::kSymbolOptional);
    int64_t lo = s["min"].integer(0, rules::kMaxDim), hi = s["max"].integer(0, rules::kMaxDim);
    if (lo > hi) s.fail("min <= max", s.found());
    if (s.has("example")) s["example"].integer(lo, hi);
    symbols.insert(k);
  }
  for (size_t i = 0, n = a["inputs"].size(4096); i < n; ++i) {
    Field in_ = a["inputs"][i];
    keys(in_, rules::kInputRequired, rules::kInputOptional);
    if (in_.has("values") && in_["values"].type() != Value::Type::Null) {
      Field v = in_["values"];
      if (v.size(2) != 2) v.fail("[lo, hi]", v.found());
      if (v[0].integer(INT64_MIN, INT64_MAX) > v[1].integer(INT64_MIN, INT64_MAX)) v.fail("[lo, hi] with lo <= hi", v.found());
    }
    weight_name(in_["name"], 256);
    choice(in_["dtype"], rules::kDtypes);
    sizes(in_["shape"], symbols, rules::kMaxDim);
  }
  size_t n_outputs = a["outputs"].size(1 << 16);
  for (size_t i = 0; i < n_outputs; ++i) {
    Field o = a["outputs"][i];
    if (o.type() == Value::Type::Null) continue;
    keys(o, rules::kMetaRequired, rules::kMetaOptional);
    if (sizes(o["shape"], symbols, rules::kMaxDim) != sizes(o["stride"], symbols, rules::kMaxDim)) o.fail("one stride per dim", o.found());
    choice(o["dtype"], rules::kDtypes);
  }
  for (size_t i = 0, n = a["relations"].size(256); i < n; ++i) check_expr(a["relations"][i], symbols, true);
  tree(a["output_tree"], n_outputs);
  return symbols;
}

}  // namespace

bool allowed_op(const std::string& qualname);   // spec.cpp: artifact/schema/extern_ops.txt

namespace {
bool aotc_op(const std::string& op) {   // in aotc's own op table (rules::kAotcOps)
  for (const auto& entry : rules::kAotcOps)
    if (op == entry.name) return true;
  return false;
}

bool extern_op(const std::string& op) {
  return aotc_op(op) || (op.rfind("aotc::", 0) != 0 && allowed_op(op));
}
}  // namespace

json::Value check_entry_and_plan(const Artifact& art, const std::string& name, const Field& spec) {
  Names symbols = entry(spec, name, art.version());
  std::string rel = "plans/" + name + ".json";
  if (!art.listed(rel))
    Field(spec.value(), rel, "").fail("a listed " + rel, "none");
  auto bytes = art.read(rel);
  Value doc = json::parse(std::string_view(reinterpret_cast<const char*>(bytes->data), bytes->size), rel,
                          rules::kMaxJsonBytes);
  check_plan(Field(doc, rel, ""), name, symbols);
  return doc;
}

}  // namespace aotc::fe
