// Loading the pieces of an artifact the plan runner binds (the C++ front end):
//   - safetensors weights shards (artifact/weights.py's checks: header length inside the file,
//     dtypes from the fixed table, shapes bounded, each byte range inside the data, exactly as
//     long as its shape and dtype say, no two overlapping), served as tensors that are views
//     of the verified private mapping;
//   - the CPU kernel library (runtime/native.py): the best level this CPU supports (or the one
//     asked for), dlopen'ed from a sealed in-memory copy of its verified bytes, never from the
//     artifact's path; kernels found only through the library's own table, symbols looked up
//     by name only if this library itself defines them.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "../program.h"
#include "files.h"

namespace aotc::fe {

struct StoredTensor {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;   // offsets in the file
};

// {name: tensor} of one shard's header (offsets made absolute); ArtifactError if malformed.
std::map<std::string, StoredTensor> safetensors_header(const Bytes& b, const std::string& where);
at::Tensor stored_tensor(const std::shared_ptr<const Bytes>& b, const StoredTensor& t);
at::ScalarType dtype_of(const std::string& name, const json::Field& at);   // "float32", ...

// What a runner file's kernel steps are bound to: a CPU artifact's kernel library, or a CUDA
// artifact's cubins (cuda_kernels.h).
class Kernels {
 public:
  virtual ~Kernels() = default;
  // Bind step `s` (its name, and for a Triton kernel its grid and error code, read) to its
  // kernel, whose own record must say these counts and pointer dtypes; an ArtifactError else.
  virtual void bind(spec::Step& s, int nargs, int nsizes, const std::string& types,
                    const std::string& where) const = 0;
  virtual intptr_t set_threads() const { return 0; }
};

class KernelLibrary final : public Kernels {
 public:
  // `levels`: (level, file), lowest first; `wanted`: a level, or empty for the best one here.
  KernelLibrary(const Artifact& art, const std::vector<std::pair<std::string, std::string>>& levels,
                const std::string& wanted, bool table);
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  // The address of kernel `name`, whose table entry must say these counts and dtypes.
  intptr_t kernel(const std::string& name, int nargs, int nsizes, const std::string& types,
                  const std::string& where) const;
  void bind(spec::Step& s, int nargs, int nsizes, const std::string& types,
            const std::string& where) const override;
  intptr_t set_threads() const override { return set_threads_; }
  const std::string& level() const { return level_; }

 private:
  intptr_t own(const char* symbol) const;

  std::string level_, file_, path_;
  int fd_ = -1;
  void* handle_ = nullptr;
  intptr_t set_threads_ = 0;
  std::map<std::string, std::tuple<intptr_t, int, int, std::string>> table_;
  std::set<std::string> room_;   // kernels taking the room of their pointers
};

std::string pick_level(const std::vector<std::pair<std::string, std::string>>& levels,
                       const std::string& wanted);

}  // namespace aotc::fe
