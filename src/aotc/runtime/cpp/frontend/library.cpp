// The kernel library of a CPU artifact (native.h; runtime/native.py's rules in C++).
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "native.h"

namespace aotc::fe {

namespace {

struct TableEntry {   // codegen/cpp: aotc_kernel_table's entries
  const char* name;
  void* fn;
  int nargs;
  int nsizes;
  const char* types;
};

// Libraries a kernel library links (OpenMP, the C++ runtime), kept loaded once it used them,
// so closing it never unloads an OpenMP runtime whose threads still exist.
void pin_runtime_libs() {
  for (const char* name : {"libgomp.so.1", "libomp.so", "libiomp5.so", "libstdc++.so.6", "libgcc_s.so.1"})
    ::dlopen(name, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

std::mutex close_lock;

void write_all(int fd, const Bytes& b) {
  for (size_t done = 0; done < b.size;) {
    ssize_t n = ::write(fd, b.data + done, b.size - done);
    if (n <= 0) throw ArtifactError("cannot copy the kernel library to memory", "memfd",
                                    "a writable memfd", std::strerror(errno), "check memory limits");
    done += size_t(n);
  }
}

// A sealed memfd holding the library's verified bytes: (fd, the path to dlopen).
std::pair<int, std::string> private_copy(const Bytes& b) {
  int fd = ::memfd_create("aotc-kernels", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    throw ArtifactError("no private place to load the kernel library from", "memfd_create",
                        "an executable memfd", std::strerror(errno),
                        "load the artifact from Python (aotc.load), which falls back to a private file");
  try {
    write_all(fd, b);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
  return {fd, "/proc/self/fd/" + std::to_string(fd)};
}

}  // namespace

KernelLibrary::KernelLibrary(const Artifact& art,
                             const std::vector<std::pair<std::string, std::string>>& levels,
                             const std::string& wanted, bool table) {
  level_ = pick_level(levels, wanted);
  for (const auto& [level, file] : levels)
    if (level == level_) file_ = file;
  auto bytes = art.read(file_);
  std::tie(fd_, path_) = private_copy(*bytes);
  handle_ = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* err = ::dlerror();
    ::close(fd_);
    throw ArtifactError("the artifact's kernel library cannot be loaded", art.where(file_),
                        "a shared library for this host", err ? std::string(err).substr(0, 300) : "",
                        "re-export the model on this host");
  }
  pin_runtime_libs();
  set_threads_ = own("aotc_set_num_threads");
  // format <= 4 only: such artifacts have no runner file (a library with a table is read
  // through it whatever the manifest says: its entries carry checks a plan must not skip)
  if (!table && !own("aotc_kernel_table")) return;
  using Get = const TableEntry* (*)(int*);
  auto get = reinterpret_cast<Get>(own("aotc_kernel_table"));
  if (!get)
    throw ArtifactError("the kernel library has no kernel table", art.where(file_),
                        "aotc_kernel_table", "no such symbol in the library", "re-export the model");
  int n = 0;
  const TableEntry* e = get(&n);
  for (int i = 0; i < std::min(n, 1 << 20); ++i)
    if (e[i].name)
      table_[e[i].name] = {reinterpret_cast<intptr_t>(e[i].fn), e[i].nargs, e[i].nsizes,
                           e[i].types ? e[i].types : ""};
  for (auto& [name, entry] : table_) {   // ";room": the kernel takes the room of its pointers
    std::string& types = std::get<3>(entry);
    const std::string mark = ";room";
    if (types.size() >= mark.size() && types.compare(types.size() - mark.size(), mark.size(), mark) == 0)
      types.resize(types.size() - mark.size()), room_.insert(name);
  }
}

KernelLibrary::~KernelLibrary() {
  std::lock_guard<std::mutex> hold(close_lock);
  if (handle_) ::dlclose(handle_);
  // still mapped (dlclose may keep it): the memfd stays open, so no later load reuses its name
  if (void* again = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    ::dlclose(again);
    return;
  }
  if (fd_ >= 0) ::close(fd_);
}

// The address of `symbol` if this library itself defines it (0 otherwise).
intptr_t KernelLibrary::own(const char* symbol) const {
  void* addr = ::dlsym(handle_, symbol);
  Dl_info info;
  if (!addr || !::dladdr(addr, &info) || !info.dli_fname || path_ != info.dli_fname) return 0;
  return reinterpret_cast<intptr_t>(addr);
}

intptr_t KernelLibrary::kernel(const std::string& name, int nargs, int nsizes,
                               const std::string& types, const std::string& where) const {
  auto it = table_.find(name);
  if (it == table_.end())
    throw ArtifactError("the plan calls kernel " + name + ", which the kernel library lacks",
                        where, "a kernel of the library's table", name, "re-export the model");
  const auto& [addr, want_args, want_sizes, want_types] = it->second;
  if (want_args != nargs || want_sizes != nsizes || want_types != types)
    throw ArtifactError("the plan calls kernel " + name + " with arguments its library does not take",
                        where, std::to_string(want_args) + " pointers (" + want_types + "), " +
                        std::to_string(want_sizes) + " sizes",
                        std::to_string(nargs) + " pointers (" + types + "), " + std::to_string(nsizes) +
                        " sizes", "re-export the model (plan and library do not match)");
  return addr;
}

void KernelLibrary::bind(spec::Step& s, int nargs, int nsizes, const std::string& types,
                         const std::string& where) const {
  if (!s.grid.empty())
    throw ArtifactError("kernel step " + s.name + " carries a launch, which C++ kernels do not take",
                        where, "[kernel, index, name, signature, args, outs, sizes]",
                        "a launch (a CUDA artifact's step)", "re-export the model");
  s.fn = kernel(s.name, nargs, nsizes, types, where);
  s.room = room_.count(s.name) > 0;
}

}  // namespace aotc::fe
