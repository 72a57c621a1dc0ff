// aotc::Module: an aotc artifact loaded and run from C++, with no Python.
//
//   aotc::Module m("mlp.aotc");
//   std::vector<at::Tensor> out = m.forward({torch::randn({32, 64})});
//
// The path is an artifact directory or a package (`aotc pack`), read in place: its layout
// checked as artifact/package.py checks it, its weights mapped from the package at their
// offsets, nothing written to disk. Loading checks what the Python runtime checks (README, "A
// C++ front end"): the manifest's self-hash and format, the size and sha256 of every file it
// lists (weights hashed from the mapping they are served from), the target (a CPU level this
// host has, or for a CUDA artifact the cubins of this GPU's arch and their launch specs), the kernel library's own table against every kernel step, a
// signature by a trusted key where any is trusted (LoadOptions.trusted_keys; signatures.json,
// a package's member or a directory's file), and each entry's runner file (runner/<entry>.json,
// format >= 10) field by field, before the plan runner, shared with the Python front end,
// checks its spec again. Calls check the guards and raise the GuardError Python raises, with
// the same message. Concurrent calls of `forward` / `run` on one Module are safe (calls of one
// entry that replay a CUDA graph take turns: they share its buffers). Errors are the classes
// of aotc/errors.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aotc/errors.h"

namespace aotc {

struct LoadOptions {
  bool verify_hashes = true;   // false: sizes only (as aotc.load(verify_hashes=False))
  bool check_guards = true;    // false: symbols still bound from the input sizes
  std::string isa;             // the CPU level to load; empty: the best this CPU supports
  // The device to run on: empty for the artifact's own ("cpu", or GPU 0 for a CUDA artifact),
  // or "cuda:N". A CUDA artifact (format >= 14) needs an NVIDIA driver and torch built for CUDA;
  // its cubins for this GPU's arch are loaded into the device's primary context and launched on
  // torch's current stream.
  std::string device;
  // Ed25519 public keys, as aotc.load(trusted_keys=...) takes them: paths of key files, PEM
  // text, base64 of the 32 raw bytes, or the 32 bytes. With any key trusted here or in
  // AOTC_TRUSTED_KEYS (key files and directories of *.pub / *.pem, separated by ':'), a valid
  // signature by one of them (`aotc sign`) is required, checked before anything but the
  // manifest is read: an ArtifactError where there is none, a UsageError for a key that is
  // no Ed25519 public key. Not given (nullopt) and AOTC_TRUSTED_KEYS unset: no signature is
  // required. Given but empty (or AOTC_TRUSTED_KEYS naming no key file): every load is an
  // ArtifactError, found "no usable key" (the policy fails closed).
  std::optional<std::vector<std::string>> trusted_keys;
  // CUDA graphs, as aotc.load(cuda_graph=...): on a GPU each entry's plan is captured once per
  // set of input sizes (a static entry on its first call, one with dynamic dims on the second
  // call with those sizes, `cuda_graph_cache` kept per entry) and replayed with one launch per
  // call, after checking a replay against a plain run; outputs are copies, never overwritten by
  // a later call. Auto does so where it can (Module::graph_status() says why an entry does
  // not), Off never, On insists: a UsageError off a GPU, a TargetError where this runtime was
  // built without CUDA graphs (no CUDA torch or CUDA headers at install time).
  enum class Graphs { Auto, Off, On };
  Graphs cuda_graph = Graphs::Auto;
  int cuda_graph_cache = 8;
};

class Module {
 public:
  explicit Module(const std::string& path, const LoadOptions& options = {});
  ~Module();
  Module(Module&&) noexcept;
  Module& operator=(Module&&) noexcept;

  // The "forward" entry; outputs flat, in the manifest's order (a constant or integer output
  // comes back as a 0-d tensor, a None output as an undefined tensor).
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs) const;
  std::vector<at::Tensor> run(const std::string& entry,
                              const std::vector<at::Tensor>& inputs) const;

  // Inputs an entry's guards accept: random values (zeros for integer and bool inputs), each
  // dynamic dim at its symbol's lower bound (at least 1); for samples and smoke tests.
  std::vector<at::Tensor> example_inputs(const std::string& entry = "forward") const;

  std::vector<std::string> entries() const;
  // Per entry: "graph" (replays a CUDA graph), "pending" (captured on its first call; with
  // dynamic dims, on the second with the same sizes), "off" (LoadOptions or a CPU artifact),
  // or why it runs without one.
  std::map<std::string, std::string> graph_status() const;
  const std::string& level() const;     // the CPU level or GPU arch whose kernels run ("" if none)
  c10::Device device() const;           // where inputs go and outputs come from
  const std::string& signer() const;    // the key id of the trusted key that signed ("" if none)
  int format_version() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Tensors "0", "1", ... of a safetensors file, in that order (the file's header checked as
// an artifact's weights are), and the same written; for passing inputs and outputs around.
std::vector<at::Tensor> load_tensors(const std::string& path);
void save_tensors(const std::string& path, const std::vector<at::Tensor>& tensors);

}  // namespace aotc
