// aotc::Module (include/aotc/module.h): loading an artifact in C++ and calling its entries.
#include "aotc/module.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "../expr.h"
#include "../instr.h"
#include "guard_errors.h"
#include "cuda_kernels.h"
#include "graphs.h"
#include "native.h"
#include "signing.h"
#include "plan_check.h"
#include "spec.h"
#include "templates.h"

namespace aotc {

namespace {

const char* kReexport = "re-export the model with this aotc (format >= 10), or load it from Python (aotc.load)";

struct Entry {
  fe::EntrySpec spec;   // its guards and texts, for errors
  std::unique_ptr<Program> program;
  std::unique_ptr<Guards> guards;
  std::unique_ptr<fe::GraphedEntry> graph;   // on a GPU, unless CUDA graphs are off
};

// The artifact's device type ("cpu", "cuda"), or a TargetError for what C++ does not run.
std::string target_device(const fe::Artifact& art) {
  json::Field target = art.field()["target"];
  const std::string& device = target["device"].string(16);
  if (device != "cpu" && device != "cuda")
    target["device"].fail("cpu or cuda", device);
  if (device == "cuda" && art.version() < fe::kCudaRunnerFormat)
    throw TargetError("the C++ front end runs CUDA artifacts of format " +
                      std::to_string(fe::kCudaRunnerFormat) + " and newer; this one is format " +
                      std::to_string(art.version()), "manifest format_version",
                      std::to_string(fe::kCudaRunnerFormat), std::to_string(art.version()),
                      "re-export the model with this aotc, or load it from Python (aotc.load)");
  if (art.field().has("tensor_parallel") && art.field()["tensor_parallel"].type() != json::Value::Type::Null)
    throw TargetError("the C++ front end does not run tensor-parallel artifacts", "manifest tensor_parallel",
                      "an artifact of one rank", "a tensor-parallel artifact",
                      "load it from Python under torchrun (aotc.load)");
  return device;
}

// The device to run on: LoadOptions.device, of the artifact's device type ("" for its own).
c10::Device run_device(const std::string& wanted, const std::string& type) {
  std::string name = wanted.empty() ? type : wanted;
  std::optional<c10::Device> dev;
  try {
    dev = c10::Device(name);
  } catch (const c10::Error&) {
  }
  if (!dev || c10::DeviceTypeName(dev->type(), true) != type)
    throw UsageError("the artifact runs on " + type + ", not on " + name, "LoadOptions.device",
                     type + (type == "cuda" ? " or cuda:N" : ""), name,
                     "leave LoadOptions.device empty, or name a " + type + " device");
  if (dev->is_cuda() && !dev->has_index()) dev = c10::Device(c10::kCUDA, 0);
  return *dev;
}

// The CPU target's (level, library) pairs (none: extern-only), or a TargetError; checked as
// artifact/schema/manifest.py checks them: known levels (rules.h) of one architecture, each in
// its own file (kernels/kernels-<level>.so, or the one kernels/kernels.so of format <= 7),
// and no library in the file table that no level names.
std::vector<std::pair<std::string, std::string>> cpu_levels(const fe::Artifact& art, json::Field native,
                                                            bool& table) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!native.has("libraries"))
    throw TargetError("the C++ front end runs C++ kernels on the CPU; this artifact's are not", native.where(),
                      "C++ kernel libraries", "another kind of kernels", "load it from Python (aotc.load)");
  table = native.has("table") && native["table"].boolean();
  json::Field libs = native["libraries"];
  std::set<std::string> arches, named;
  for (const auto& [level, v] : libs.members(std::size(fe::rules::kLevels))) {
    json::Field path = libs.member(level, v);
    const fe::rules::Level* known = nullptr;
    for (const auto& l : fe::rules::kLevels)
      if (level == l.name) known = &l;
    if (!known) path.fail("a known CPU level", "names the level " + json::dump(level, 40));
    bool legacy = libs.value().members.size() == 1 && path.string(256) == "kernels/kernels.so";
    if (!legacy && path.string(256) != "kernels/kernels-" + level + ".so")
      path.fail(json::dump("kernels/kernels-" + level + ".so"), path.found());
    arches.insert(known->arch);
    named.insert(path.string(256));
    out.emplace_back(level, path.string(256));
  }
  if (out.empty()) libs.fail("at least one level", "none");
  if (arches.size() != 1) libs.fail("levels of one architecture", "mixes x86-64 and aarch64");
  static const std::regex kLibrary(R"(kernels/kernels(-[a-z0-9-]+)?\.so)");
  for (const auto& [rel, v] : art.field()["files"].members(1 << 20))
    if (std::regex_match(rel, kLibrary) && !named.count(rel))
      art.field()["files"].member(rel, v).fail(rel + " named in target.native.libraries",
                                               "lists " + rel + ", a library of no level");
  return out;
}

