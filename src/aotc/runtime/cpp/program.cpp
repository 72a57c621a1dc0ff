// Program: a spec checked and compiled at load (constructor), run per call (run).
#include <algorithm>
#include <functional>

#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <c10/util/SmallVector.h>

#include "expr.h"
#include "frontend/rules.h"
#include "include/aotc/errors.h"
#include "instr.h"

namespace aotc {

namespace {

using Dims = c10::SmallVector<int64_t, 8>;

std::string at_step(const spec::Step& s) { return "plan step " + std::to_string(s.index); }

void check_slot(int32_t slot, int32_t slots, const std::string& where) {
  if (slot < 0 || slot >= slots)
    throw SpecError("slot " + std::to_string(slot) + " out of range (the plan has " +
                        std::to_string(slots) + ")", where);
}

void check_exprs(const std::vector<spec::Dim>& dims, size_t most, size_t exprs,
                 const std::string& where) {
  if (dims.size() > most) throw SpecError("at most " + std::to_string(most) + " sizes", where);
  for (const auto& d : dims)
    if (d.expr >= 0 && size_t(d.expr) >= exprs) throw SpecError("an expression index", where);
}

void check_dims(const std::vector<spec::Dim>& dims, size_t exprs, const std::string& where) {
  check_exprs(dims, 64, exprs, where);    // a tensor's dims
}

Dims eval_dims(const std::vector<spec::Dim>& dims, const int64_t* ev) {
  Dims out;
  for (const auto& d : dims) out.push_back(d.expr >= 0 ? ev[d.expr] : d.value);
  return out;
}

// `t` with the strides a kernel was compiled for: a copy only when they differ in a dim of
// more than one element (runtime/executor.py `_layout`).
// A value a kernel reads that no kernel wrote (an ATen call's result, a view) must have the
// plan's shape and dtype: the kernel indexes it by them, so a smaller one would be read out of
// bounds (a hostile plan whose call disagrees with its slot).
void check_argument(const at::Tensor& t, const spec::KernelArg& a, const int64_t* ev) {
  if (a.dtype.empty()) return;
  if (!ev)   // at load (a view of weights): its dims must be constants to check here
    for (const auto& d : a.shape)
      if (d.expr >= 0) return;
  bool fits = t.dim() == int64_t(a.shape.size()) && t.scalar_type() == a.scalar;
  for (size_t d = 0; fits && d < a.shape.size(); ++d)
    fits = t.size(int64_t(d)) == (a.shape[d].expr >= 0 ? ev[a.shape[d].expr] : a.shape[d].value);
  if (fits) return;
  Dims shape = eval_dims(a.shape, ev);
  throw ArtifactError("a kernel's argument is not what the plan declares",
                        "slot " + std::to_string(a.slot), a.dtype + c10::str(c10::IntArrayRef(shape)),
                        dtype_name(t.scalar_type()) + c10::str(t.sizes()),
                        "re-export the model (the plan's calls disagree with its slots)");
}

at::Tensor laid_out(const at::Tensor& t, const spec::KernelArg& a, const int64_t* ev) {
  check_argument(t, a, ev);
  if (a.contiguous) return t.is_contiguous() ? t : t.contiguous();
  Dims stride = eval_dims(a.stride, ev);
  if (size_t(t.dim()) != stride.size())
    throw std::runtime_error("a kernel argument of rank " + std::to_string(t.dim()) +
                             " where the plan has rank " + std::to_string(stride.size()));
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) != stride[d])
      return at::empty_strided(t.sizes(), stride, t.options()).copy_(t);
  return t;
}

// OpenMP's thread count is a setting of the calling thread: the kernel library is told
// torch's count whenever it changes for this thread (runtime/native.py ThreadCount).
void follow_threads(intptr_t setter) {
  struct Seen { intptr_t setter; int n; };
  thread_local Seen seen[4] = {};
  thread_local unsigned next = 0;
  int n = at::get_num_threads();
  for (auto& s : seen)
    if (s.setter == setter) {
      if (s.n != n) reinterpret_cast<void (*)(int)>(setter)(n), s.n = n;
      return;
    }
  reinterpret_cast<void (*)(int)>(setter)(n);
  seen[next++ % 4] = {setter, n};
}

