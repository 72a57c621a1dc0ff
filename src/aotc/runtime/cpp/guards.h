// Guards in C++: the checks an entry's inputs must pass (runtime/guards.py), on the fast path.
//
// `bind` checks what runtime/guards.py `Guards.check` checks, in the same order: the input
// count; per input a dense strided tensor (not nested, quantized or meta) of the dtype, device
// type and rank declared, each dim its static size, the size its symbol has elsewhere, or its
// derived expression's value; the symbols' ranges; the relations. It says only whether they
// hold: a call that fails one is checked again by the Python guards, which raise the
// GuardError that names the input, the dim, the expected and the given value, so the messages
// come from one place. An expression that fails to evaluate (a division by zero) is a failed
// check too, decided again the same way.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace aotc {

namespace spec {

struct GuardDim {
  enum class Kind : uint8_t { Static, Symbol, Derived };
  Kind kind = Kind::Static;
  int64_t value = 0;   // Static: the size; Symbol: its index; Derived: its expression
};

struct GuardInput {
  std::string dtype;
  std::vector<GuardDim> dims;
};

struct Guards {
  int32_t symbols = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges;   // per symbol: min, max
  std::vector<std::vector<int64_t>> exprs;           // expr.h bytecode
  std::vector<int32_t> relations;                    // expressions that must be true
  std::vector<GuardInput> inputs;
  std::vector<int32_t> plan_symbols;   // per symbol of the plan, in its order: the symbol
  std::string device = "cpu";
};

}  // namespace spec

class Guards {
 public:
  explicit Guards(spec::Guards spec);
  // The plan's symbols read from `inputs` (all checked, or with check=false only read); false
  // where a check fails or a symbol cannot be read.
  bool bind(const std::vector<at::Tensor>& inputs, bool check, std::vector<int64_t>& out) const;

 private:
  bool check_input(const at::Tensor& t, size_t i, std::vector<int64_t>& syms,
                   std::vector<char>& bound) const;

  spec::Guards s_;
  bool decided_in_python_ = false;   // an expression reads a symbol no input dim binds
  std::vector<at::ScalarType> dtypes_;
  c10::DeviceType device_;
};

}  // namespace aotc
