// CudaKernels (cuda_kernels.h): launch specs read, cubins loaded, kernel steps bound.
#include "cuda_kernels.h"
#include "rules.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace aotc::fe {

namespace {

using json::Field;
using json::Value;

const std::pair<const char*, const char*> kPointerDtypes[] = {
    {"*fp64", "float64"}, {"*fp32", "float32"}, {"*fp16", "float16"}, {"*bf16", "bfloat16"},
    {"*i64", "int64"}, {"*i32", "int32"}, {"*i16", "int16"}, {"*i8", "int8"}, {"*u8", "uint8"},
    {"*i1", "bool"}, {"*fp8e4nv", "float8_e4m3fn"}, {"*fp8e5", "float8_e5m2"}};

bool ident(const std::string& s) {
  if (s.empty() || s.size() > 128 || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::string ident_of(const Field& f) {
  const std::string& s = f.string(128);
  if (!ident(s)) f.fail("an identifier", f.found());
  return s;
}

// An object with these fields and no others (artifact/schema/fields.py `obj`).
void fields(const Field& f, std::initializer_list<const char*> required,
            std::initializer_list<const char*> optional) {
  for (const char* k : required) (void)f[k];
  for (const auto& [k, v] : f.members(64)) {
    bool known = false;
    for (auto list : {required, optional})
      for (const char* name : list) known = known || k == name;
    if (!known) f.member(k, v).fail("no such field (a launch spec's fields only)", "field " + k);
  }
}

struct Param {
  std::string name, type;
  int64_t bytes = 0, align = 1;   // scratch
  bool pointer() const { return type[0] == '*'; }
};

Param param(const Field& p, bool scratch_ok) {
  Param out;
  out.type = p["type"].string(16);
  if (scratch_ok && out.type == "scratch") {
    fields(p, {"name", "type", "bytes", "align"}, {});
    out.bytes = p["bytes"].integer(0, int64_t(1) << 30);
    out.align = p["align"].integer(1, 4096);
    if (out.align & (out.align - 1)) p["align"].fail("a power of two", p["align"].found());
  } else {
    fields(p, {"name", "type"}, {});
    bool known = out.type == "i32" || out.type == "i64";
    for (const auto& [t, dtype] : kPointerDtypes) known = known || out.type == t;
    if (!known) p["type"].fail("a pointer (*fp32, *bf16, ...), i32 or i64", p["type"].found());
  }
  out.name = ident_of(p["name"]);
  return out;
}

struct Build {
  std::string cubin, symbol;
  int64_t shared = 0, warps = 4, ctas = 1;
  bool pdl = false;
  std::vector<Param> params;
  std::vector<std::string> sizes;   // div16: the sizes it needs divisible by 16
  std::vector<int32_t> aligned;     // div16: their positions among the user parameters
};

Build build(const Field& a, const std::string& cubin, bool div16) {
  if (div16)
    fields(a, {"cubin", "symbol", "shared", "num_warps", "params"}, {"num_ctas", "pdl", "sizes"});
  else
    fields(a, {"cubin", "symbol", "shared", "num_warps", "params"}, {"num_ctas", "pdl", "div16"});
  if (a["cubin"].string(256) != cubin) a["cubin"].fail("\"" + cubin + "\"", a["cubin"].found());
  Build b;
  b.cubin = cubin;
  b.symbol = ident_of(a["symbol"]);
  b.shared = a["shared"].integer(0, 256 * 1024);
  b.warps = a["num_warps"].integer(1, 32);
  if (b.warps & (b.warps - 1)) a["num_warps"].fail("one of 1, 2, 4, 8, 16, 32", a["num_warps"].found());
  b.ctas = a.has("num_ctas") ? a["num_ctas"].integer(1, 16) : 1;
  b.pdl = a.has("pdl") && a["pdl"].boolean();
  for (size_t i = 0, n = a["params"].size(rules::kMaxKernelBuffers); i < n; ++i) b.params.push_back(param(a["params"][i], true));
  if (div16 && a.has("sizes"))
    for (size_t i = 0, n = a["sizes"].size(64); i < n; ++i) b.sizes.push_back(ident_of(a["sizes"][i]));
  return b;
}

std::vector<std::string> names(const Field& f, size_t max) {
  std::vector<std::string> out;
  for (size_t i = 0, n = f.size(max); i < n; ++i) out.push_back(ident_of(f[i]));
  return out;
}

int arch_number(const std::string& arch) {   // "sm_90a" -> 90
  std::string digits = arch.substr(3);
  if (!digits.empty() && digits.back() == 'a') digits.pop_back();
  return std::stoi(digits);
}

bool arch_name(const std::string& s) {
  if (s.size() < 5 || s.size() > 8 || s.rfind("sm_", 0) != 0) return false;
  size_t end = s.back() == 'a' ? s.size() - 1 : s.size();
  return std::all_of(s.begin() + 3, s.begin() + long(end), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

}  // namespace

std::string select_arch(const std::vector<std::string>& built, const std::string& device) {
  int want = arch_number(device);
  for (const auto& a : built)
    if (arch_number(a) == want) return a;
  std::string best;
  for (const auto& a : built) {
    int n = arch_number(a);
    if (want < 90 && n / 10 == want / 10 && n < want && (best.empty() || n > arch_number(best))) best = a;
  }
  if (!best.empty()) return best;
  std::string list;
  for (const auto& a : built) list += (list.empty() ? "" : ", ") + a;
  std::string all;
  for (const auto& a : built) all += a + ",";
  throw TargetError("artifact kernels were built for " + list + "; this GPU is " + device,
                    "manifest target.native.archs", list, device,
                    "re-export with --target cuda:" + device + " (several archs: --target cuda:" + all + device + ")");
}

namespace {

// One kernel's launch spec, read and checked for every arch it was built for.
struct Spec {
  CudaKernels::Kernel k;
  std::set<std::string> inputs;
  std::map<std::string, std::pair<Build, std::optional<Build>>> archs;   // plain, div16
};

// The cubin's parameters take the launch spec's buffers (and flag) as pointers and its sizes.
void check_params(const Field& at, const Build& b, const CudaKernels::Kernel& k) {
  int pointers = 0, sizes = 0;
  for (const auto& p : b.params)
    if (p.type != "scratch") (p.pointer() ? pointers : sizes) += 1;
  int want = k.nbuffers + (k.error_code ? 1 : 0);
  if (pointers != want || sizes != k.nsizes)
    at.fail(std::to_string(want) + " pointers and " + std::to_string(k.nsizes) + " sizes (the launch spec's)",
            std::to_string(pointers) + " and " + std::to_string(sizes));
}

// Positions among the user parameters (scratch skipped) of the size parameters `sizes` names.
std::vector<int32_t> aligned(const Field& at, const Build& plain, const std::vector<std::string>& sizes) {
  std::vector<int32_t> out;
  for (const auto& size : sizes) {
    int32_t user = 0;
    bool found = false;
    for (const auto& p : plain.params) {
      if (p.type == "scratch") continue;
      if (p.name == size && !p.pointer()) found = true;
      if (found) break;
      ++user;
    }
    if (!found) at.fail("names of size parameters", size);
    out.push_back(user);
  }
  return out;
}

// The launch spec's extents: one size expression per buffer; a number is kept (the runner
// file's must equal it), an expression of sizes is -1 (the runner file's is checked per call).
CudaKernels::Kernel with_extents(const Field& f, CudaKernels::Kernel k) {
  if (f.size(rules::kMaxKernelBuffers) != size_t(k.nbuffers))
    f.fail(std::to_string(k.nbuffers) + " extents", std::to_string(f.size(rules::kMaxKernelBuffers)));
  k.has_extents = true;
  for (size_t i = 0; i < size_t(k.nbuffers); ++i) {
    const std::string& text = f[i].string(4096);
    bool number = !text.empty() && text.size() < 19 && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    k.extents.push_back(number ? std::stoll(text) : -1);
  }
  return k;
}

Spec parse(const Artifact& art, const std::string& name) {
  std::string rel = "kernels/" + name + ".json";
  auto bytes = art.read(rel);
  Value doc = json::parse(std::string_view(reinterpret_cast<const char*>(bytes->data), bytes->size), rel, 4u << 20);
  Field f(doc, rel, "");
  fields(f, {"name", "source", "params", "inputs", "outputs", "sizes", "constexprs", "num_warps", "grid",
             "error_code", "triton", "archs"}, {"autotune", "extents"});
  const bool extents = art.version() >= 19;   // required from then (artifact/schema/launch.py EXTENTS_SINCE)
  if (f.has("extents") != extents)
    f.fail(extents ? "an extents member (format >= 19)" : "no extents member (format < 19)",
           extents ? "none" : "one");
  if (f["name"].string(128) != name) f["name"].fail("\"" + name + "\"", f["name"].found());
  if (f["source"].string(256) != "kernels/" + name + ".py") f["source"].fail("kernels/" + name + ".py", f["source"].found());
  std::vector<Param> params;
  for (size_t i = 0, n = f["params"].size(rules::kMaxKernelBuffers); i < n; ++i) params.push_back(param(f["params"][i], false));
  Spec s;
  std::set<std::string> io;
  for (const std::string key : {"inputs", "outputs"})
    for (const auto& n : names(f[key.c_str()], rules::kMaxKernelBuffers)) {
      if (std::none_of(params.begin(), params.end(), [&](const Param& p) { return p.name == n; }))
        f[key.c_str()].fail("names of the kernel's parameters", n);
      io.insert(n);
      if (key == "inputs") s.inputs.insert(n);
    }
  s.k.nsizes = int(names(f["sizes"], 64).size());
  s.k.error_code = f["error_code"].type() == Value::Type::Null ? 0 : int32_t(f["error_code"].integer(1, 1 << 30));
  for (const auto& p : params)
    if (io.count(p.name)) {
      for (const auto& [t, dtype] : kPointerDtypes)
        if (p.type == t) s.k.types += (s.k.nbuffers ? "," : "") + std::string(dtype);
      ++s.k.nbuffers;
    }
  if (extents) s.k = with_extents(f["extents"], std::move(s.k));
  Field archs = f["archs"];
  for (const auto& [arch, v] : archs.members(16)) {
    Field a = archs.member(arch, v);
    if (!arch_name(arch)) a.fail("a GPU arch name (sm_XX)", arch);
    std::string cubin = "kernels/" + name + "." + arch;
    Build plain = build(a, cubin + ".cubin", false);
    check_params(a["params"], plain, s.k);
    std::optional<Build> div16;
    if (a.has("div16")) {
      div16 = build(a["div16"], cubin + ".div16.cubin", true);
      check_params(a["div16"]["params"], *div16, s.k);
      div16->aligned = aligned(a["div16"], plain, div16->sizes);
    }
    s.archs.emplace(arch, std::make_pair(std::move(plain), std::move(div16)));
  }
  return s;
}

// The cubins loaded into one context: each distinct (bytes, symbol, shared) once, as
// runtime/cuda.py `_function` loads them (a decoder's layers are kernels of a few shapes whose
// specs name identical cubins: codegen/shapes.py).
struct Loaded {
  std::vector<intptr_t>& modules;
  std::map<std::tuple<std::string, std::string, int64_t>, intptr_t> functions;

  intptr_t function(intptr_t context, const Bytes& image, const std::string& symbol, int64_t shared) {
    auto key = std::make_tuple(std::string(reinterpret_cast<const char*>(image.data), image.size),
                               symbol, shared);
    auto it = functions.find(key);
    if (it != functions.end()) return it->second;
    CudaFunction fn = cuda_load(context, image.data, symbol, shared);
    modules.push_back(fn.module);
    return functions.emplace(std::move(key), fn.function).first->second;
  }
};

// The launcher of `spec`'s build for `arch`, its cubins loaded into `context`.
std::shared_ptr<const Launcher> make_launcher(const Artifact& art, const std::string& name, const Spec& spec,
                                              const std::string& arch, intptr_t context, int32_t device,
                                              Loaded& cubins) {
  const auto& [plain, div16] = spec.archs.at(arch);
  CudaKernelSpec s;
  s.name = name;
  s.threads = 32 * plain.warps;
  s.shared = plain.shared;
  s.ctas = plain.ctas;
  s.pdl = plain.pdl;
  s.context = context;
  s.device = device;
  for (const auto& p : plain.params) {
    if (p.type == "scratch") {
      s.scratch.push_back({p.bytes, p.align});
      continue;
    }
    s.pointers.push_back(p.pointer());
    s.inputs.push_back(spec.inputs.count(p.name) != 0);
  }
  auto loaded = [&](const Build& b) {
    return cubins.function(context, *art.read(b.cubin), b.symbol, b.shared);
  };
  s.function = loaded(plain);
  if (div16) {
    s.aligned = div16->aligned;
    s.div16_shared = div16->shared;
    s.div16_function = loaded(*div16);
  }
  return cuda_launcher(std::move(s));
}

}  // namespace

struct CudaKernels::Parsed {
  std::map<std::string, Spec> specs;
};

void LateLauncher::launch(const std::array<int64_t, 3>& grid, c10::ArrayRef<at::Tensor> buffers,
                          const at::Tensor& flag, c10::ArrayRef<int64_t> sizes) const {
  if (!real) throw std::logic_error("a kernel launched before its cubin was loaded");
  real->launch(grid, buffers, flag, sizes);
}

CudaKernels::CudaKernels(const Artifact& art, const Field& native) : parsed_(std::make_unique<Parsed>()) {
  fields(native, {"kind", "triton", "archs", "kernels"}, {"autotune"});
  if (native["kind"].string(16) != "triton") native["kind"].fail("\"triton\"", native["kind"].found());
  for (size_t i = 0, n = native["archs"].size(16); i < n; ++i) {
    built_.push_back(native["archs"][i].string(16));
    if (!arch_name(built_.back())) native["archs"][i].fail("a GPU arch name (sm_XX)", built_.back());
  }
  if (built_.empty()) native["archs"].fail("at least one arch", "none");
  for (const auto& name : names(native["kernels"], 1 << 16)) {
    Spec spec = parse(art, name);
    kernels_[name] = spec.k;
    parsed_->specs.emplace(name, std::move(spec));
  }
}

void CudaKernels::load(const Artifact& art, int32_t device) {
  arch_ = select_arch(built_, cuda_arch(device));
  context_ = cuda_context(device);
  for (auto& [name, spec] : parsed_->specs)
    if (!spec.archs.count(arch_))
      throw TargetError("kernel " + name + " has no cubin for " + arch_, art.where("kernels/" + name + ".json"),
                        arch_, "archs without it", "re-export the model for this GPU");
  Loaded loaded{modules_, {}};
  for (auto& [name, spec] : parsed_->specs)
    kernels_[name].launcher->real = make_launcher(art, name, spec, arch_, context_, device, loaded);
  parsed_.reset();
}

CudaKernels::~CudaKernels() {
  for (intptr_t m : modules_) cuda_unload(context_, m);
}

void CudaKernels::bind(spec::Step& s, int nargs, int nsizes, const std::string& types,
                       const std::string& where) const {
  auto it = kernels_.find(s.name);
  if (it == kernels_.end())
    throw ArtifactError("the plan launches kernel " + s.name + ", which the artifact lacks", where,
                        "a kernel of manifest target.native.kernels", s.name, "re-export the model");
  const Kernel& k = it->second;
  if (s.grid.empty())
    throw ArtifactError("kernel step " + s.name + " has no launch", where, "[grid, error code] after its sizes",
                        "a step of 7 items", "re-export the model with this aotc (format >= 14)");
  if (k.nbuffers != nargs || k.nsizes != nsizes || k.types != types || k.error_code != s.error_code)
    throw ArtifactError("the plan launches kernel " + s.name + " with arguments its launch spec does not declare",
                        where, std::to_string(k.nbuffers) + " buffers (" + k.types + "), " + std::to_string(k.nsizes) +
                        " sizes, error code " + std::to_string(k.error_code),
                        std::to_string(nargs) + " buffers (" + types + "), " + std::to_string(nsizes) +
                        " sizes, error code " + std::to_string(s.error_code),
                        "re-export the model (plan and kernels do not match)");
  if (k.has_extents && s.extents.size() != size_t(nargs))
    throw ArtifactError("the plan launches kernel " + s.name + " without the extents its launch spec gives", where,
                        std::to_string(nargs) + " extents after its error code", std::to_string(s.extents.size()),
                        "re-export the model with this aotc");
  for (size_t i = 0; i < k.extents.size() && i < s.extents.size(); ++i)
    if (k.extents[i] >= 0 && (s.extents[i].expr >= 0 || s.extents[i].value != k.extents[i]))
      throw ArtifactError("the plan's extents of kernel " + s.name + " are not its launch spec's", where,
                          std::to_string(k.extents[i]) + " elements past pointer " + std::to_string(i),
                          "another extent", "re-export the model (plan and kernels do not match)");
  s.launcher = k.launcher;
}

}  // namespace aotc::fe
