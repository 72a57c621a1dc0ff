// aotc's C++ plan runner: one entry's plan, already parsed and validated, as a compact
// instruction list that runs with no per-step interpretation cost beyond a switch.
//
// Both front ends build a ProgramSpec from a plan the schema has checked (artifact/schema in
// Python; runtime/cpp_runner.py turns the typed plan into this spec) and hand it to Program,
// which checks every index, expression and op again before anything runs: a spec names only
// slots below its slot count, symbols below its symbol count, expressions that evaluate on a
// bounded stack, ATen operators the dispatcher knows, with arguments their schemas take.
// Generated kernels are called through the addresses the kernel library's own table gave
// (checked against the plan by the caller); extern ops go through the ATen dispatcher, their
// operator handles and constant arguments resolved once, here.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "launch.h"

namespace aotc {

// A spec the runner refuses (a broken plan): what was expected, and where (the step); the
// Python front end turns it into an ArtifactError.
class SpecError : public std::runtime_error {
 public:
  SpecError(const std::string& expected, std::string where)
      : std::runtime_error(where + ": expected " + expected), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

// A spec the runner cannot run although it is sound (an argument type it does not handle):
// the caller runs that plan with its other runner.
class Unsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace spec {

// One dimension of a shape or stride: a constant, or the value of expression `expr`.
struct Dim {
  int64_t value = 0;
  int32_t expr = -1;
};

// An argument of an ATen call as the plan gives it.
struct Arg {
  enum class Kind : uint8_t { None, Bool, Int, Float, String, Slot, Sym, List, DType, Layout,
                              MemoryFormat, Device };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;        // Int, Slot, Sym (expression index)
  double f = 0;
  std::string s;        // String; DType, Layout, MemoryFormat by name
  std::vector<Arg> items;
};

struct KernelArg {
  int32_t slot = 0;
  bool lay_out = false;  // give the tensor the strides the kernel was compiled for
  bool contiguous = true;
  std::vector<Dim> stride;
  std::vector<Dim> shape;  // with dtype (non-empty): what a laid-out argument must be, since
  std::string dtype;       // the kernel indexes it by the plan's shape (an ATen result, a view)
  at::ScalarType scalar = at::ScalarType::Undefined;   // dtype's, set when the kernel is built
};

struct KernelOut {
  int32_t slot = 0;
  std::string dtype;
  std::vector<Dim> shape, stride;
  bool contiguous = true;
  int32_t donor = -1;    // take over this dead slot's storage
  bool donor_view = false;  // both contiguous: a view; else as_strided
};

// A size symbol a call's result defines (a value-dependent size, artifact/schema/plan.py Bind):
// dim `dim` of result `out` (-1: the result is the integer), checked against [lo, hi].
struct Bind {
  int32_t symbol = 0;
  int32_t out = 0;
  int32_t dim = -1;
  int64_t lo = 0, hi = 0;
};

struct Step {
  enum class Kind : uint8_t { Kernel, Call, Free };
  Kind kind = Kind::Free;
  int32_t index = 0;     // position in the plan, for messages
  // Kernel
  std::string name;
  intptr_t fn = 0;
  std::vector<KernelArg> args;
  std::vector<KernelOut> outs;
  std::vector<int32_t> sizes;   // symbol indices passed after the pointers
  // a Triton kernel (CUDA artifacts; fn is 0): its launcher, its grid's three dims, and the
  // code it stores into the plan's error flag for an index out of range (0: it checks none)
  std::shared_ptr<const Launcher> launcher;
  std::vector<Dim> grid;
  std::vector<Dim> extents;     // elements it indexes past each pointer (format >= 19; empty:
                                // unchecked), its launch spec's: checked against the room
  int32_t error_code = 0;
  bool room = false;   // a C++ kernel that takes the room of its pointers (its library's table)
  // Call
  std::string op, overload;
  std::vector<Arg> call_args;
  std::vector<std::pair<std::string, Arg>> kwargs;
  std::vector<int32_t> out;     // -1: result dropped
  bool single = true;
  bool fold = false;            // of constants only: called once, at load (runtime/folding.py)
  std::vector<Bind> binds;      // sizes its results define: the plan's last symbols
  // Free
  std::vector<int32_t> slots;
};

struct Output {
  int32_t slot = -1;
  c10::IValue constant;
  bool copy = false;   // a constant computed at load: each call returns a copy of its own
};

struct Program {
  std::string entry;
  int32_t slots = 0;
  int32_t symbols = 0;   // the inputs' symbols, then those calls bind (Step::binds)
  std::vector<std::vector<int64_t>> exprs;   // expression bytecode (expr.h)
  std::vector<std::pair<int32_t, c10::IValue>> constants;   // weights, state, folded views
  std::vector<int32_t> varying;   // constants whose values change between calls (state, a
                                  // training step's weights): nothing reading them is folded
  std::vector<int32_t> inputs;
  std::vector<Step> steps;
  std::vector<Output> outputs;
  c10::Device device = c10::Device(c10::kCPU);
  intptr_t set_threads = 0;   // the kernel library's aotc_set_num_threads, if it has one
};

}  // namespace spec

struct RunResult {
  std::vector<c10::IValue> outputs;
  int32_t failed_step = -1;             // a kernel met an index out of range
  std::vector<c10::IValue> failed_args; // that kernel's arguments, for the error message
  at::Tensor flag;                      // the error flag, when its read was deferred
  int32_t failed_symbol = -1;           // or: a size failed_step bound is out of its range
  int64_t failed_value = 0;
};

class Program {
 public:
  explicit Program(spec::Program spec);
  ~Program();
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  // `inputs` are moved into the registers, so a caller that hands them over lets the plan's
  // free steps release them; `symbols` in the spec's symbol order, all but those the plan's
  // calls bind (the last bound() symbols). A plan whose Triton kernels
  // check indices reads its error flag after its last step (one 4-byte read), unless
  // `read_flag` is false (inside a CUDA graph capture): the result then holds the flag, and
  // failed_step(code) names the step that stored a code.
  RunResult run(std::vector<c10::IValue> inputs, c10::ArrayRef<int64_t> symbols,
                bool read_flag = true) const;
  int32_t failed_step(int32_t code) const;
  const std::string& entry() const { return entry_; }
  int32_t bound() const { return bound_; }

