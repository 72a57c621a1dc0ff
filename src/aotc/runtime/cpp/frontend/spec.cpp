// Runner files -> the plan runner's spec (spec.h).
#include "spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string_view>
#include <unordered_set>

#include "native.h"
#include "rules.h"

// artifact/schema/extern_ops.txt, built in (setup.py passes its path)
asm(".section .rodata\n.global aotc_extern_ops_table\naotc_extern_ops_table:\n.incbin \"" AOTC_EXTERN_OPS
    "\"\n.byte 0\n.previous\n");
extern "C" const char aotc_extern_ops_table[];

namespace aotc::fe {

namespace {

using json::Field;
using json::Value;
using K = spec::Arg::Kind;
constexpr int64_t kMaxSlots = 1 << 20;

int32_t index(const Field& f, int64_t lo = 0, int64_t hi = kMaxSlots) {
  return static_cast<int32_t>(f.integer(lo, hi));
}

std::vector<int32_t> indices(const Field& f, int64_t lo = 0, int64_t hi = kMaxSlots) {
  std::vector<int32_t> out;
  for (size_t i = 0, n = f.size(1 << 16); i < n; ++i) out.push_back(index(f[i], lo, hi));
  return out;
}

std::vector<spec::Dim> dims(const Field& f) {
  std::vector<spec::Dim> out;
  for (size_t i = 0, n = f.size(64); i < n; ++i) {
    spec::Dim d;
    if (f[i].type() == Value::Type::Array) {
      if (f[i].size(1) != 1) f[i].fail("[expression index]", "another length");
      d.expr = index(f[i][0]);
    } else {
      d.value = f[i].integer(0, std::numeric_limits<int64_t>::max());
    }
    out.push_back(d);
  }
  return out;
}

double float_arg(const Field& f) {
  if (f.type() != Value::Type::String) return f.number();
  const std::string& s = f.string(8);
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  f.fail("a number, or \"inf\", \"-inf\", \"nan\"", f.found());
}

spec::Arg arg(const Field& f) {
  static const std::pair<const char*, K> kTags[] = {
      {"n", K::None}, {"b", K::Bool}, {"i", K::Int}, {"f", K::Float}, {"s", K::String},
      {"slot", K::Slot}, {"sym", K::Sym}, {"list", K::List}, {"dtype", K::DType},
      {"layout", K::Layout}, {"memory_format", K::MemoryFormat}, {"device", K::Device}};
  size_t n = f.size(2);
  const std::string& tag = f[0].string(16);
  spec::Arg a;
  bool known = false;
  for (const auto& [name, kind] : kTags)
    if (tag == name) a.kind = kind, known = true;
  if (!known) f[0].fail("an argument tag (n, b, i, f, s, slot, sym, list, dtype, ...)", f[0].found());
  bool bare = a.kind == K::None || a.kind == K::Device;
  if (n != (bare ? 1u : 2u)) f.fail(bare ? "[tag]" : "[tag, value]", std::to_string(n) + " items");
  switch (a.kind) {
    case K::Bool: a.b = f[1].boolean(); break;
    case K::Int: a.i = f[1].integer(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()); break;
    case K::Slot: case K::Sym: a.i = index(f[1]); break;
    case K::Float: a.f = float_arg(f[1]); break;
    case K::String: case K::DType: case K::Layout: case K::MemoryFormat: a.s = f[1].string(256); break;
    case K::List:
      for (size_t i = 0, m = f[1].size(1 << 16); i < m; ++i) a.items.push_back(arg(f[1][i]));
      break;
    default: break;
  }
  return a;
}

c10::IValue constant(const Field& f) {
  spec::Arg a = arg(f);
  switch (a.kind) {
    case K::None: return {};
    case K::Bool: return a.b;
    case K::Int: return a.i;
    case K::Float: return a.f;
    case K::String: return a.s;
    default: f.fail("a constant output (n, b, i, f or s)", f[0].found());
  }
}

spec::Step kernel_step(const Field& f, const Kernels* lib) {
  size_t n = f.size(8);
  if (n != 7 && n != 8)
    f.fail("[kernel, index, name, signature, args, outs, sizes] (and [grid, error code] for a "
           "CUDA artifact's kernel)", "another length");
  spec::Step s;
  s.kind = spec::Step::Kind::Kernel;
  s.name = f[2].string(128);
  Field sig = f[3];
  if (sig.size(3) != 3) sig.fail("[pointers, sizes, dtypes]", "another length");
  if (!lib) f.fail("no kernel step (the artifact has no kernel library)", "kernel " + s.name);
  if (n == 8) {   // a Triton kernel's launch (format >= 14; its extents from 19)
    size_t items = f[7].size(3);
    if (items != 2 && items != 3) f[7].fail("[grid, error code] or [grid, error code, extents]", "another length");
    s.grid = dims(f[7][0]);
    if (s.grid.size() != 3) f[7][0].fail("three grid dims", std::to_string(s.grid.size()));
    s.error_code = index(f[7][1], 0, 1 << 30);
    if (items == 3) s.extents = dims(f[7][2]);
  }
  lib->bind(s, index(sig[0], 0, 1 << 16), index(sig[1], 0, 1 << 16), sig[2].string(1 << 16),
            f.where());
  for (size_t i = 0, n = f[4].size(4096); i < n; ++i) {
    Field a = f[4][i];
    if (a.size(6) != 6)   // formats 10-12 wrote four, without what a read must find
      a.fail("[slot, lay out, contiguous, strides, shape, dtype] (runner files of format 13 and "
             "newer; re-export the model, or load it from Python)", "another length");
    std::string dtype = a[5].string(32);
    if (!dtype.empty()) dtype_of(dtype, a[5]);
    s.args.push_back({index(a[0]), a[1].boolean(), a[2].boolean(), dims(a[3]), dims(a[4]), dtype});
  }
  for (size_t i = 0, n = f[5].size(4096); i < n; ++i) {
    Field o = f[5][i];
    if (o.size(7) != 7) o.fail("[slot, dtype, shape, strides, contiguous, donor, view]", "another length");
    dtype_of(o[1].string(32), o[1]);
    s.outs.push_back({index(o[0]), o[1].string(32), dims(o[2]), dims(o[3]), o[4].boolean(),
                      index(o[5], -1), o[6].boolean()});
  }
  s.sizes = indices(f[6], 0, 256);
  return s;
}

spec::Step call_step(const Field& f) {
  size_t n = f.size(10);
  if (n != 9 && n != 10)
    f.fail("[call, index, op, overload, args, kwargs, out, single, fold(, binds)]", "another length");
  spec::Step s;
  s.kind = spec::Step::Kind::Call;
  s.op = f[2].string(128);
  s.overload = f[3].string(128);
  if (!allowed_op(s.op + "." + s.overload))
    f[2].fail("an op of aotc's fixed table (artifact/schema/extern_ops.txt)", s.op + "." + s.overload);
  for (size_t i = 0, n = f[4].size(256); i < n; ++i) s.call_args.push_back(arg(f[4][i]));
  for (size_t i = 0, n = f[5].size(256); i < n; ++i) {
    if (f[5][i].size(2) != 2) f[5][i].fail("[name, argument]", "another length");
    s.kwargs.emplace_back(f[5][i][0].string(128), arg(f[5][i][1]));
  }
  s.out = indices(f[6], -1);
  s.single = f[7].boolean();
  s.fold = f[8].boolean();
  if (n == 10)   // format 16: value-dependent sizes (the runner checks them against the plan)
    for (size_t i = 0, m = f[9].size(16); i < m; ++i) {
      const Field b = f[9][i];
      if (b.size(5) != 5) b.fail("[symbol, result, dim or -1, lo, hi]", "another length");
      s.binds.push_back({index(b[0], 0, 256), index(b[1], 0, 64), index(b[2], -1, 63),
                         b[3].integer(0, int64_t(1) << 62), b[4].integer(0, int64_t(1) << 62)});
    }
  return s;
}

spec::Step step(const Field& f, const Kernels* lib) {
  const std::string& kind = f[0].string(16);
  spec::Step s;
  if (kind == "kernel") {
    s = kernel_step(f, lib);
  } else if (kind == "call") {
    s = call_step(f);
  } else if (kind == "free") {
    if (f.size(3) != 3) f.fail("[free, index, slots]", "another length");
    s.kind = spec::Step::Kind::Free;
    s.slots = indices(f[2]);
  } else {
    f[0].fail("a step kind (kernel, call, free)", f[0].found());
  }
  s.index = index(f[1]);
  return s;
}

std::vector<ConstantRef> constants(const Field& f, bool weights) {
  std::vector<ConstantRef> out;
  for (size_t i = 0, n = f.size(kMaxSlots); i < n; ++i) {
    Field c = f[i];
    if (c.size(5) != (weights ? 5u : 4u)) c.fail(weights ? "[slot, name, dtype, shape, transform]"
                                                         : "[slot, name, dtype, shape]", "another length");
    ConstantRef r;
    r.slot = index(c[0]);
    r.name = c[1].string(1024);
    r.dtype = dtype_of(c[2].string(32), c[2]);
    // a weight's dim may be -1 (not checked: the stored tensor's); a state's is allocated
    for (size_t d = 0, m = c[3].size(16); d < m; ++d)
      r.shape.push_back(c[3][d].integer(weights ? -1 : 0, weights ? int64_t(1) << 48 : rules::kMaxDim));
    if (weights) {
      r.transform = c[4].string(16);
      if (r.transform != "" && r.transform != "transpose" && r.transform != "channels_last")
        c[4].fail("\"\", \"transpose\" or \"channels_last\"", c[4].found());
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> strings(const Field& f, size_t n) {
  if (f.size(1 << 16) != n) f.fail(std::to_string(n) + " items", std::to_string(f.size(1 << 16)));
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back(f[i].string(4096));
  return out;
}

std::vector<std::vector<int64_t>> exprs(const Field& f) {
  std::vector<std::vector<int64_t>> out(f.size(1 << 16));
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t k = 0, n = f[i].size(4096); k < n; ++k)
      out[i].push_back(f[i][k].integer(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  return out;
}

void guards(const Field& f, EntrySpec& e) {
  spec::Guards& g = e.guards;
  g.symbols = index(f["symbols"], 0, 256);
  for (size_t i = 0, n = f["ranges"].size(256); i < n; ++i) {
    Field r = f["ranges"][i];
    if (r.size(2) != 2) r.fail("[min, max]", "another length");
    g.ranges.emplace_back(r[0].integer(INT64_MIN, INT64_MAX), r[1].integer(INT64_MIN, INT64_MAX));
  }
  g.exprs = exprs(f["exprs"]);
  g.relations = indices(f["relations"]);
  g.plan_symbols = indices(f["plan_symbols"], 0, 256);
  if (f["device"].string(16) != g.device) f["device"].fail("\"" + g.device + "\"", f["device"].found());
  for (size_t i = 0, n = f["inputs"].size(4096); i < n; ++i) {
    Field in = f["inputs"][i];
    if (in.size(2) != 2) in.fail("[dtype, dims]", "another length");
    spec::GuardInput gi;
    gi.dtype = in[0].string(32);
    dtype_of(gi.dtype, in[0]);
    for (size_t d = 0, m = in[1].size(64); d < m; ++d) {
      Field dim = in[1][d];
      if (dim.size(2) != 2) dim.fail("[kind, value]", "another length");
      gi.dims.push_back({static_cast<spec::GuardDim::Kind>(dim[0].integer(0, 2)),
                         dim[1].integer(0, INT64_MAX)});
    }
    g.inputs.push_back(std::move(gi));
  }
  e.texts.symbols = strings(f["names"], size_t(g.symbols));
  e.texts.exprs = strings(f["texts"], g.exprs.size());
  e.texts.input_names = strings(f["input_names"], g.inputs.size());
  e.texts.input_specs = strings(f["input_specs"], g.inputs.size());
}

void reads(const spec::Arg& a, std::vector<int32_t>& out) {
  if (a.kind == K::Slot) out.push_back(int32_t(a.i));
  for (const auto& item : a.items) reads(item, out);
}

// The plan as a program (artifact/schema/flow.py): every slot a step reads is bound (an input, a
// constant or an earlier step's result) and not freed, no slot is bound twice at load, every
// output slot is bound at the end.
void check_flow(const Field& f, const EntrySpec& e) {
  const spec::Program& p = e.program;
  std::vector<char> bound(size_t(p.slots), 0);
  auto bind = [&](int32_t slot, const Field& at) {
    if (slot >= p.slots) at.fail("a slot below " + std::to_string(p.slots), std::to_string(slot));
    if (bound[slot]) at.fail("a slot bound once", "slot " + std::to_string(slot) + " twice");
    bound[slot] = 1;
  };
  for (int32_t s : p.inputs) bind(s, f["inputs"]);
  for (const auto& c : e.weights) bind(c.slot, f["weights"]);
  for (const auto& c : e.state) bind(c.slot, f["state"]);
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const spec::Step& s = p.steps[i];
    std::vector<int32_t> read = s.kind == spec::Step::Kind::Free ? s.slots : std::vector<int32_t>{};
    for (const auto& a : s.args) read.push_back(a.slot);
    for (const auto& a : s.call_args) reads(a, read);
    for (const auto& kv : s.kwargs) reads(kv.second, read);
    for (int32_t r : read) {
      if (r < 0 || r >= p.slots)
        f["steps"][i].fail("slots below " + std::to_string(p.slots), "slot " + std::to_string(r) + " (out of range)");
      if (!bound[r]) f["steps"][i].fail("reads of bound slots only", "slot " + std::to_string(r) + " unbound or freed");
    }
    if (s.kind == spec::Step::Kind::Free)
      for (int32_t r : s.slots) bound[r] = 0;
    for (const auto& o : s.outs)
      if (o.slot < p.slots) bound[o.slot] = 1;
    for (int32_t o : s.out)
      if (o >= 0 && o < p.slots) bound[o] = 1;
  }
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    int32_t o = p.outputs[i].slot;
    if (o >= 0 && (o >= p.slots || !bound[o])) f["outputs"][i].fail("a bound slot", "slot " + std::to_string(o));
  }
}

}  // namespace

bool allowed_op(const std::string& qualname) {
  static const std::unordered_set<std::string> table = [] {
    std::unordered_set<std::string> out;
    std::string_view all(aotc_extern_ops_table);
    for (size_t at = 0; at < all.size();) {
      size_t end = all.find('\n', at);
      if (end == std::string_view::npos) end = all.size();
      std::string_view line = all.substr(at, end - at);
      if (!line.empty() && line[0] != '#') out.emplace(line);
      at = end + 1;
    }
    return out;
  }();
  // aotc's own ops: those the runner implements (runtime/cpp/aotc_ops.cpp refuses the others)
  return table.count(qualname) != 0 || qualname.rfind("aotc::", 0) == 0;
}

EntrySpec read_runner_file(const Value& doc, const std::string& file, const std::string& entry,
                           const Kernels* lib, const std::string& device) {
  Field f(doc, file, "");
  std::vector<std::string> known(std::begin(rules::kRunnerFields), std::end(rules::kRunnerFields));
  for (const auto& [key, v] : f.members(64))   // artifact/schema/rules.py RUNNER_FIELDS, no other
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::sort(known.begin(), known.end());
      f.member(key, v).fail("only the fields " + json::dump(known), json::dump(key));
    }
  EntrySpec e;
  spec::Program& p = e.program;
  p.entry = f["entry"].string(128);
  if (p.entry != entry) f["entry"].fail("\"" + entry + "\"", f["entry"].found());
  p.slots = index(f["slots"]);
  e.symbols = strings(f["symbols"], f["symbols"].size(256));
  p.symbols = int32_t(e.symbols.size());
  p.exprs = exprs(f["exprs"]);
  p.inputs = indices(f["inputs"]);
  for (size_t i = 0, n = f["steps"].size(kMaxSlots); i < n; ++i) p.steps.push_back(step(f["steps"][i], lib));
  for (size_t i = 0, n = f["outputs"].size(1 << 16); i < n; ++i) {
    Field o = f["outputs"][i];
    if (o.size(2) != 2) o.fail("[slot, constant]", "another length");
    spec::Output out;
    out.slot = index(o[0], -1);
    out.constant = constant(o[1]);
    p.outputs.push_back(std::move(out));
  }
  e.weights = constants(f["weights"], true);
  e.state = constants(f["state"], false);
  p.set_threads = f["set_threads"].boolean() && lib ? lib->set_threads() : 0;
  e.guards.device = device;
  guards(f["guards"], e);
  size_t bound = 0;   // the last symbols are bound by calls, not read from inputs
  for (const auto& s : p.steps) bound += s.binds.size();
  if (bound > e.symbols.size() || e.guards.plan_symbols.size() != e.symbols.size() - bound)
    f["guards"]["plan_symbols"].fail("one per symbol the inputs bind",
                                     std::to_string(e.guards.plan_symbols.size()));
  check_flow(f, e);
  return e;
}

}  // namespace aotc::fe