at::Tensor bound_weight(const fe::ConstantRef& w, const at::Tensor& stored, const std::string& where) {
  std::vector<int64_t> shape(stored.sizes().begin(), stored.sizes().end());
  bool fits = stored.scalar_type() == w.dtype && shape.size() == w.shape.size();
  for (size_t d = 0; fits && d < shape.size(); ++d) fits = w.shape[d] < 0 || w.shape[d] == shape[d];
  if (!fits)
    throw ArtifactError("weight '" + w.name + "' does not match its runner file", where,
                        dtype_name(w.dtype) + c10::str(c10::IntArrayRef(w.shape)),
                        dtype_name(stored.scalar_type()) + c10::str(stored.sizes()),
                        "re-export the model (the weights file does not match the plan)");
  if (w.transform == "transpose" && stored.dim() == 2) return stored.t();
  if (w.transform == "channels_last" && stored.dim() == 4)
    return stored.contiguous(at::MemoryFormat::ChannelsLast);
  return stored;
}

}  // namespace

struct Module::Impl {
  std::unique_ptr<fe::Artifact> art;
  std::unique_ptr<fe::Kernels> lib;
  std::map<std::string, Entry> entries;
  std::map<std::string, std::map<std::string, fe::StoredTensor>> headers;   // per shard
  std::map<std::string, std::shared_ptr<const fe::Bytes>> shards;
  std::map<std::string, at::Tensor> state;
  std::map<std::string, at::Tensor> on_device;   // weights copied to a GPU, once per name
  c10::Device device = c10::Device(c10::kCPU);
  std::string level;
  std::string signer;   // the trusted key that signed it ("": none was asked for)
  LoadOptions options;

  at::Tensor weight(const std::string& name);   // on the module's device
  at::Tensor state_tensor(const fe::ConstantRef& s, const std::string& where);
  void check_state(const fe::ConstantRef& s, const std::string& where) const;
  void check_states_used() const;   // every state of the manifest is one a plan uses
  std::vector<at::Tensor> call(const Entry& e, const std::vector<at::Tensor>& inputs) const;   // run
  void read_entry(const std::string& name);    // its runner file, checked
  void build_entry(Entry& e, const std::string& name);   // its constants bound, its program
  void setup_graphs();   // LoadOptions.cuda_graph: the entries that replay CUDA graphs
};

at::Tensor Module::Impl::weight(const std::string& name) {
  json::Field index = art->field()["weights"];
  std::string shard;
  if (index.has("map") && index["map"].type() != json::Value::Type::Null) {   // name -> shard
    json::Field map = index["map"];
    if (!map.has(name.c_str()))
      map.fail("an entry for weight '" + name + "' (the runner file binds it)", "none");
    shard = map[name.c_str()].string(256);
  } else {   // one shard needs no index
    if (index["shards"].size(1 << 16) != 1) index.fail("a map (several shards)", "no map");
    shard = index["shards"][0].string(256);
  }
  if (!shards.count(shard)) {
    shards[shard] = art->read(shard, true);
    headers[shard] = fe::safetensors_header(*shards[shard], art->where(shard));
  }
  auto it = headers[shard].find(name);
  if (it == headers[shard].end())
    throw ArtifactError("weight '" + name + "' is not in " + shard, art->where(shard), name, "no such tensor",
                        "re-export the model (the weights file does not match the plan)");
  at::Tensor stored = fe::stored_tensor(shards[shard], it->second);
  if (device.is_cpu()) return stored;
  return on_device.emplace(name, stored.to(device)).first->second;
}

