// Value-dependent sizes (format 16): the symbols a plan's calls bind from their results
// (`x[mask]`'s rows), after the symbols the inputs bind. At load, Program orders the binds
// (each of the last bound() symbols bound by exactly one call) and stages the expressions: an
// expression over a bound symbol is evaluated right after the call that binds the last of its
// symbols, and no step may use it before. Per call, a bound value outside its range stops the
// plan (RunResult::failed_symbol) before any later step runs.
#include <algorithm>
#include <functional>

#include "expr.h"
#include "instr.h"

namespace aotc {

namespace {

std::string at_step(const spec::Step& s) { return "plan step " + std::to_string(s.index); }

// The expressions and symbols a step reads or sizes its results with.
void step_uses(const spec::Step& s, std::vector<int32_t>& exprs, std::vector<int32_t>& syms) {
  auto dims = [&](const std::vector<spec::Dim>& ds) {
    for (const auto& d : ds)
      if (d.expr >= 0) exprs.push_back(d.expr);
  };
  std::function<void(const spec::Arg&)> arg = [&](const spec::Arg& a) {
    if (a.kind == spec::Arg::Kind::Sym) exprs.push_back(int32_t(a.i));
    for (const auto& x : a.items) arg(x);
  };
  for (const auto& a : s.args) dims(a.stride), dims(a.shape);
  for (const auto& o : s.outs) dims(o.shape), dims(o.stride);
  dims(s.grid);
  for (int32_t sz : s.sizes) syms.push_back(sz);
  for (const auto& a : s.call_args) arg(a);
  for (const auto& kv : s.kwargs) arg(kv.second);
}

}  // namespace

// Which bind defines each symbol, and the stage of each expression; refuses binds of
// symbols other than the last ones, a symbol bound twice or never, a bind of no result.
void Program::order_binds(const std::vector<spec::Step>& steps, const std::string& where) {
  for (const auto& s : steps) bound_ += int32_t(s.binds.size());
  if (bound_ > symbols_) throw SpecError("at most one bind per symbol", where);
  order_.assign(symbols_, 0);
  int32_t k = 0;
  for (const auto& s : steps)
    for (const auto& b : s.binds) {
      if (b.symbol < symbols_ - bound_ || b.symbol >= symbols_ || order_[b.symbol])
        throw SpecError("a bind of one of the plan's last " + std::to_string(bound_) +
                            " symbols, each once", at_step(s));
      if (b.out < 0 || size_t(b.out) >= s.out.size() || s.out[b.out] < 0 || b.dim < -1 ||
          b.dim > 63 || b.lo < 0 || b.lo > b.hi)
        throw SpecError("a bind of a kept result's dim within a range lo <= hi", at_step(s));
      order_[b.symbol] = ++k;
    }
  stage_.assign(exprs_.size(), 0);
  for (size_t e = 0; e < exprs_.size(); ++e) {
    const auto& code = exprs_[e];
    for (size_t pc = 0; pc < code.size(); ++pc) {
      if (code[pc] == expr::SYM) stage_[e] = std::max(stage_[e], order_[code[pc + 1]]);
      if (code[pc] == expr::CONST || code[pc] == expr::SYM || code[pc] == expr::MIN ||
          code[pc] == expr::MAX)
        ++pc;
    }
  }
}

// A step uses only sizes bound before it (`done` binds so far; its own binds count for it).
void Program::check_stages(const spec::Step& s, int32_t done) const {
  std::vector<int32_t> exprs, syms;
  step_uses(s, exprs, syms);
  int32_t own = done + int32_t(s.binds.size());
  for (int32_t e : exprs)
    if (e >= 0 && size_t(e) < stage_.size() && stage_[e] > own)
      throw SpecError("sizes bound before the step that uses them", at_step(s));
  for (int32_t sz : syms)
    if (sz >= 0 && sz < symbols_ && order_[sz] > done)
      throw SpecError("sizes bound before the kernel that takes them", at_step(s));
}

// After call `c` ran: its binds' values into `syms` (false, with the failing one in `r`, for
// one out of range), and the expressions they complete into `ev`.
bool bind_sizes(const Program::Call& c, const std::vector<c10::IValue>& regs,
                std::vector<int64_t>& syms, const std::vector<std::vector<int64_t>>& exprs,
                const std::vector<int32_t>& stage, int32_t& done, int64_t* ev, RunResult& r) {
  for (const auto& b : c.binds) {
    const c10::IValue& v = regs[c.out[b.out]];
    int64_t value = 0;
    if (b.dim < 0 && v.isInt()) {
      value = v.toInt();
    } else if (b.dim >= 0 && v.isTensor() && b.dim < v.toTensor().dim()) {
      value = v.toTensor().size(b.dim);
    } else {
      throw std::runtime_error("a call's result has no size where the plan binds one");
    }
    if (value < b.lo || value > b.hi) {
      r.failed_symbol = b.symbol, r.failed_value = value;
      return false;
    }
    syms[b.symbol] = value;
  }
  int32_t from = done;
  done += int32_t(c.binds.size());
  for (size_t e = 0; e < exprs.size(); ++e)
    if (stage[e] > from && stage[e] <= done) ev[e] = expr::eval(exprs[e], syms.data());
  return true;
}

}  // namespace aotc