Program::Kernel compile_kernel(const spec::Step& s, const c10::Device& device, int32_t slots,
                               int32_t symbols, size_t exprs) {
  std::string where = at_step(s) + " (kernel " + s.name + ")";
  if (!s.fn == !s.launcher) throw SpecError("a kernel address or a launcher", where);
  if (s.launcher && s.grid.size() != 3) throw SpecError("a grid of three dims", where);
  if (s.error_code < 0 || (s.error_code && !s.launcher))
    throw SpecError("an error code of a Triton kernel, positive", where);
  check_dims(s.grid, exprs, where);
  check_exprs(s.extents, fe::rules::kMaxKernelBuffers, exprs, where);
  if (!s.extents.empty() && (!s.launcher || s.extents.size() != s.args.size() + s.outs.size()))
    throw SpecError("a Triton kernel's extents, one per argument and output", where);
  if (s.room && s.launcher) throw SpecError("a room for C++ kernels only", where);
  if (s.args.size() + s.outs.size() + s.sizes.size() + s.room > kMaxKernelArgs)
    throw Unsupported("kernel " + s.name + " takes more than 128 arguments");
  if (s.outs.empty()) throw SpecError("a kernel that writes at least one slot", where);
  Program::Kernel k;
  k.fn = s.fn;
  for (const auto& a : s.args) {
    check_slot(a.slot, slots, where);
    check_dims(a.stride, exprs, where);
    check_dims(a.shape, exprs, where);
    if (a.lay_out && (a.dtype.empty() || a.shape.size() != a.stride.size()))
      throw SpecError("a laid-out argument with its slot's dtype and a shape of its rank", where);
    if (!a.dtype.empty()) dtype_named(a.dtype, where);
  }
  for (const auto& o : s.outs) {
    check_slot(o.slot, slots, where);
    if (o.donor >= 0) check_slot(o.donor, slots, where);
    check_dims(o.shape, exprs, where);
    check_dims(o.stride, exprs, where);
    if (o.shape.size() != o.stride.size()) throw SpecError("one stride per dim", where);
    k.options.push_back(at::TensorOptions().dtype(dtype_named(o.dtype, where)).device(device));
  }
  for (int32_t sz : s.sizes)
    if (sz < 0 || sz >= symbols) throw SpecError("a size symbol index", where);
  k.args = s.args;
  for (auto& a : k.args)
    if (!a.dtype.empty()) a.scalar = dtype_named(a.dtype, where);
  k.outs = s.outs;
  k.sizes = s.sizes;
  k.launcher = s.launcher;
  k.grid = s.grid;
  k.extents = s.extents;
  k.flagged = s.error_code > 0;
  k.room = s.room;
  k.name = s.name;
  k.index = s.index;
  return k;
}

constexpr int64_t kFoldBytes = int64_t(16) << 20;   // runtime/folding.py FOLD_BYTES

// An argument of a call built only from constants that never change (no register, no size).
bool fixed_only(const Program::Filler& f, const std::vector<c10::IValue>& fixed,
                const std::vector<char>& varying) {
  if (f.kind == Program::Filler::Kind::Slot) return !fixed[f.index].isNone() && !varying[f.index];
  if (f.kind == Program::Filler::Kind::Sym) return false;
  return std::all_of(f.items.begin(), f.items.end(),
                     [&](const Program::Filler& x) { return fixed_only(x, fixed, varying); });
}

bool run_kernel(const Program::Kernel& k, std::vector<c10::IValue>& regs, const int64_t* ev,
                const int64_t* syms, const at::Tensor& flag);

}  // namespace

void bind_results(const Program::Call& c, torch::jit::Stack& st, std::vector<c10::IValue>& regs,
                  int32_t index);

Program::~Program() = default;

