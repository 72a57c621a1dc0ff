// Weights shards and the kernel library (native.h).
#include "native.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "../instr.h"   // dtype_named: the runner's dtype table

namespace aotc::fe {

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;
const char* kRedo = "re-export the model (the weights file was damaged or not written by aotc)";

const std::pair<const char*, at::ScalarType> kCodes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf}, {"BF16", at::kBFloat16},
    {"I64", at::kLong}, {"I32", at::kInt}, {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte}, {"BOOL", at::kBool}, {"C64", at::kComplexFloat},
    {"F8_E4M3", at::kFloat8_e4m3fn}, {"F8_E5M2", at::kFloat8_e5m2}};

StoredTensor entry(const json::Field& f, uint64_t data, uint64_t base) {
  StoredTensor t;
  const std::string& code = f["dtype"].string(16);
  bool known = false;
  for (const auto& [c, dt] : kCodes)
    if (code == c) t.dtype = dt, known = true;
  if (!known) f["dtype"].fail("a safetensors dtype (F32, BF16, I64, ...)", f["dtype"].found());
  size_t rank = f["shape"].size(16);
  uint64_t numel = 1;
  for (size_t d = 0; d < rank; ++d) {
    t.shape.push_back(f["shape"][d].integer(0, (int64_t(1) << 48) - 1));
    if (__builtin_mul_overflow(numel, uint64_t(t.shape.back()), &numel))
      f["shape"].fail("a shape of at most 2**64 elements", "more");
  }
  if (f["data_offsets"].size(2) != 2) f["data_offsets"].fail("[begin, end]", "another length");
  uint64_t lo = uint64_t(f["data_offsets"][0].integer(0, int64_t(data)));
  uint64_t hi = uint64_t(f["data_offsets"][1].integer(int64_t(lo), int64_t(data)));
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, uint64_t(c10::elementSize(t.dtype)), &bytes) || hi - lo != bytes)
    f["data_offsets"].fail(std::to_string(bytes) + " bytes for its shape and dtype",
                           std::to_string(hi - lo) + " bytes");
  t.begin = base + lo, t.end = base + hi;
  return t;
}

}  // namespace

std::map<std::string, StoredTensor> safetensors_header(const Bytes& b, const std::string& where) {
  if (b.size < 8)
    throw ArtifactError(where + " has a damaged header: too short", where,
                        "an 8-byte header length", std::to_string(b.size) + " bytes", kRedo);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | b.data[i];
  if (n > std::min<uint64_t>(kMaxHeader, b.size - 8))
    throw ArtifactError(where + " has a damaged header: header length past the end", where,
                        "at most " + std::to_string(std::min<uint64_t>(kMaxHeader, b.size - 8)),
                        std::to_string(n), kRedo);
  json::Value header = json::parse(
      std::string_view(reinterpret_cast<const char*>(b.data) + 8, n), where, kMaxHeader);
  json::Field root(header, where, "");
  std::map<std::string, StoredTensor> out;
  for (const auto& [name, v] : root.members(1 << 20))
    if (name != "__metadata__") out[name] = entry(root.member(name, v), b.size - 8 - n, 8 + n);
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, t] : out)
    if (t.end > t.begin) spans.emplace_back(t.begin, t.end);
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second)
      throw ArtifactError(where + " has a damaged header: two tensors overlap", where,
                          "disjoint byte ranges", "overlapping ranges at byte " +
                          std::to_string(spans[i].first), kRedo);
  return out;
}

at::Tensor stored_tensor(const std::shared_ptr<const Bytes>& b, const StoredTensor& t) {
  size_t item = c10::elementSize(t.dtype);
  void* p = const_cast<uint8_t*>(b->data + t.begin);
  auto keep = new std::shared_ptr<const Bytes>(b);
  at::Tensor out = at::from_blob(p, t.shape, [keep](void*) { delete keep; },
                                 at::TensorOptions().dtype(t.dtype));
  return t.begin % item ? out.clone() : out;
}

at::ScalarType dtype_of(const std::string& name, const json::Field& at) {
  try {
    return dtype_named(name, at.where());
  } catch (const SpecError&) {
    at.fail("a dtype of the plan's table (float32, bfloat16, int64, ...)", at.found());
  }
}

// ------------------------------------------------------------------- CPU levels (artifact/isa.py)

namespace {

const std::map<std::string, std::vector<std::string>>& level_flags() {
  static const std::map<std::string, std::vector<std::string>> kLevels = {
      {"x86-64", {}},
      {"x86-64-v2", {"sse4_2", "popcnt", "ssse3"}},
      {"x86-64-v3", {"sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2", "f16c", "movbe"}},
      {"x86-64-v4", {"sse4_2", "popcnt", "avx", "avx2", "fma", "bmi2", "f16c", "movbe",
                     "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}},
      {"armv8-a", {}}};
  return kLevels;
}

const std::set<std::string>& host_flags() {
  static const std::set<std::string> flags = [] {
    std::set<std::string> out;
    std::ifstream f("/proc/cpuinfo");
    for (std::string line; std::getline(f, line);)
      if (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0) {
        std::istringstream words(line.substr(line.find(':') + 1));
        for (std::string w; words >> w;) out.insert(w);
        break;
      }
    return out;
  }();
  return flags;
}

std::string host_arch() {
  struct utsname u;
  std::string m = ::uname(&u) == 0 ? u.machine : "";
  return m == "arm64" || m == "aarch64" ? "aarch64" : m;
}

std::string arch_of(const std::string& level) { return level.rfind("arm", 0) == 0 ? "aarch64" : "x86_64"; }

std::vector<std::string> missing_flags(const std::string& level) {
  std::vector<std::string> out;
  auto it = level_flags().find(level);
  for (const auto& f : it == level_flags().end() ? std::vector<std::string>{} : it->second)
    if (!host_flags().count(f)) out.push_back(f);
  std::sort(out.begin(), out.end());
  return out;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

void check_level(const std::string& level) {
  const char* where = "manifest target.native.libraries";
  std::string arch = arch_of(level), host = host_arch();
  if (arch != host)
    throw TargetError("artifact kernels were built for " + arch + " (" + level + "); this host is " +
                      host, where, arch, host, "re-export on a " + host +
                      " host, or export with --no-codegen");
  auto missing = missing_flags(level);
  if (!missing.empty())
    throw TargetError("artifact kernels need CPU level " + level + "; this CPU lacks " +
                      joined(missing), where, "a CPU with " + level, "missing " + joined(missing),
                      "re-export with --isa auto (it includes the x86-64-v2 baseline) or a level "
                      "this host has");
}

}  // namespace

std::string pick_level(const std::vector<std::pair<std::string, std::string>>& levels,
                       const std::string& wanted) {
  if (!wanted.empty()) {
    std::vector<std::string> names;
    for (const auto& l : levels) names.push_back(l.first);
    if (std::find(names.begin(), names.end(), wanted) == names.end())
      throw TargetError("the artifact has no kernels built for " + wanted, "LoadOptions.isa",
                        "[" + joined(names) + "]", wanted, "load with one of the levels listed, "
                        "or leave isa unset");
    check_level(wanted);
    return wanted;
  }
  std::string best;
  for (const auto& [level, file] : levels)
    if (arch_of(level) == host_arch() && missing_flags(level).empty()) best = level;
  if (best.empty()) check_level(levels.at(0).first);
  return best;
}

}  // namespace aotc::fe
