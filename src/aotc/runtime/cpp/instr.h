// The runner's compiled instructions (internal to program.cpp and call.cpp): what a spec
// becomes once its operators are resolved, its constant arguments built and its indices checked.
#pragma once

#include <optional>

#include "program.h"

namespace aotc {

// Builds one value of an ATen call's argument stack from the registers and the call's
// evaluated expressions.
struct Program::Filler {
  enum class Kind : uint8_t { Fixed, Slot, Sym, IntList, TensorList, OptTensorList };
  Kind kind = Kind::Fixed;
  bool as_double = false;   // a size passed where the schema takes a float
  c10::IValue fixed;
  int32_t index = 0;        // Slot: register; Sym: expression
  std::vector<Filler> items;

  c10::IValue make(const std::vector<c10::IValue>& regs, const int64_t* ev) const;
};

struct Program::Kernel {
  intptr_t fn = 0;
  std::vector<spec::KernelArg> args;
  std::vector<at::Tensor> fixed;   // per arg: a constant laid out at load, or undefined
  std::vector<spec::KernelOut> outs;
  std::vector<c10::TensorOptions> options;   // per out
  std::vector<int32_t> sizes;
  std::shared_ptr<const Launcher> launcher;   // a Triton kernel's (then fn is 0)
  std::vector<spec::Dim> grid;
  std::vector<spec::Dim> extents;             // a Triton kernel's, checked before its launch
  bool flagged = false;                       // takes the plan's error flag
  bool room = false;   // takes the room of its pointers (codegen/cpp/room.py; its library says)
  std::string name;
  int32_t index = 0;   // the plan step's, for messages
};

using NativeOp = void (*)(torch::jit::Stack&);

struct Program::Call {
  std::optional<c10::OperatorHandle> op;   // an ATen operator, or
  NativeOp native = nullptr;               // one of aotc's own ops (aotc::...)
  std::vector<Filler> stack;
  std::vector<int32_t> out;
  bool single = true;
  std::vector<spec::Bind> binds;           // sizes its results define, checked and then bound
};

struct Program::Instr {
  spec::Step::Kind kind = spec::Step::Kind::Free;
  int32_t index = 0;
  std::string name;
  Kernel kernel;
  Call call;
  std::vector<int32_t> free;
};

// binds.cpp
bool bind_sizes(const Program::Call& c, const std::vector<c10::IValue>& regs,
                std::vector<int64_t>& syms, const std::vector<std::vector<int64_t>>& exprs,
                const std::vector<int32_t>& stage, int32_t& done, int64_t* ev, RunResult& r);

// call.cpp
Program::Call resolve_call(const spec::Step& s, const c10::Device& device, int32_t slots,
                           size_t exprs);
at::ScalarType dtype_named(const std::string& name, const std::string& where);
std::string dtype_name(at::ScalarType t);   // the plan's name of a dtype ("float32")
constexpr size_t kMaxKernelArgs = 128;
int call_kernel(intptr_t fn, const uint64_t* args, size_t n);

// room.cpp: the elements from `t`'s first one to the end of its storage, and the
// ArtifactError of kernel `k` that returned `code` (-1 - i) with room array `room`
int64_t storage_room(const at::Tensor& t);
[[noreturn]] void room_failed(const Program::Kernel& k, int code, const int64_t* room);

}  // namespace aotc
