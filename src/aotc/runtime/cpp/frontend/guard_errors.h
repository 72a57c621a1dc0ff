// Guards with their error messages (guard_errors.cpp).
#pragma once

#include <vector>

#include "spec.h"

namespace aotc::fe {

// The plan's symbols (in its order) read from `inputs` once every guard holds; a GuardError
// with runtime/guards.py's message for the first one that does not.
std::vector<int64_t> check_inputs(const spec::Guards& g, const GuardTexts& t,
                                  const std::vector<at::Tensor>& inputs);

}  // namespace aotc::fe
