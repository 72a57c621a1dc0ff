// A CUDA artifact's kernels for the C++ front end (runtime/cuda.py's rules in C++).
//
// The cubins built for this GPU are chosen as runtime/cuda.py `select_arch` chooses them (the
// GPU's own arch, else below sm_90 the newest of its major version that is not newer than
// it); each kernel's launch spec (kernels/<name>.json, hashed like every file) is read field
// by field (what artifact/schema/launch.py requires, unknown fields refused) and its cubin,
// and the variant for sizes divisible by 16 where there is one, loaded from the verified
// bytes into the device's primary context (torch's), each distinct cubin once (the kernels of
// one shape share theirs). Every launch spec is read before the GPU is touched, so a malformed
// one is refused on any host. A runner file's kernel step binds only
// to a kernel whose launch spec declares the same buffers (count and dtypes), sizes and
// error code, and whose cubin takes exactly those parameters.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../launch.h"
#include "native.h"

namespace aotc::fe {

// A kernel's launcher as steps are bound to it while the artifact is read, pointed at its
// cubin once the cubins are loaded (CudaKernels::load).
class LateLauncher final : public Launcher {
 public:
  void launch(const std::array<int64_t, 3>& grid, c10::ArrayRef<at::Tensor> buffers,
              const at::Tensor& flag, c10::ArrayRef<int64_t> sizes) const override;
  std::shared_ptr<const Launcher> real;
};

class CudaKernels final : public Kernels {
 public:
  // Reads and checks every launch spec; `native`: the manifest's target.native (kind triton).
  CudaKernels(const Artifact& art, const json::Field& native);
  ~CudaKernels() override;
  CudaKernels(const CudaKernels&) = delete;
  CudaKernels& operator=(const CudaKernels&) = delete;

  void bind(spec::Step& s, int nargs, int nsizes, const std::string& types,
            const std::string& where) const override;
  // Chooses the arch for GPU `device` and loads its cubins (after every entry was bound, so
  // everything the artifact says is checked before the GPU is touched).
  void load(const Artifact& art, int32_t device);
  const std::string& arch() const { return arch_; }

  struct Kernel {
    std::string types;       // the buffers' dtypes, "float32,int64"
    int nbuffers = 0, nsizes = 0;
    int32_t error_code = 0;
    // format >= 19: per buffer, the elements the kernel indexes past its pointer where the
    // launch spec says a number (-1: an expression of sizes), which the runner file's must be
    bool has_extents = false;
    std::vector<int64_t> extents;
    std::shared_ptr<LateLauncher> launcher = std::make_shared<LateLauncher>();
  };
  struct Parsed;

 private:
  intptr_t context_ = 0;
  std::string arch_;
  std::vector<std::string> built_;
  std::vector<intptr_t> modules_;
  std::map<std::string, Kernel> kernels_;
  std::unique_ptr<Parsed> parsed_;
};

// The built arch whose cubins run on a GPU of arch `device` (runtime/cuda.py select_arch), or
// a TargetError.
std::string select_arch(const std::vector<std::string>& built, const std::string& device);

}  // namespace aotc::fe