Program::Program(spec::Program p)
    : entry_(std::move(p.entry)), slots_(p.slots), symbols_(p.symbols),
      exprs_(std::move(p.exprs)), device_(p.device), set_threads_(p.set_threads) {
  const std::string where = "plan " + entry_;
  if (slots_ < 0 || slots_ > (1 << 20)) throw SpecError("at most 2**20 slots", where);
  if (symbols_ < 0 || symbols_ > 256) throw SpecError("at most 256 symbols", where);
  for (const auto& e : exprs_) {
    std::string problem = expr::check(e, symbols_);
    if (!problem.empty()) throw SpecError("expression: expected " + problem, where);
  }
  order_binds(p.steps, where);
  for (auto& [slot, value] : p.constants) check_slot(slot, slots_, where);
  for (int32_t slot : p.inputs) check_slot(slot, slots_, where);
  for (const auto& o : p.outputs)
    if (o.slot >= 0) check_slot(o.slot, slots_, where);
  inputs_ = std::move(p.inputs);
  outputs_ = std::move(p.outputs);
  std::vector<c10::IValue> fixed(slots_);   // the constants, and what is folded here
  for (auto& [slot, value] : p.constants) fixed[slot] = value;
  std::vector<char> varying(slots_, 0), computed(slots_, 0);
  for (int32_t slot : p.varying) check_slot(slot, slots_, where), varying[slot] = 1;
  int32_t done = 0;   // binds of the steps so far
  for (const spec::Step& s : p.steps) {
    check_stages(s, done);
    done += int32_t(s.binds.size());
    Instr in;
    in.kind = s.kind;
    in.index = s.index;
    in.name = s.name;
    if (s.kind == spec::Step::Kind::Kernel) {
      in.kernel = compile_kernel(s, device_, slots_, symbols_, exprs_.size());
      if (s.error_code) codes_.emplace_back(s.error_code, s.index);
      lay_out_constants(in.kernel, fixed, at_step(s));
      if (fold_kernel(in.kernel, fixed, varying, computed, at_step(s))) continue;
    } else if (s.kind == spec::Step::Kind::Call) {
      for (int32_t o : s.out)
        if (o != -1) check_slot(o, slots_, at_step(s));
      in.call = resolve_call(s, device_, slots_, exprs_.size());
      in.call.binds = s.binds;
      bool constant = s.fold && s.binds.empty() && std::all_of(in.call.stack.begin(), in.call.stack.end(),
                                            [&](const Filler& f) { return fixed_only(f, fixed, varying); });
      for (Filler& f : in.call.stack) bind_constants(f, fixed);
      if (constant) {   // `fold` is the plan's hint; a call of other values runs per call
        fold(in.call, fixed, computed);
        continue;
      }
    } else {
      for (int32_t slot : s.slots) check_slot(slot, slots_, at_step(s));
      in.free = s.slots;
    }
    code_.push_back(std::move(in));
  }
  for (auto& o : outputs_)
    if (o.slot >= 0 && !fixed[o.slot].isNone())
      o.constant = fixed[o.slot], o.copy = computed[o.slot], o.slot = -1;
}

// Constants (weights, state, folded views) are bound into the fillers that read them, once:
// a call copies no constant into its registers.
void Program::bind_constants(Filler& f, const std::vector<c10::IValue>& fixed) {
  if (f.kind == Filler::Kind::Slot && !fixed[f.index].isNone()) {
    f.fixed = fixed[f.index];
    f.kind = Filler::Kind::Fixed;
  }
  for (Filler& item : f.items) bind_constants(item, fixed);
}

// Run a call of constants now and keep its results as constants (runtime/executor.py folds
// the same steps); a result that is no view of what it read is returned as a copy.
void Program::fold(const Call& c, std::vector<c10::IValue>& fixed, std::vector<char>& computed) {
  torch::jit::Stack st;
  for (const Filler& f : c.stack) st.push_back(f.make(fixed, nullptr));
  std::vector<at::Tensor> read;
  for (const c10::IValue& v : st)
    if (v.isTensor()) read.push_back(v.toTensor());
  c.op ? c.op->callBoxed(st) : c.native(st);
  std::vector<c10::IValue> regs(slots_);
  bind_results(c, st, regs, 0);
  for (int32_t o : c.out) {
    if (o < 0) continue;
    fixed[o] = regs[o];
    if (regs[o].isTensor())
      computed[o] = std::none_of(read.begin(), read.end(), [&](const at::Tensor& t) {
        return regs[o].toTensor().is_alias_of(t);
      });
  }
}