// A state tensor (zeros), allocated only once its runner file's dtype and shape are the
// manifest's state of that name and the manifest's state is within rules::kMaxStateBytes.
at::Tensor Module::Impl::state_tensor(const fe::ConstantRef& s, const std::string& where) {
  auto it = state.find(s.name);
  if (it == state.end()) {
    check_state(s, where);
    return state[s.name] = at::zeros(s.shape, at::TensorOptions().dtype(s.dtype).device(device));
  }
  if (it->second.scalar_type() != s.dtype || it->second.sizes() != c10::IntArrayRef(s.shape))
    throw ArtifactError("state '" + s.name + "' is declared twice, differently", where,
                        "one dtype and shape per state", "two", "re-export the model");
  return it->second;
}

void Module::Impl::check_state(const fe::ConstantRef& s, const std::string& where) const {
  json::Field root = art->field();
  if (!root.has("state"))
    throw ArtifactError("state '" + s.name + "' is not the manifest's", where, "a state the manifest lists",
                        "a manifest with no state", "re-export the model");
  json::Field list = root["state"];
  uint64_t total = 0;
  std::optional<json::Field> match;
  for (size_t i = 0, n = list.size(1 << 16); i < n; ++i) {
    json::Field st = list[i];
    uint64_t bytes = uint64_t(c10::elementSize(fe::dtype_of(st["dtype"].string(32), st["dtype"])));
    for (size_t d = 0, m = st["shape"].size(16); d < m; ++d) {
      uint64_t dim = uint64_t(st["shape"][d].integer(0, fe::rules::kMaxDim));
      bytes = dim && bytes > fe::rules::kMaxStateBytes / dim ? fe::rules::kMaxStateBytes + 1 : bytes * dim;
    }
    total += std::min(bytes, fe::rules::kMaxStateBytes + 1);
    if (total > fe::rules::kMaxStateBytes)
      st.fail("state of at most " + std::to_string(fe::rules::kMaxStateBytes) + " bytes in all", "more");
    if (st["name"].string(1024) == s.name) match = st;
  }
  if (!match)
    throw ArtifactError("state '" + s.name + "' is not the manifest's", where, "a state the manifest lists",
                        s.name, "re-export the model");
  std::vector<int64_t> shape;
  json::Field dims = (*match)["shape"];
  for (size_t d = 0, m = dims.size(16); d < m; ++d) shape.push_back(dims[d].integer(0, fe::rules::kMaxDim));
  at::ScalarType dtype = fe::dtype_of((*match)["dtype"].string(32), (*match)["dtype"]);
  if (dtype != s.dtype || shape != s.shape)
    throw ArtifactError("state '" + s.name + "' in " + where + " is not the manifest's", where,
                        dtype_name(dtype) + c10::str(c10::IntArrayRef(shape)),
                        dtype_name(s.dtype) + c10::str(c10::IntArrayRef(s.shape)), "re-export the model");
}

// As runtime/module.py allocate_state: a state no plan uses is refused (so that nothing is
// sized from the manifest that the plans do not bound).
void Module::Impl::check_states_used() const {
  json::Field root = art->field();
  if (!root.has("state")) return;
  std::set<std::string> used;
  for (const auto& [name, e] : entries)
    for (const auto& s : e.spec.state) used.insert(s.name);
  json::Field list = root["state"];
  for (size_t i = 0, n = list.size(1 << 16); i < n; ++i)
    if (!used.count(list[i]["name"].string(1024)))
      throw ArtifactError("state '" + list[i]["name"].string(1024) + "' is used by no plan", "manifest.json, state",
                          "only states that the plans' slots use", list[i]["name"].string(1024), "re-export the model");
}

