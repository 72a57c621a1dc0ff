// Guards::bind (see guards.h).
#include "guards.h"

#include "expr.h"
#include "instr.h"

namespace aotc {

Guards::Guards(spec::Guards s) : s_(std::move(s)), device_(c10::Device(s_.device).type()) {
  const std::string where = "guards";
  if (s_.symbols < 0 || s_.symbols > 256 || s_.ranges.size() != size_t(s_.symbols))
    throw SpecError("at most 256 symbols, each with a range", where);
  for (const auto& e : s_.exprs) {
    std::string problem = expr::check(e, s_.symbols);
    if (!problem.empty()) throw SpecError("expression: expected " + problem, where);
  }
  for (int32_t r : s_.relations)
    if (r < 0 || size_t(r) >= s_.exprs.size()) throw SpecError("a relation's expression", where);
  for (int32_t p : s_.plan_symbols)
    if (p < 0 || p >= s_.symbols) throw SpecError("a plan symbol the guards bind", where);
  std::vector<char> read(s_.symbols, 0);
  for (const auto& in : s_.inputs)
    for (const auto& d : in.dims)
      if (d.kind == spec::GuardDim::Kind::Symbol && d.value >= 0 && d.value < s_.symbols)
        read[d.value] = 1;
  for (const auto& e : s_.exprs)
    for (size_t pc = 0; pc + 1 < e.size(); ++pc)
      if (e[pc] == expr::CONST || e[pc] == expr::SYM || e[pc] == expr::MIN || e[pc] == expr::MAX)
        decided_in_python_ |= e[pc] == expr::SYM && !read[e[pc + 1]], ++pc;
  for (const auto& in : s_.inputs) {
    dtypes_.push_back(dtype_named(in.dtype, where));
    for (const auto& d : in.dims) {
      bool ok = d.kind == spec::GuardDim::Kind::Static ? d.value >= 0
              : d.kind == spec::GuardDim::Kind::Symbol ? d.value < s_.symbols && d.value >= 0
                                                       : d.value >= 0 && size_t(d.value) < s_.exprs.size();
      if (!ok) throw SpecError("a dim: a size, a symbol or an expression", where);
    }
  }
}

bool Guards::check_input(const at::Tensor& t, size_t i, std::vector<int64_t>& syms,
                         std::vector<char>& bound) const {
  const spec::GuardInput& g = s_.inputs[i];
  if (t.scalar_type() != dtypes_[i] || t.device().type() != device_) return false;
  if (t.layout() != c10::kStrided || t.is_nested() || t.is_quantized() || t.is_meta())
    return false;
  if (size_t(t.dim()) != g.dims.size()) return false;
  for (size_t d = 0; d < g.dims.size(); ++d) {
    const spec::GuardDim& want = g.dims[d];
    int64_t size = t.size(int64_t(d));
    if (want.kind == spec::GuardDim::Kind::Static) {
      if (size != want.value) return false;
    } else if (want.kind == spec::GuardDim::Kind::Symbol) {
      if (bound[want.value] && syms[want.value] != size) return false;
      syms[want.value] = size, bound[want.value] = 1;
    }
  }
  return true;
}

bool Guards::bind(const std::vector<at::Tensor>& inputs, bool check,
                  std::vector<int64_t>& out) const {
  if (inputs.size() != s_.inputs.size() || decided_in_python_) return false;
  std::vector<int64_t> syms(s_.symbols, 0);
  std::vector<char> bound(s_.symbols, 0);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (check) {
      if (!check_input(inputs[i], i, syms, bound)) return false;
      continue;
    }
    const auto& dims = s_.inputs[i].dims;   // unchecked: each symbol from its first dim
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d].kind == spec::GuardDim::Kind::Symbol && !bound[dims[d].value]) {
        if (int64_t(d) >= inputs[i].dim()) return false;
        syms[dims[d].value] = inputs[i].size(int64_t(d)), bound[dims[d].value] = 1;
      }
  }
  for (int32_t p : s_.plan_symbols)
    if (!bound[p]) return false;
  if (check) {
    try {
      for (int32_t k = 0; k < s_.symbols; ++k)
        if (bound[k] && (syms[k] < s_.ranges[k].first || syms[k] > s_.ranges[k].second))
          return false;
      for (size_t i = 0; i < inputs.size(); ++i)
        for (size_t d = 0; d < s_.inputs[i].dims.size(); ++d) {
          const auto& want = s_.inputs[i].dims[d];
          if (want.kind == spec::GuardDim::Kind::Derived &&
              expr::eval(s_.exprs[want.value], syms.data()) != inputs[i].size(int64_t(d)))
            return false;
        }
      for (int32_t r : s_.relations)
        if (!expr::eval(s_.exprs[r], syms.data())) return false;
    } catch (const std::overflow_error&) {
      return false;
    }
  }
  out.clear();
  for (int32_t p : s_.plan_symbols) out.push_back(syms[p]);
  return true;
}

}  // namespace aotc