// A C++ kernel that reads only constants that never change, with no size argument and
// outputs of static shapes no larger than kFoldBytes or than what it reads: run once, here,
// its outputs kept as constants (runtime/folding.py states the rule both runners follow).
// Triton kernels are left to run per call (their modules load after the plan is built).
bool Program::fold_kernel(Kernel& k, std::vector<c10::IValue>& fixed,
                          const std::vector<char>& varying, std::vector<char>& computed,
                          const std::string& where) {
  for (auto& o : k.outs)   // a folded buffer lives on: no later kernel takes it over
    if (o.donor >= 0 && !fixed[o.donor].isNone()) o.donor = -1, o.donor_view = false;
  if (!k.fn || !k.sizes.empty()) return false;
  int64_t read = 0, wrote = 0;
  std::vector<int32_t> seen;
  for (size_t i = 0; i < k.args.size(); ++i) {
    int32_t slot = k.args[i].slot;
    if (!k.fixed[i].defined() || varying[slot]) return false;
    if (std::find(seen.begin(), seen.end(), slot) != seen.end()) continue;
    seen.push_back(slot);
    read += k.fixed[i].numel() * int64_t(k.fixed[i].element_size());
  }
  for (size_t i = 0; i < k.outs.size(); ++i) {
    int64_t n = int64_t(c10::elementSize(k.options[i].dtype().toScalarType()));
    for (const auto& d : k.outs[i].shape) {
      if (d.expr >= 0 || d.value < 0 || d.value > (int64_t(1) << 40)) return false;
      n *= d.value;
      if (n > (int64_t(1) << 40)) return false;
    }
    for (const auto& d : k.outs[i].stride)
      if (d.expr >= 0) return false;
    wrote += n;
  }
  if (wrote > std::max<int64_t>(kFoldBytes, read)) return false;
  Kernel once = k;
  for (auto& o : once.outs) o.donor = -1;
  std::vector<c10::IValue> regs(slots_);
  if (!run_kernel(once, regs, nullptr, nullptr, at::Tensor()))
    throw SpecError("a kernel of constants whose indices stay in range", where);
  for (const auto& o : k.outs) fixed[o.slot] = regs[o.slot], computed[o.slot] = 1;
  return true;
}

// A kernel argument that is a constant is bound here, laid out once if it needs other strides.
void Program::lay_out_constants(Kernel& k, const std::vector<c10::IValue>& fixed,
                                 const std::string& where) {
  k.fixed.resize(k.args.size());
  for (size_t i = 0; i < k.args.size(); ++i) {
    const spec::KernelArg& a = k.args[i];
    if (!fixed[a.slot].isTensor()) continue;
    if (!a.lay_out) {
      k.fixed[i] = fixed[a.slot].toTensor();
      continue;
    }
    for (const auto& d : a.stride)
      if (d.expr >= 0) throw SpecError("a constant with static strides", where);
    k.fixed[i] = laid_out(fixed[a.slot].toTensor(), a, nullptr);
  }
}

void bind_results(const Program::Call& c, torch::jit::Stack& st, std::vector<c10::IValue>& regs,
                  int32_t index) {
  if (c.single) {
    if (c.out.size() == 1 && c.out[0] >= 0)
      regs[c.out[0]] = st.empty() ? c10::IValue() : std::move(st[0]);
    return;
  }
  std::vector<c10::IValue> values;
  if (st.size() == 1 && st[0].isList()) {
    for (const c10::IValue& v : st[0].toListRef()) values.push_back(v);
  } else {
    values = std::move(st);
  }
  if (values.size() != c.out.size())
    throw std::runtime_error("plan step " + std::to_string(index) + " returned " +
                             std::to_string(values.size()) + " values, the plan binds " +
                             std::to_string(c.out.size()));
  for (size_t i = 0; i < values.size(); ++i)
    if (c.out[i] >= 0) regs[c.out[i]] = std::move(values[i]);
}

