// ATen calls of a plan: each resolved once, at load, against the operator's own schema into a
// list of fillers (constants built here; registers and sizes read per call), and generated
// kernels called through their table address.
#include <array>
#include <utility>

#include "instr.h"

namespace aotc {

namespace {

using Arg = spec::Arg;
using Filler = Program::Filler;
using K = Arg::Kind;

const std::pair<const char*, at::ScalarType> kDtypes[] = {
    {"float64", at::kDouble}, {"float32", at::kFloat}, {"float16", at::kHalf},
    {"bfloat16", at::kBFloat16}, {"int64", at::kLong}, {"int32", at::kInt},
    {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte}, {"bool", at::kBool},
    {"complex64", at::kComplexFloat}, {"complex128", at::kComplexDouble},
    {"float8_e4m3fn", at::kFloat8_e4m3fn}, {"float8_e5m2", at::kFloat8_e5m2}};

c10::Layout layout_named(const std::string& name, const std::string& where) {
  if (name == "strided") return c10::kStrided;
  if (name == "sparse_coo") return c10::kSparse;
  throw SpecError("unknown layout " + name, where);
}

c10::MemoryFormat format_named(const std::string& name, const std::string& where) {
  if (name == "contiguous_format") return c10::MemoryFormat::Contiguous;
  if (name == "channels_last") return c10::MemoryFormat::ChannelsLast;
  if (name == "channels_last_3d") return c10::MemoryFormat::ChannelsLast3d;
  if (name == "preserve_format") return c10::MemoryFormat::Preserve;
  throw SpecError("unknown memory format " + name, where);
}

struct Ctx {
  c10::Device device;
  int32_t slots;
  size_t exprs;
  std::string where;
};

Filler fixed(c10::IValue v) {
  Filler f;
  f.fixed = std::move(v);
  return f;
}

// A number where a Tensor goes: wrapped as Python's argument parser wraps it, so type
// promotion treats it as a scalar (add.Tensor(x, 1e-5) stays float32).
at::Tensor wrapped_number(const Arg& a) {
  at::Tensor t = a.kind == K::Float ? at::scalar_tensor(a.f, at::kDouble)
               : a.kind == K::Bool  ? at::scalar_tensor(a.b, at::kBool)
                                    : at::scalar_tensor(a.i, at::kLong);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

// A constant as the IValue the schema's type `kind` takes.
c10::IValue constant(const Arg& a, c10::TypeKind kind, const Ctx& c) {
  using T = c10::TypeKind;
  bool floating = kind == T::FloatType || kind == T::SymFloatType;
  switch (a.kind) {
    case K::None: return c10::IValue();
    case K::Bool: return floating ? c10::IValue(double(a.b)) : c10::IValue(a.b);
    case K::Int: return floating ? c10::IValue(double(a.i)) : c10::IValue(a.i);
    case K::Float: return c10::IValue(a.f);
    case K::String: return c10::IValue(a.s);
    case K::DType: return c10::IValue(dtype_named(a.s, c.where));
    case K::Layout: return c10::IValue(layout_named(a.s, c.where));
    case K::MemoryFormat: return c10::IValue(format_named(a.s, c.where));
    case K::Device: return c10::IValue(c.device);
    default: throw SpecError("an argument that is not a constant", c.where);
  }
}

Filler reference(const Arg& a, bool as_double, const Ctx& c) {
  Filler f;
  f.kind = a.kind == K::Slot ? Filler::Kind::Slot : Filler::Kind::Sym;
  size_t bound = a.kind == K::Slot ? size_t(c.slots) : c.exprs;
  if (a.i < 0 || size_t(a.i) >= bound) throw SpecError("an argument index out of range", c.where);
  f.index = static_cast<int32_t>(a.i);
  f.as_double = as_double && a.kind == K::Sym;
  return f;
}

Filler resolve(const c10::TypePtr& type, const Arg& a, std::optional<int32_t> n, const Ctx& c);

Filler resolve_list(const c10::TypePtr& elem, const std::vector<Arg>& items, const Ctx& c) {
  using T = c10::TypeKind;
  T kind = elem->kind();
  std::vector<Filler> parts;
  bool dynamic = false;
  for (const Arg& x : items) {
    if (x.kind == K::List) throw Unsupported("a nested list argument in " + c.where);
    parts.push_back(resolve(elem, x, std::nullopt, c));
    dynamic |= parts.back().kind != Filler::Kind::Fixed;
  }
  Filler f;
  if (kind == T::IntType || kind == T::SymIntType) {
    if (!dynamic) {
      c10::List<int64_t> l;
      for (auto& p : parts) l.push_back(p.fixed.toInt());
      return fixed(c10::IValue(std::move(l)));
    }
    f.kind = Filler::Kind::IntList;
  } else if (kind == T::TensorType) {
    f.kind = Filler::Kind::TensorList;
  } else if (kind == T::OptionalType &&
             elem->castRaw<c10::OptionalType>()->getElementType()->kind() == T::TensorType) {
    f.kind = Filler::Kind::OptTensorList;
  } else if (!dynamic && (kind == T::FloatType || kind == T::BoolType)) {
    if (kind == T::BoolType) {
      c10::List<bool> l;
      for (auto& p : parts) l.push_back(p.fixed.toBool());
      return fixed(c10::IValue(std::move(l)));
    }
    c10::List<double> l;
    for (auto& p : parts) l.push_back(p.fixed.toDouble());
    return fixed(c10::IValue(std::move(l)));
  } else {
    throw Unsupported("a list of " + elem->str() + " in " + c.where);
  }
  f.items = std::move(parts);
  return f;
}

Filler resolve(const c10::TypePtr& type, const Arg& a, std::optional<int32_t> n, const Ctx& c) {
  using T = c10::TypeKind;
  T kind = type->kind();
  if (a.kind == K::None) return fixed(c10::IValue());
  if (kind == T::OptionalType)
    return resolve(type->castRaw<c10::OptionalType>()->getElementType(), a, n, c);
  if (a.kind == K::Slot || a.kind == K::Sym) {
    if (kind == T::ListType) throw Unsupported("a list held in one value in " + c.where);
    return reference(a, kind == T::FloatType || kind == T::SymFloatType, c);
  }
  if (kind == T::ListType) {
    const c10::TypePtr& elem = type->castRaw<c10::ListType>()->getElementType();
    if (a.kind == K::List) return resolve_list(elem, a.items, c);
    // int[2] given one int: repeated, as Python's argument parser does
    std::vector<Arg> items(n.value_or(1), a);
    return resolve_list(elem, items, c);
  }
  if (a.kind == K::List) throw SpecError("a list where " + type->str() + " goes", c.where);
  if (kind == T::TensorType) {
    if (a.kind != K::Int && a.kind != K::Float && a.kind != K::Bool)
      throw SpecError("a tensor or a number where a Tensor goes", c.where);
    return fixed(c10::IValue(wrapped_number(a)));
  }
  return fixed(constant(a, kind, c));
}

}  // namespace

at::ScalarType dtype_named(const std::string& name, const std::string& where) {
  for (const auto& [n, t] : kDtypes)
    if (name == n) return t;
  throw SpecError("unknown dtype " + name, where);
}

std::string dtype_name(at::ScalarType t) {
  for (const auto& [n, dt] : kDtypes)
    if (t == dt) return n;
  return c10::toString(t);
}

c10::IValue Program::Filler::make(const std::vector<c10::IValue>& regs, const int64_t* ev) const {
  switch (kind) {
    case Kind::Fixed: return fixed;
    case Kind::Slot: return regs[index];
    case Kind::Sym: return as_double ? c10::IValue(double(ev[index])) : c10::IValue(ev[index]);
    case Kind::IntList: {
      c10::List<int64_t> l;
      l.reserve(items.size());
      for (const Filler& f : items) l.push_back(f.make(regs, ev).toInt());
      return c10::IValue(std::move(l));
    }
    case Kind::TensorList: {
      c10::List<at::Tensor> l;
      l.reserve(items.size());
      for (const Filler& f : items) l.push_back(f.make(regs, ev).toTensor());
      return c10::IValue(std::move(l));
    }
    default: {
      c10::List<std::optional<at::Tensor>> l;
      l.reserve(items.size());
      for (const Filler& f : items) {
        c10::IValue v = f.make(regs, ev);
        l.push_back(v.isNone() ? std::optional<at::Tensor>() : v.toTensor());
      }
      return c10::IValue(std::move(l));
    }
  }
}

NativeOp native_op(const std::string& op, const std::string& overload, std::string& kinds,
                   size_t& least);
void few_rows_mm_call(torch::jit::Stack& st);   // few_rows.cpp

// The fillers of one call, from its positional and keyword arguments and the schema's
// defaults, in the schema's order (a boxed call takes every argument).
Program::Call resolve_call(const spec::Step& s, const c10::Device& device, int32_t slots,
                           size_t exprs) {
  Ctx c{device, slots, exprs, "plan step " + std::to_string(s.index) + " (" + s.op + "." +
                                  s.overload + ")"};
  Program::Call call;
  call.out = s.out;
  call.single = s.single;
  std::string kinds;
  size_t least = 0;
  if ((call.native = native_op(s.op, s.overload, kinds, least))) {
    if (!s.kwargs.empty() || s.call_args.size() < least || s.call_args.size() > kinds.size())
      throw SpecError(std::to_string(least) + "-" + std::to_string(kinds.size()) +
                      " positional arguments", c.where);
    for (size_t i = 0; i < s.call_args.size(); ++i) {
      const Arg& a = s.call_args[i];
      bool ok = kinds[i] == 'T' ? a.kind == K::Slot
              : kinds[i] == 'i' ? a.kind == K::Int : a.kind == K::Int || a.kind == K::Float;
      if (!ok)
        throw SpecError("argument " + std::to_string(i) + (kinds[i] == 'T' ? ": a tensor slot"
                        : kinds[i] == 'i' ? ": an int" : ": a number"), c.where);
      call.stack.push_back(a.kind == K::Slot ? reference(a, false, c)
                                             : fixed(constant(a, c10::TypeKind::AnyType, c)));
    }
    return call;
  }
  // plans name an op's unnamed overload "default", as torch.ops does; the dispatcher ""
  auto handle = c10::Dispatcher::singleton().findSchema(
      {s.op, s.overload == "default" ? std::string() : s.overload});
  if (!handle) throw Unsupported("operator " + s.op + "." + s.overload +
                                 " is not in this torch's dispatcher");
  const auto& args = handle->schema().arguments();
  size_t positional = 0;
  for (const auto& f : args) positional += !f.kwarg_only();
  if (s.call_args.size() > positional)
    throw SpecError("at most " + std::to_string(positional) + " positional arguments", c.where);
  size_t used_kwargs = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::Argument& formal = args[i];
    const Arg* a = (!formal.kwarg_only() && i < s.call_args.size()) ? &s.call_args[i] : nullptr;
    for (const auto& [name, value] : s.kwargs)
      if (!a && name == formal.name()) a = &value, ++used_kwargs;
    if (a) {
      call.stack.push_back(resolve(formal.type(), *a, formal.N(), c));
    } else if (formal.default_value()) {
      call.stack.push_back(fixed(*formal.default_value()));
    } else {
      throw SpecError("argument " + formal.name() + " of " + s.op + "." + s.overload, c.where);
    }
  }
  if (used_kwargs != s.kwargs.size())
    throw SpecError("keyword arguments the operator's schema names", c.where);
  call.op = *handle;
  if (s.op == "aten::mm" && s.overload == "default" && device.is_cpu())
    call.native = &few_rows_mm_call;   // few rows stream the weight once; else torch's mm
  return call;
}

// Kernels are `extern "C" int name(T* ..., int64_t ...)`: pointers and sizes are all 8-byte
// integer-class arguments (System V x86-64 and AArch64 pass them alike), so one signature of
// N uint64_t arguments calls every kernel taking N.
namespace {
using Caller = int (*)(intptr_t, const uint64_t*);

template <size_t... I>
int call_with(intptr_t fn, const uint64_t* a, std::index_sequence<I...>) {
  using F = int (*)(decltype((void)I, uint64_t())...);
  return reinterpret_cast<F>(fn)(a[I]...);
}

template <size_t N>
int call_n(intptr_t fn, const uint64_t* a) {
  return call_with(fn, a, std::make_index_sequence<N>{});
}

template <size_t... N>
constexpr std::array<Caller, sizeof...(N)> callers(std::index_sequence<N...>) {
  return {&call_n<N>...};
}

const auto kCallers = callers(std::make_index_sequence<kMaxKernelArgs + 1>{});
}  // namespace

int call_kernel(intptr_t fn, const uint64_t* args, size_t n) { return kCallers[n](fn, args); }

}  // namespace aotc