void Module::Impl::read_entry(const std::string& name) {
  json::Value plan = fe::check_entry_and_plan(*art, name, art->field()["entries"][name.c_str()]);
  std::string rel = "runner/" + name + ".json";
  if (!art->listed(rel))
    throw ArtifactError("entry " + name + " has no runner file, which the C++ front end runs",
                        art->where(rel), "a listed " + rel + " (aotc >= 0.1.0, format 10)",
                        "none (format " + std::to_string(art->version()) + ")", kReexport);
  auto bytes = art->read(rel);
  json::Value doc = json::parse(std::string_view(reinterpret_cast<const char*>(bytes->data), bytes->size),
                                rel, 64u << 20);
  Entry e;
  e.spec = fe::read_runner_file(doc, rel, name, lib.get(), c10::DeviceTypeName(device.type(), true));
  // its own checks first (every index, tag, op and kernel), then: what its plan says
  fe::check_runner_matches(plan, doc, rel, art->field()["weights"]["aliases"].value());
  e.spec.program.device = device;
  entries.emplace(name, std::move(e));
}

void Module::Impl::build_entry(Entry& e, const std::string& name) {
  std::string rel = "runner/" + name + ".json";
  for (const auto& w : e.spec.weights)
    e.spec.program.constants.emplace_back(w.slot, bound_weight(w, weight(w.name), rel + ", weight " + w.name));
  for (const auto& s : e.spec.state) {   // a generator's cache: updated by every call
    e.spec.program.constants.emplace_back(s.slot, state_tensor(s, rel));
    e.spec.program.varying.push_back(s.slot);
  }
  try {
    e.program = std::make_unique<Program>(e.spec.program);
    e.guards = std::make_unique<Guards>(e.spec.guards);
  } catch (const SpecError& err) {
    throw ArtifactError("the C++ runner refuses plan " + name + ": " + err.what(), rel,
                        "a plan it runs", std::string(err.what()).substr(0, 300), "re-export the model");
  } catch (const Unsupported& err) {
    throw TargetError("the C++ runner does not run plan " + name + ": " + err.what(), rel,
                      "a plan it runs", err.what(), "load it from Python (aotc.load)");
  } catch (const c10::Error& err) {
    throw ArtifactError("the C++ runner refuses plan " + name, rel, "a plan it runs",
                        std::string(err.what_without_backtrace()).substr(0, 300), "re-export the model");
  }
  e.spec.program.constants.clear();
}

// As aotc.load(cuda_graph=): on a GPU, each entry replays CUDA graphs where it can (Auto), none
// does (Off), or graphs must be possible here (On: a UsageError off a GPU, a TargetError where
// this runtime was built without them). An entry with value-dependent sizes never captures.
void Module::Impl::setup_graphs() {
  using G = LoadOptions::Graphs;
  if (options.cuda_graph == G::Off) return;
  if (!device.is_cuda()) {
    if (options.cuda_graph == G::On)
      throw UsageError("CUDA graphs need a CUDA device", "LoadOptions.cuda_graph", "a CUDA artifact",
                       c10::DeviceTypeName(device.type(), true), "leave cuda_graph at Auto");
    return;
  }
  if (options.cuda_graph == G::On && !fe::graphs_unavailable().empty())
    throw TargetError(fe::graphs_unavailable(), "LoadOptions.cuda_graph", "a runtime built with CUDA graphs",
                      "one without", "reinstall aotc where torch has CUDA and CUDA's headers are found, "
                      "or leave cuda_graph at Auto");
  std::vector<at::Tensor> held;
  for (const auto& [name, t] : state) held.push_back(t);
  for (auto& [name, e] : entries) {
    std::string bound;
    for (const auto& s : e.spec.program.steps)
      for (const auto& b : s.binds)
        bound += (bound.empty() ? "" : ", ") + e.spec.symbols.at(size_t(b.symbol));
    std::string off = bound.empty() ? "" : "its sizes " + bound + " depend on tensor values (read from "
                                                "results, which a CUDA graph cannot replay)";
    e.graph = std::make_unique<fe::GraphedEntry>(device, !e.spec.guards.ranges.empty(), off, held,
                                                 options.cuda_graph_cache);
  }
}

