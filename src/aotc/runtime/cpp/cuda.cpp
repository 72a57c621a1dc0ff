// CudaLauncher (launch.h): cubins launched through the CUDA driver API, found at run time.
//
// The driver's few entry points are declared here with the driver's own C signatures (CUresult
// is an int, handles are pointers) and resolved from libcuda.so.1 on first use; torch's current
// stream comes from torch's ABI-stable C shim (aoti_torch_get_current_cuda_stream, in
// libtorch_cuda.so, which a CUDA build of torch has loaded). Nothing here needs CUDA headers.
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>

#include "include/aotc/errors.h"
#include "launch.h"

namespace aotc {

namespace {

using CUresult = int;
using Handle = void*;

// CUlaunchAttribute and CUlaunchConfig of cuLaunchKernelEx (cuda.h, CUDA 11.8+).
struct LaunchAttribute {
  int id;
  char pad[4];
  int value;
  char rest[60];
};
struct LaunchConfig {
  unsigned grid[3], block[3], shared;
  Handle stream;
  LaunchAttribute* attrs;
  unsigned count;
};
constexpr int kProgrammaticStreamSerialization = 6;

struct Driver {
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*device_get)(int*, int) = nullptr;
  CUresult (*device_attribute)(int*, int, int) = nullptr;
  CUresult (*primary_retain)(Handle*, int) = nullptr;
  CUresult (*module_load)(Handle*, const void*) = nullptr;
  CUresult (*module_function)(Handle*, Handle, const char*) = nullptr;
  CUresult (*module_unload)(Handle) = nullptr;
  CUresult (*function_attribute)(Handle, int, int) = nullptr;
  CUresult (*ctx_get_current)(Handle*) = nullptr;
  CUresult (*ctx_set_current)(Handle) = nullptr;
  CUresult (*launch)(Handle, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, Handle, void**, void**) = nullptr;
  CUresult (*launch_ex)(const LaunchConfig*, Handle, void**, void**) = nullptr;
  int (*current_stream)(int32_t, void**) = nullptr;   // torch's shim; 0 is success
  std::string missing, detail;   // why the driver cannot be used (or empty), and what failed

  void check(const std::string& what, CUresult status) const {
    if (status == 0) return;
    const char* name = nullptr;
    if (get_error_name) get_error_name(status, &name);
    throw std::runtime_error("CUDA driver call " + what + " failed: " +
                             (name ? std::string(name) : std::to_string(status)));
  }
};

template <typename F>
void bind(void* lib, const char* symbol, F& out) {
  out = reinterpret_cast<F>(dlsym(lib, symbol));
}

Driver load_driver() {
  Driver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    d.missing = "the CUDA driver (libcuda.so.1) cannot be loaded";
    d.detail = why ? std::string(why).substr(0, 300) : "no libcuda.so.1";
    return d;
  }
  bind(lib, "cuGetErrorName", d.get_error_name);
  bind(lib, "cuDeviceGet", d.device_get);
  bind(lib, "cuDeviceGetAttribute", d.device_attribute);
  bind(lib, "cuDevicePrimaryCtxRetain", d.primary_retain);
  bind(lib, "cuModuleLoadData", d.module_load);
  bind(lib, "cuModuleGetFunction", d.module_function);
  bind(lib, "cuModuleUnload", d.module_unload);
  bind(lib, "cuFuncSetAttribute", d.function_attribute);
  CUresult (*init)(unsigned) = nullptr;
  bind(lib, "cuInit", init);
  bind(lib, "cuCtxGetCurrent", d.ctx_get_current);
  bind(lib, "cuCtxSetCurrent", d.ctx_set_current);
  bind(lib, "cuLaunchKernel", d.launch);
  bind(lib, "cuLaunchKernelEx", d.launch_ex);   // optional: drivers of CUDA 11.8 and newer
  void* torch_cuda = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  bind(torch_cuda ? torch_cuda : RTLD_DEFAULT, "aoti_torch_get_current_cuda_stream",
       d.current_stream);
  if (!init || !d.ctx_get_current || !d.ctx_set_current || !d.launch || !d.device_get ||
      !d.device_attribute || !d.primary_retain || !d.module_load || !d.module_function ||
      !d.module_unload || !d.function_attribute)
    d.missing = "libcuda.so.1 lacks an entry point aotc calls (a driver older than CUDA 11)";
  else if (init(0) != 0)
    d.missing = "the CUDA driver does not initialise (cuInit failed: no GPU visible?)";
  else if (!d.current_stream)
    d.missing = "this torch has no CUDA (aoti_torch_get_current_cuda_stream not found)";
  return d;
}

const Driver& driver() {
  static const Driver d = load_driver();
  if (!d.missing.empty())
    throw TargetError(d.missing, "libcuda.so.1", "an NVIDIA driver and a CUDA build of torch",
                      d.detail.empty() ? d.missing : d.detail,
                      "run on a host with an NVIDIA GPU, its driver and torch for CUDA");
  return d;
}