namespace {

void run_call(const Program::Call& c, std::vector<c10::IValue>& regs, const int64_t* ev,
              int32_t index) {
  torch::jit::Stack st;
  st.reserve(c.stack.size());
  for (const Program::Filler& f : c.stack) st.push_back(f.make(regs, ev));
  if (c.native)
    c.native(st);
  else
    c.op->callBoxed(st);
  bind_results(c, st, regs, index);
}

// A kernel's output buffer; on the CPU straight from the CPU allocator, as the dispatcher's
// CPU kernel for empty would (no dispatch for a few hundred bytes of metadata).
at::Tensor allocate(const Dims& shape, const spec::KernelOut& o, const c10::TensorOptions& opt,
                    const int64_t* ev) {
  if (opt.device().is_cpu()) {
    if (o.contiguous)
      return at::detail::empty_cpu(shape, opt.dtype().toScalarType(), false, std::nullopt);
    return at::detail::empty_strided_cpu(shape, eval_dims(o.stride, ev),
                                         opt.dtype().toScalarType());
  }
  return o.contiguous ? at::empty(shape, opt) : at::empty_strided(shape, eval_dims(o.stride, ev), opt);
}

const at::Tensor& tensor_in(const std::vector<c10::IValue>& regs, int32_t slot) {
  const c10::IValue& v = regs[slot];
  if (!v.isTensor())
    throw std::runtime_error("a kernel reads slot " + std::to_string(slot) + ", which holds " +
                             (v.isNone() ? std::string("nothing") : v.tagKind()) +
                             ", not a tensor");
  return v.toTensor();
}

// A Triton kernel: its buffers (read, then written) and sizes handed to its launcher.
void launch_kernel(const Program::Kernel& k, std::vector<c10::IValue>& regs, const int64_t* ev,
                   const int64_t* syms, const at::Tensor& flag) {
  c10::SmallVector<at::Tensor, 16> buffers;
  for (size_t i = 0; i < k.args.size(); ++i)
    buffers.push_back(k.fixed[i].defined() ? k.fixed[i] : tensor_in(regs, k.args[i].slot));
  for (const auto& o : k.outs) buffers.push_back(tensor_in(regs, o.slot));
  c10::SmallVector<int64_t, 8> sizes;
  for (int32_t s : k.sizes) sizes.push_back(syms[s]);
  Dims grid = eval_dims(k.grid, ev);
  k.launcher->launch({grid[0], grid[1], grid[2]}, buffers, k.flagged ? flag : at::Tensor(), sizes);
}

// A Triton kernel's call refused (before its launch) where a pointer has less room than the
// kernel indexes past it: its launch spec's extents, after the rooms in `room`.
void check_extents(const Program::Kernel& k, int64_t* room, const int64_t* ev) {
  size_t n = k.args.size() + k.outs.size();
  Dims need = eval_dims(k.extents, ev);
  for (size_t i = 0; i < n; ++i) room[n + i] = need[i];
  for (size_t i = 0; i < n; ++i)
    if (need[i] > room[i]) room_failed(k, -1 - int(i), room);
}

// Allocate a kernel's outputs, call it; false if it met an index out of range.
bool run_kernel(const Program::Kernel& k, std::vector<c10::IValue>& regs, const int64_t* ev,
                const int64_t* syms, const at::Tensor& flag) {
  uint64_t a[kMaxKernelArgs];
  int64_t room[2 * kMaxKernelArgs];
  size_t n = 0;
  const bool measure = k.room || !k.extents.empty();
  for (size_t i = 0; i < k.args.size(); ++i) {
    const spec::KernelArg& arg = k.args[i];
    if (k.fixed[i].defined()) {
      if (measure) room[n] = storage_room(k.fixed[i]);
      a[n++] = reinterpret_cast<uint64_t>(k.fixed[i].data_ptr());
      continue;
    }
    if (arg.lay_out) regs[arg.slot] = laid_out(tensor_in(regs, arg.slot), arg, ev);
    const at::Tensor& t = tensor_in(regs, arg.slot);
    if (measure) room[n] = storage_room(t);
    a[n++] = reinterpret_cast<uint64_t>(t.data_ptr());
  }
  for (size_t i = 0; i < k.outs.size(); ++i) {
    const spec::KernelOut& o = k.outs[i];
    Dims shape = eval_dims(o.shape, ev);
    at::Tensor t;
    if (o.donor >= 0) {   // memory planning: take over a dead buffer's storage
      const at::Tensor& d = tensor_in(regs, o.donor);
      t = o.donor_view ? d.view(shape) : d.as_strided(shape, eval_dims(o.stride, ev));
      regs[o.donor] = c10::IValue();
    } else {
      t = allocate(shape, o, k.options[i], ev);
    }
    if (measure) room[n] = storage_room(t);   // (only kernels that check it read it)
    a[n++] = reinterpret_cast<uint64_t>(t.data_ptr());
    regs[o.slot] = std::move(t);
  }
  if (k.launcher) {
    if (!k.extents.empty()) check_extents(k, room, ev);
    launch_kernel(k, regs, ev, syms, flag);
    return true;
  }
  if (k.room) a[n++] = reinterpret_cast<uint64_t>(room);
  for (int32_t s : k.sizes) a[n++] = static_cast<uint64_t>(syms[s]);
  int code = call_kernel(k.fn, a, n);
  if (code < 0) room_failed(k, code, room);
  return code == 0;
}

}  // namespace

