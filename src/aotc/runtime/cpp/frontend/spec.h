// A runner file (runner/<entry>.json, runtime/runner_file.py) read into the plan runner's spec.
//
// Every field is read through json::Field (typed, bounded, named in errors); every tag, step
// kind, dtype and op comes from a fixed table (the ops: artifact/schema/extern_ops.txt, built
// into this library, and aotc's own ops, which the runner refuses unless it implements them);
// kernels are resolved through the library's table (a CUDA artifact's: its launch specs) with
// their signature checked; then Program
// and Guards check the spec again.
#pragma once

#include <string>
#include <vector>

#include "../guards.h"
#include "../program.h"
#include "json.h"

namespace aotc::fe {

class Kernels;

// What guard errors quote (runtime/guards.py's messages).
struct GuardTexts {
  std::vector<std::string> symbols;      // symbol names, in the guards' order
  std::vector<std::string> exprs;        // each expression's text
  std::vector<std::string> input_names, input_specs;   // "x", "float32[batch, 64]"
};

struct ConstantRef {      // a weight or state slot, bound by name at load
  int32_t slot = 0;
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;    // stored shape (-1: not checked)
  std::string transform;         // weights: "", "transpose", "channels_last"
};

struct EntrySpec {
  spec::Program program;         // constants still to bind (`weights`, `state`)
  spec::Guards guards;
  GuardTexts texts;
  std::vector<ConstantRef> weights, state;
  std::vector<std::string> symbols;   // the plan's symbols, in its order
};

// `lib`: the artifact's kernels, or null (an extern-only artifact); `device`: the artifact's
// device type ("cpu", "cuda"), which the guards must name.
EntrySpec read_runner_file(const json::Value& doc, const std::string& file,
                           const std::string& entry, const Kernels* lib, const std::string& device);

bool allowed_op(const std::string& qualname);   // "aten::mm.default"

}  // namespace aotc::fe