Module::Module(const std::string& path, const LoadOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->art = std::make_unique<fe::Artifact>(path, options.verify_hashes);
  impl_->signer = fe::check_signature(*impl_->art, options.trusted_keys);   // before any other file
  if (!impl_->signer.empty() && !options.verify_hashes)
    throw UsageError("a required signature means nothing without the hash checks",
                     "LoadOptions.verify_hashes", "true", "false",
                     "leave verify_hashes on with trusted keys");
  impl_->art->check_listed();   // after the signature, as Python checks the files
  const fe::Artifact& art = *impl_->art;
  if (art.version() < fe::kRunnerFormat)
    throw ArtifactError("artifact format " + std::to_string(art.version()) + " has no runner files, "
                        "which the C++ front end runs", art.where("manifest.json"),
                        "format version " + std::to_string(fe::kRunnerFormat) + " or newer",
                        std::to_string(art.version()), kReexport);
  fe::check_manifest(art);   // as Python's schema reads it
  std::string type = target_device(art);
  impl_->device = run_device(options.device, type);
  json::Field native = art.field()["target"]["native"];
  if (native.type() != json::Value::Type::Null && type == "cpu") {
    bool table = false;
    auto levels = cpu_levels(art, native, table);
    auto lib = std::make_unique<fe::KernelLibrary>(art, levels, options.isa, table);
    impl_->level = lib->level();
    impl_->lib = std::move(lib);
  } else if (native.type() != json::Value::Type::Null) {
    impl_->lib = std::make_unique<fe::CudaKernels>(art, native);
  }
  json::Field entries = art.field()["entries"];
  for (const auto& [name, v] : entries.members(64)) impl_->read_entry(name);
  impl_->check_states_used();
  if (auto* cuda = dynamic_cast<fe::CudaKernels*>(impl_->lib.get())) {   // the GPU, at last
    cuda->load(art, impl_->device.index());
    impl_->level = cuda->arch();
  } else if (impl_->device.is_cuda()) {   // extern-only: the driver and device exist
    cuda_arch(impl_->device.index());
  }
  for (auto& [name, e] : impl_->entries) impl_->build_entry(e, name);
  impl_->setup_graphs();
  impl_->art->verify_unread();   // the files no entry read, as Python checks every file
}

Module::~Module() = default;
Module::Module(Module&&) noexcept = default;
Module& Module::operator=(Module&&) noexcept = default;

std::vector<at::Tensor> Module::forward(const std::vector<at::Tensor>& inputs) const {
  return run("forward", inputs);
}

namespace {

// Throws the GuardError of a failed run: a value-dependent size out of its range (binds.cpp),
// or an index out of range that a kernel flagged.
void raise_failure(const Entry& e, const RunResult& r) {
  if (r.failed_step >= 0 && r.failed_symbol >= 0) {
    const std::string& name = e.spec.symbols.at(size_t(r.failed_symbol));
    std::string op, range;
    for (const auto& s : e.spec.program.steps)
      for (const auto& b : s.binds)
        if (s.index == r.failed_step && b.symbol == r.failed_symbol)
          op = s.op + "." + s.overload,
          range = std::to_string(b.lo) + " <= " + name + " <= " + std::to_string(b.hi);
    std::string where = "the result of " + op + " (plan step " + std::to_string(r.failed_step) + ")";
    throw GuardError(where + " has " + name + "=" + std::to_string(r.failed_value) +
                         ", outside the range export proved for it", where, range,
                     std::to_string(r.failed_value),
                     "these inputs' values select more than the model's code allows at export; "
                     "check the inputs, or re-export the model");
  }
  if (r.failed_step >= 0) {
    std::string kernel;
    for (const auto& s : e.spec.program.steps)
      if (s.index == r.failed_step) kernel = s.name;
    throw GuardError("an index is out of range (kernel " + kernel + ", plan step " +
                     std::to_string(r.failed_step) + ")", "kernel " + kernel,
                     "indices within the indexed dim", "an index out of range",
                     "check the values of integer index inputs (e.g. token ids below the vocabulary size)");
  }
}

}  // namespace