RunResult Program::run(std::vector<c10::IValue> inputs, c10::ArrayRef<int64_t> symbols,
                       bool read_flag) const {
  if (inputs.size() != inputs_.size() || symbols.size() != size_t(symbols_ - bound_))
    throw std::invalid_argument("plan " + entry_ + " takes " + std::to_string(inputs_.size()) +
                                " inputs and " + std::to_string(symbols_ - bound_) +
                                " sizes, given " + std::to_string(inputs.size()) + " and " +
                                std::to_string(symbols.size()));
  if (set_threads_) follow_threads(set_threads_);
  std::vector<c10::IValue> regs(slots_);
  for (size_t i = 0; i < inputs.size(); ++i) regs[inputs_[i]] = std::move(inputs[i]);
  inputs.clear();
  std::vector<int64_t> syms(symbols.begin(), symbols.end());
  syms.resize(symbols_, 0);   // the sizes calls bind (binds.cpp), as they run
  Dims ev(exprs_.size(), 0);
  for (size_t e = 0; e < exprs_.size(); ++e)
    if (!stage_[e]) ev[e] = expr::eval(exprs_[e], syms.data());
  int32_t done = 0;
  RunResult r;
  at::Tensor flag;   // written by Triton kernels that met an index out of range
  if (!codes_.empty()) flag = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device_));
  for (const Instr& in : code_) {
    switch (in.kind) {
      case spec::Step::Kind::Free:
        for (int32_t s : in.free) regs[s] = c10::IValue();
        break;
      case spec::Step::Kind::Call:
        run_call(in.call, regs, ev.data(), in.index);
        if (!in.call.binds.empty() &&
            !bind_sizes(in.call, regs, syms, exprs_, stage_, done, ev.data(), r)) {
          r.failed_step = in.index;
          return r;
        }
        break;
      case spec::Step::Kind::Kernel:
        if (!run_kernel(in.kernel, regs, ev.data(), syms.data(), flag)) {
          r.failed_step = in.index;
          const Kernel& k = in.kernel;
          for (size_t i = 0; i < k.args.size(); ++i)
            r.failed_args.push_back(k.fixed[i].defined() ? c10::IValue(k.fixed[i])
                                                         : regs[k.args[i].slot]);
          return r;
        }
        break;
    }
  }
  for (const auto& o : outputs_)
    r.outputs.push_back(o.slot >= 0 ? regs[o.slot]
                        : o.copy ? c10::IValue(o.constant.toTensor().clone()) : o.constant);
  if (flag.defined() && !read_flag) {
    r.flag = flag;
  } else if (flag.defined()) {
    int32_t code = flag.item<int32_t>();
    if (code) r.outputs.clear(), r.failed_step = failed_step(code);
  }
  return r;
}

// The step whose kernel stores `code` into the error flag.
int32_t Program::failed_step(int32_t code) const {
  for (const auto& [c, step] : codes_)
    if (c == code) return step;
  throw std::runtime_error("plan " + entry_ + ": a kernel flagged error code " +
                           std::to_string(code) + ", which no step of the plan stores");
}

}  // namespace aotc
