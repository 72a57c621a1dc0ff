// Launchers of Triton kernels (CUDA artifacts) for the plan runner.
//
// A plan step that runs a Triton kernel hands its launcher the grid (evaluated per call from
// the launch spec's expressions), the kernel's buffers in parameter order (those read, then
// those written), the plan's error flag when the kernel checks indices, and its dim sizes.
// Two launchers exist:
//   - CudaLauncher (cuda.cpp): a cubin's function, launched through the CUDA driver API on
//     torch's current stream of the device, as runtime/cuda.py's CudaLauncher does: inputs not
//     16-byte aligned copied first, Triton's scratch parameters allocated per launch, the variant
//     built for sizes divisible by 16 chosen when they are, programmatic dependent launch for
//     cubins built for it. The driver (libcuda.so.1) and torch's stream are found at run time,
//     so the runner builds and runs without a GPU, CUDA headers or a CUDA build of torch.
//   - a launcher of the Python front end (python.cpp) that calls a Python callable: Triton's
//     interpreter running a CUDA artifact's kernels on the CPU (aotc.load(interpret=True)).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace aotc {

class Launcher {
 public:
  virtual ~Launcher() = default;
  // `buffers`: the kernel's tensors in parameter order; `flag`: the error flag or undefined.
  virtual void launch(const std::array<int64_t, 3>& grid, c10::ArrayRef<at::Tensor> buffers,
                      const at::Tensor& flag, c10::ArrayRef<int64_t> sizes) const = 0;
};

// What a CudaLauncher needs of one cubin (runtime/cuda.py CudaLauncher.runner_spec()).
struct CudaKernelSpec {
  struct Scratch {
    int64_t bytes = 0;   // per program
    int64_t align = 1;
  };
  std::string name;
  intptr_t function = 0;          // CUfunction, loaded by the front end
  int64_t shared = 0;             // dynamic shared memory bytes
  intptr_t div16_function = 0;    // the variant for sizes divisible by 16, or 0
  int64_t div16_shared = 0;
  std::vector<int32_t> aligned;   // parameters (user order) that variant needs divisible by 16
  int64_t threads = 128;
  int64_t ctas = 1;
  bool pdl = false;               // launch with programmatic stream serialization
  std::vector<bool> pointers;     // per user parameter: a buffer (else a size or the flag)
  std::vector<bool> inputs;       // per user parameter: a buffer the kernel reads
  std::vector<Scratch> scratch;   // the parameters Triton appends
  intptr_t context = 0;           // the device's primary context (CUcontext)
  int32_t device = 0;
};

std::shared_ptr<const Launcher> cuda_launcher(CudaKernelSpec spec);

// Loading cubins (the C++ front end; Python loads them through ctypes, runtime/cuda.py). Each
// throws a TargetError where there is no driver or no such device, std::runtime_error where a
// driver call fails.
std::string cuda_arch(int32_t device);         // "sm_90": the GPU's compute capability
intptr_t cuda_context(int32_t device);         // its primary context (torch's), made current
struct CudaFunction {
  intptr_t module = 0, function = 0;
};
// `image` loaded into `context` (cuModuleLoadData), its entry `symbol`, allowed `shared`
// bytes of dynamic shared memory.
CudaFunction cuda_load(intptr_t context, const void* image, const std::string& symbol,
                       int64_t shared);
void cuda_unload(intptr_t context, intptr_t module) noexcept;

// Whether programmatic dependent launch is on (AOTC_CUDA_PDL, as runtime/cuda.py reads it).
bool pdl_enabled();

}  // namespace aotc