void make_current(const Driver& d, intptr_t context) {
  Handle current = nullptr;
  d.check("cuCtxGetCurrent", d.ctx_get_current(&current));
  if (current != reinterpret_cast<Handle>(context))
    d.check("cuCtxSetCurrent", d.ctx_set_current(reinterpret_cast<Handle>(context)));
}

constexpr int kComputeMajor = 75, kComputeMinor = 76;   // CUdevice_attribute
constexpr int kMaxDynamicShared = 8;                     // CUfunction_attribute
constexpr int64_t kStaticSharedLimit = 48 * 1024;

class CudaLauncher final : public Launcher {
 public:
  explicit CudaLauncher(CudaKernelSpec s) : s_(std::move(s)), pdl_(s_.pdl && pdl_enabled()) {
    if (!s_.function) throw std::invalid_argument("kernel " + s_.name + ": no CUfunction");
    if (s_.pointers.size() != s_.inputs.size())
      throw std::invalid_argument("kernel " + s_.name + ": one input flag per parameter");
    for (int32_t i : s_.aligned)
      if (i < 0 || size_t(i) >= s_.pointers.size() || s_.pointers[i])
        throw std::invalid_argument("kernel " + s_.name + ": an aligned size parameter");
    for (const auto& sc : s_.scratch)
      if (sc.bytes < 0 || sc.align < 1 || (sc.align & (sc.align - 1)))
        throw std::invalid_argument("kernel " + s_.name + ": a scratch parameter");
  }

  void launch(const std::array<int64_t, 3>& grid, c10::ArrayRef<at::Tensor> buffers,
              const at::Tensor& flag, c10::ArrayRef<int64_t> sizes) const override;

 private:
  std::vector<uint64_t> values(const std::array<int64_t, 3>& grid,
                               c10::ArrayRef<at::Tensor> buffers, const at::Tensor& flag,
                               c10::ArrayRef<int64_t> sizes, std::vector<at::Tensor>& keep) const;
  void launch_on(Handle fn, int64_t shared, const std::array<int64_t, 3>& grid,
                 std::vector<uint64_t>& values) const;

  CudaKernelSpec s_;
  mutable std::atomic<bool> pdl_;   // cleared for good when the driver refuses the launch attribute
};

// The kernel's parameter values in order (pointers, sizes, scratch), as runtime/cuda.py packs
// them; `keep` holds the aligned copies and scratch buffers until the launch is queued (stream
// order keeps their memory valid until the kernel ran).
std::vector<uint64_t> CudaLauncher::values(const std::array<int64_t, 3>& grid,
                                           c10::ArrayRef<at::Tensor> buffers,
                                           const at::Tensor& flag, c10::ArrayRef<int64_t> sizes,
                                           std::vector<at::Tensor>& keep) const {
  std::vector<uint64_t> out;
  size_t b = 0, z = 0;
  for (size_t i = 0; i < s_.pointers.size(); ++i) {
    if (!s_.pointers[i]) {
      if (z >= sizes.size()) throw std::runtime_error("kernel " + s_.name + ": too few sizes");
      out.push_back(static_cast<uint64_t>(sizes[z++]));
      continue;
    }
    if (b > buffers.size() || (b == buffers.size() && !flag.defined()))
      throw std::runtime_error("kernel " + s_.name + " takes more buffers than the plan passes");
    const at::Tensor& t = b < buffers.size() ? buffers[b] : flag;
    ++b;
    if (!t.is_cuda())
      throw std::runtime_error("kernel " + s_.name + ": a buffer that is not a CUDA tensor");
    auto ptr = reinterpret_cast<uint64_t>(t.data_ptr());
    if (ptr % 16 && s_.inputs[i]) {   // kernels assume 16-byte aligned buffers
      keep.push_back(at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t));
      ptr = reinterpret_cast<uint64_t>(keep.back().data_ptr());
    }
    out.push_back(ptr);
  }
  if (b != buffers.size() + (flag.defined() ? 1 : 0) || z != sizes.size())
    throw std::runtime_error("kernel " + s_.name + " takes other arguments than the plan passes");
  int64_t programs = grid[0] * grid[1] * grid[2] * s_.ctas;
  for (const auto& sc : s_.scratch) {
    uint64_t ptr = 0;
    if (sc.bytes) {
      keep.push_back(at::empty({programs * sc.bytes + sc.align},
                               at::TensorOptions().dtype(at::kByte).device(at::kCUDA, s_.device)));
      auto base = reinterpret_cast<uint64_t>(keep.back().data_ptr());
      ptr = (base + sc.align - 1) / sc.align * sc.align;
    }
    out.push_back(ptr);
  }
  return out;
}