std::vector<at::Tensor> Module::run(const std::string& entry, const std::vector<at::Tensor>& inputs) const {
  auto it = impl_->entries.find(entry);
  if (it == impl_->entries.end())
    throw UsageError("the artifact has no entry " + entry, "Module::run", "an entry of the manifest",
                     entry, "call one of Module::entries()");
  try {
    return impl_->call(it->second, inputs);
  } catch (const AotcError&) {
    throw;
  } catch (const c10::OutOfMemoryError&) {   // memory and device failures as they are
    throw;
  } catch (const std::exception& err) {   // a plan that fits its guards runs: the artifact is bad
    std::string what = err.what(), first = what.substr(0, what.find('\n')).substr(0, 300);
    if (what.rfind("CUDA error", 0) == 0) throw;
    fe::raise<ArtifactError>(fe::rules::kPlanFailed, {{"entry", entry}, {"file", "runner/" + entry + ".json"},
                                                      {"found", first}});
  }
}

std::vector<at::Tensor> Module::Impl::call(const Entry& e, const std::vector<at::Tensor>& inputs) const {
  std::vector<int64_t> syms;
  bool check = options.check_guards;
  bool defined = std::all_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined(); });
  if (!defined || !e.guards->bind(inputs, check, syms))
    syms = fe::check_inputs(e.spec.guards, e.spec.texts, inputs);
  at::NoGradGuard no_grad;
  auto plain = [&](const std::vector<at::Tensor>& in, bool read_flag) {
    return e.program->run(std::vector<c10::IValue>(in.begin(), in.end()), syms, read_flag);
  };
  RunResult r = e.graph ? e.graph->call(inputs, {plain, [&](int32_t code) { return e.program->failed_step(code); }})
                        : plain(inputs, true);
  raise_failure(e, r);
  std::vector<at::Tensor> out;
  for (auto& v : r.outputs)
    out.push_back(v.isTensor() ? v.toTensor() : v.isNone() ? at::Tensor() : at::scalar_tensor(v.toScalar()));
  return out;
}

std::map<std::string, std::string> Module::graph_status() const {
  std::map<std::string, std::string> out;
  for (const auto& [name, e] : impl_->entries) out[name] = e.graph ? e.graph->status() : "off";
  return out;
}

std::vector<at::Tensor> Module::example_inputs(const std::string& entry) const {
  auto it = impl_->entries.find(entry);
  if (it == impl_->entries.end())
    throw UsageError("the artifact has no entry " + entry, "Module::example_inputs",
                     "an entry of the manifest", entry, "call one of Module::entries()");
  const spec::Guards& g = it->second.spec.guards;
  std::vector<int64_t> syms;
  for (const auto& [lo, hi] : g.ranges) syms.push_back(std::min(std::max<int64_t>(lo, 1), hi));
  std::vector<at::Tensor> out;
  for (const auto& in : g.inputs) {
    std::vector<int64_t> shape;
    for (const auto& d : in.dims)
      shape.push_back(d.kind == spec::GuardDim::Kind::Static ? d.value
                      : d.kind == spec::GuardDim::Kind::Symbol ? syms[d.value]
                                                               : expr::eval(g.exprs[d.value], syms.data()));
    auto options = at::TensorOptions().dtype(dtype_named(in.dtype, "guards")).device(impl_->device);
    out.push_back(at::isFloatingType(options.dtype().toScalarType()) ? at::randn(shape, options)
                                                                     : at::zeros(shape, options));
  }
  return out;
}

std::vector<std::string> Module::entries() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : impl_->entries) out.push_back(name);
  return out;
}

const std::string& Module::level() const { return impl_->level; }
c10::Device Module::device() const { return impl_->device; }
const std::string& Module::signer() const { return impl_->signer; }
int Module::format_version() const { return impl_->art->version(); }

}  // namespace aotc
