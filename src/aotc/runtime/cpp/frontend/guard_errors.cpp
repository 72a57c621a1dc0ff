// The C++ front end's guard check with errors: runtime/guards.py `Guards.check` in C++, the
// same checks in the same order and the same messages. Calls take the fast check first
// (guards.h `Guards::bind`); this runs where it fails, to raise the GuardError, and returns the
// plan's symbols where it finds nothing wrong (a call the fast check could not decide).
#include "guard_errors.h"

#include <sstream>

#include "../expr.h"
#include "../instr.h"

namespace aotc::fe {

namespace {

using Kind = spec::GuardDim::Kind;

std::string torch_dtype(at::ScalarType t) { return "torch." + dtype_name(t); }

std::string shape_list(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

std::string layout_name(const at::Tensor& t) {
  switch (t.layout()) {
    case c10::kStrided: return "torch.strided";
    case c10::kSparse: return "torch.sparse_coo";
    case c10::kSparseCsr: return "torch.sparse_csr";
    case c10::kSparseCsc: return "torch.sparse_csc";
    case c10::kSparseBsr: return "torch.sparse_bsr";
    case c10::kSparseBsc: return "torch.sparse_bsc";
    case c10::kJagged: return "torch.jagged";
    default: return "torch.layout";
  }
}

struct Check {
  const spec::Guards& g;
  const GuardTexts& t;
  std::vector<int64_t> syms;
  std::vector<char> bound;
  std::vector<int32_t> order;                                   // symbols in binding order
  std::vector<std::tuple<size_t, size_t, int32_t, int64_t>> derived;   // input, dim, expr, size

  std::string where(size_t i) const { return "input '" + t.input_names[i] + "' (#" + std::to_string(i) + ")"; }
  std::string bound_list() const {
    std::string s;
    for (int32_t k : order) s += (s.empty() ? "" : ", ") + t.symbols[k] + "=" + std::to_string(syms[k]);
    return s;
  }
  [[noreturn]] void fail(const std::string& what, const std::string& w, const std::string& e,
                         const std::string& f, const std::string& fix) const {
    throw GuardError(what, w, e, f, fix);
  }
  void count(size_t n) const;
  void tensor(const at::Tensor& x, size_t i);
  void dims(const at::Tensor& x, size_t i);
  int64_t eval(int32_t e) const;
  void symbols();
};

void Check::count(size_t n) const {
  if (n == g.inputs.size()) return;
  std::string names;
  for (const auto& name : t.input_names) names += (names.empty() ? "" : ", ") + name;
  std::string want = std::to_string(g.inputs.size());
  fail("wrong number of inputs: expected " + want + ", got " + std::to_string(n), "call arguments",
       want + " (" + names + ")", std::to_string(n), "call the module with (" + names + ")");
}

void Check::tensor(const at::Tensor& x, size_t i) {
  std::string w = where(i), spec = t.input_specs[i];
  if (!x.defined())
    fail(w + " is not a tensor", w, "a tensor " + spec, "an undefined tensor", "pass a torch.Tensor " + spec);
  auto want = dtype_named(g.inputs[i].dtype, "guards");
  if (x.scalar_type() != want)
    fail(w + " has dtype " + torch_dtype(x.scalar_type()) + ", expected " + torch_dtype(want), w,
         torch_dtype(want), torch_dtype(x.scalar_type()), "convert it with .to(" + torch_dtype(want) + ")");
  if (c10::DeviceTypeName(x.device().type(), true) != g.device) {
    std::string dev = x.device().str();
    fail(w + " is on " + dev + ", expected " + g.device, w, g.device, dev,
         "move it with .to('" + g.device + "') or load the artifact with device='" + dev + "'");
  }
  if (x.layout() != c10::kStrided || x.is_nested())
    fail(w + " has layout " + layout_name(x) + ", expected a dense (strided) tensor", w,
         "torch.strided", layout_name(x), "pass a dense tensor (e.g. .to_dense())");
  if (x.is_quantized() || x.is_meta()) {
    std::string kind = x.is_quantized() ? "quantized" : "meta";
    fail(w + " is a " + kind + " tensor", w, "a tensor with real, plain values", kind,
         "pass a plain tensor (dequantize, or materialize a meta tensor)");
  }
  size_t rank = g.inputs[i].dims.size();
  if (size_t(x.dim()) != rank)
    fail(w + " has rank " + std::to_string(x.dim()) + ", expected " + std::to_string(rank) + " (" + spec + ")",
         w, "rank " + std::to_string(rank) + ": " + spec,
         "rank " + std::to_string(x.dim()) + ": " + shape_list(x), "pass a tensor of shape " + spec);
  dims(x, i);
}

void Check::dims(const at::Tensor& x, size_t i) {
  std::string w = where(i);
  for (size_t d = 0; d < g.inputs[i].dims.size(); ++d) {
    const auto& want = g.inputs[i].dims[d];
    int64_t size = x.size(int64_t(d));
    std::string wd = w + ", dim " + std::to_string(d), ds = " dim " + std::to_string(d);
    if (want.kind == Kind::Static && size != want.value)
      fail(w + ds + " has size " + std::to_string(size) + ", expected " + std::to_string(want.value),
           wd, std::to_string(want.value), std::to_string(size), "pass a tensor of shape " +
           t.input_specs[i] + "; this dim was static at export (declare it dynamic at export to "
           "accept other sizes)");
    if (want.kind == Kind::Symbol) {
      auto k = want.value;
      const std::string& name = t.symbols[k];
      if (!bound[k]) {
        bound[k] = 1, syms[k] = size, order.push_back(int32_t(k));
      } else if (syms[k] != size) {
        std::string was = std::to_string(syms[k]);
        fail(w + ds + " is " + name + "=" + std::to_string(size) + ", but " + name + "=" + was + " elsewhere",
             wd, name + " = " + was, std::to_string(size), "every dim named " + name + " must have the same size");
      }
    }
    if (want.kind == Kind::Derived) derived.emplace_back(i, d, int32_t(want.value), size);
  }
}

int64_t Check::eval(int32_t e) const {
  const std::string& text = t.exprs[e];
  for (size_t pc = 0; pc + 1 < g.exprs[e].size(); ++pc) {
    int64_t op = g.exprs[e][pc];
    if (op == expr::SYM && !bound[g.exprs[e][pc + 1]])
      fail("the size expression " + text + " reads a symbol no input binds", text,
           "symbols bound by the inputs", bound_list(), "re-export the model");
    if (op == expr::CONST || op == expr::SYM || op == expr::MIN || op == expr::MAX) ++pc;
  }
  try {
    return expr::eval(g.exprs[e], syms.data());
  } catch (const std::overflow_error& err) {
    bool zero = std::string(err.what()).find("zero") != std::string::npos;
    fail("the size expression " + text + (zero ? " divides by zero at these sizes" : " overflows 64 bits at these sizes"),
         text, zero ? "a non-zero divisor" : "a size within 64 bits", bound_list(), "choose other input sizes");
  }
}

void Check::symbols() {
  for (int32_t k : order) {
    auto [lo, hi] = g.ranges[k];
    if (syms[k] >= lo && syms[k] <= hi) continue;
    std::string w = "symbol " + t.symbols[k];
    for (size_t i = 0; i < g.inputs.size() && w[0] == 's'; ++i)
      for (size_t d = 0; d < g.inputs[i].dims.size(); ++d)
        if (g.inputs[i].dims[d].kind == Kind::Symbol && g.inputs[i].dims[d].value == k) {
          w = where(i) + ", dim " + std::to_string(d);
          break;
        }
    std::string name = t.symbols[k], range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    fail(w + ": " + name + "=" + std::to_string(syms[k]) + " is outside its range " + range, w,
         std::to_string(lo) + " <= " + name + " <= " + std::to_string(hi), std::to_string(syms[k]),
         "pass a size in " + range + " or re-export with a wider range");
  }
  for (const auto& [i, d, e, size] : derived) {
    int64_t expect = eval(e);
    if (expect == size) continue;
    std::string w = where(i) + ", dim " + std::to_string(d), text = t.exprs[e];
    fail(w + " has size " + std::to_string(size) + ", expected " + text + " = " + std::to_string(expect),
         w, text + " = " + std::to_string(expect), std::to_string(size), "this dim must equal " + text);
  }
  for (int32_t r : g.relations)
    if (!eval(r))
      fail("input sizes break the relation " + t.exprs[r], t.exprs[r], t.exprs[r], bound_list(),
           "choose sizes that satisfy the relation");
}

}  // namespace

std::vector<int64_t> check_inputs(const spec::Guards& g, const GuardTexts& t,
                                  const std::vector<at::Tensor>& inputs) {
  Check c{g, t, std::vector<int64_t>(size_t(g.symbols)), std::vector<char>(size_t(g.symbols)), {}, {}};
  c.count(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) c.tensor(inputs[i], i);
  c.symbols();
  std::vector<int64_t> out;
  for (int32_t k : g.plan_symbols) out.push_back(c.syms[k]);
  return out;
}

}  // namespace aotc::fe