void CudaLauncher::launch(const std::array<int64_t, 3>& grid, c10::ArrayRef<at::Tensor> buffers,
                          const at::Tensor& flag, c10::ArrayRef<int64_t> sizes) const {
  for (int64_t g : grid)
    if (g < 0 || g > (int64_t(1) << 31) - 1)
      throw std::runtime_error("kernel " + s_.name + ": grid " + std::to_string(g) +
                               " out of the driver's range");
  if (grid[0] * grid[1] * grid[2] == 0) return;
  std::vector<at::Tensor> keep;
  std::vector<uint64_t> vals = values(grid, buffers, flag, sizes, keep);
  bool div16 = s_.div16_function != 0;
  for (int32_t i : s_.aligned) div16 = div16 && vals[i] % 16 == 0;
  launch_on(reinterpret_cast<Handle>(div16 ? s_.div16_function : s_.function),
            div16 ? s_.div16_shared : s_.shared, grid, vals);
}

void CudaLauncher::launch_on(Handle fn, int64_t shared, const std::array<int64_t, 3>& grid,
                             std::vector<uint64_t>& vals) const {
  const Driver& d = driver();
  make_current(d, s_.context);
  void* stream = nullptr;
  if (d.current_stream(s_.device, &stream) != 0)
    throw std::runtime_error("torch's current CUDA stream cannot be read");
  std::vector<void*> params(vals.size());
  for (size_t i = 0; i < vals.size(); ++i) params[i] = &vals[i];
  auto g = [&](int i) { return static_cast<unsigned>(grid[i]); };
  if (pdl_ && d.launch_ex) {
    LaunchAttribute attr{};
    attr.id = kProgrammaticStreamSerialization;
    attr.value = 1;
    LaunchConfig config{{g(0), g(1), g(2)}, {unsigned(s_.threads), 1, 1}, unsigned(shared),
                        stream, &attr, 1};
    if (d.launch_ex(&config, fn, params.data(), nullptr) == 0) return;
    pdl_ = false;   // a driver without the attribute: launch plainly from now on
  }
  d.check("cuLaunchKernel(" + s_.name + ")",
          d.launch(fn, g(0), g(1), g(2), unsigned(s_.threads), 1, 1, unsigned(shared), stream,
                   params.data(), nullptr));
}

}  // namespace

bool pdl_enabled() {
  const char* v = std::getenv("AOTC_CUDA_PDL");
  return !v || std::string(v) != "0";
}

std::shared_ptr<const Launcher> cuda_launcher(CudaKernelSpec spec) {
  return std::make_shared<CudaLauncher>(std::move(spec));
}

namespace {

int device_handle(const Driver& d, int32_t device) {
  int dev = 0;
  if (d.device_get(&dev, device) != 0)
    throw TargetError("there is no CUDA device " + std::to_string(device), "device",
                      "a visible GPU's index", std::to_string(device),
                      "pass a device this host has (see CUDA_VISIBLE_DEVICES)");
  return dev;
}

}  // namespace

std::string cuda_arch(int32_t device) {
  const Driver& d = driver();
  int dev = device_handle(d, device), major = 0, minor = 0;
  d.check("cuDeviceGetAttribute", d.device_attribute(&major, kComputeMajor, dev));
  d.check("cuDeviceGetAttribute", d.device_attribute(&minor, kComputeMinor, dev));
  return "sm_" + std::to_string(major) + std::to_string(minor);
}

intptr_t cuda_context(int32_t device) {
  const Driver& d = driver();
  Handle ctx = nullptr;
  d.check("cuDevicePrimaryCtxRetain", d.primary_retain(&ctx, device_handle(d, device)));
  make_current(d, reinterpret_cast<intptr_t>(ctx));
  return reinterpret_cast<intptr_t>(ctx);
}

CudaFunction cuda_load(intptr_t context, const void* image, const std::string& symbol,
                       int64_t shared) {
  const Driver& d = driver();
  make_current(d, context);
  Handle module = nullptr, fn = nullptr;
  d.check("cuModuleLoadData", d.module_load(&module, image));
  CUresult status = d.module_function(&fn, module, symbol.c_str());
  if (status == 0 && shared > kStaticSharedLimit)
    status = d.function_attribute(fn, kMaxDynamicShared, int(shared));
  if (status != 0) {
    d.module_unload(module);
    d.check("cuModuleGetFunction(" + symbol + ")", status);
  }
  return {reinterpret_cast<intptr_t>(module), reinterpret_cast<intptr_t>(fn)};
}

void cuda_unload(intptr_t context, intptr_t module) noexcept {
  try {
    const Driver& d = driver();
    make_current(d, context);
    d.module_unload(reinterpret_cast<Handle>(module));
  } catch (...) {   // at exit the driver may be gone
  }
}

}  // namespace aotc