  struct Filler;
  struct Kernel;
  struct Call;
  struct Instr;

 private:
  void fold(const Call& c, std::vector<c10::IValue>& fixed, std::vector<char>& computed);
  bool fold_kernel(Kernel& k, std::vector<c10::IValue>& fixed, const std::vector<char>& varying,
                   std::vector<char>& computed, const std::string& where);
  void lay_out_constants(Kernel& k, const std::vector<c10::IValue>& fixed,
                         const std::string& where);
  static void bind_constants(Filler& f, const std::vector<c10::IValue>& fixed);

  std::string entry_;
  void order_binds(const std::vector<spec::Step>& steps, const std::string& where);
  void check_stages(const spec::Step& s, int32_t done) const;

  int32_t slots_ = 0, symbols_ = 0;
  int32_t bound_ = 0;                 // symbols the calls bind: the last ones
  std::vector<int32_t> order_;        // per symbol: 0 (an input's), or which bind defines it
  std::vector<int32_t> stage_;        // per expression: the last bind it needs (0: none)
  std::vector<std::vector<int64_t>> exprs_;
  std::vector<int32_t> inputs_;
  std::vector<Instr> code_;
  std::vector<spec::Output> outputs_;
  c10::Device device_;
  intptr_t set_threads_ = 0;
  std::vector<std::pair<int32_t, int32_t>> codes_;   // (error code, step index)
};

}  // namespace aotc
