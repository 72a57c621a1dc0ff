// The room check of C++ kernels (codegen/cpp/room.py): what the runner gives, and the error
// for a kernel that refused its call.
#include <algorithm>
#include <string>

#include "include/aotc/errors.h"
#include "instr.h"

namespace aotc {

// The elements from `t`'s first one to the end of its storage (runtime/room.py).
int64_t storage_room(const at::Tensor& t) {
  if (!t.has_storage() || t.element_size() == 0) return 0;
  int64_t n = int64_t(t.storage().nbytes()) / int64_t(t.element_size()) - t.storage_offset();
  return std::max<int64_t>(n, 0);
}

// A kernel that refused its call (returned -1 - i): pointer i has less room than it indexes.
[[noreturn]] void room_failed(const Program::Kernel& k, int code, const int64_t* room) {
  size_t n = k.args.size() + k.outs.size(), i = size_t(-1 - int64_t(code));
  std::string where = "plan step " + std::to_string(k.index) + " (kernel " + k.name + ")";
  if (code >= 0 || i >= n)
    throw ArtifactError("kernel " + k.name + " returned a code it does not define", where,
                        "0, an index error code or -1..-" + std::to_string(n),
                        std::to_string(code), "re-export the model");
  bool reads = i < k.args.size();
  int32_t slot = reads ? k.args[i].slot : k.outs[i - k.args.size()].slot;
  throw ArtifactError("kernel " + k.name + (reads ? " reads" : " writes") + " more of slot " +
                          std::to_string(slot) + " than the plan gives it",
                      where + ", slot " + std::to_string(slot),
                      "room for " + std::to_string(room[n + i]) + " elements",
                      std::to_string(room[i]) + " elements",
                      "re-export the model (the plan's slots disagree with its kernels)");
}

}  // namespace aotc
