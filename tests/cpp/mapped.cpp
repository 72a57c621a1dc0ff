// mapped ART: load ART and run its forward entry once on example inputs, then print each
// file-backed mapping of this process as "OFFSET PATH" (from /proc/self/maps): what a test
// needs to see that a package is read in place (its weights mapped from the package's file at
// their offsets, the kernel library loaded from a memfd, no other file of the artifact).
#include <aotc/module.h>
#include <ATen/ATen.h>

#include <fstream>
#include <iostream>
#include <sstream>

int main(int argc, char** argv) try {
  if (argc != 2) return 2;
  aotc::Module m(argv[1]);
  m.forward(m.example_inputs());
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    fields >> range >> perms >> offset >> dev >> inode;
    std::getline(fields >> std::ws, path);
    if (!path.empty() && path[0] == '/') std::cout << std::stoull(offset, nullptr, 16) << " " << path << "\n";
  }
} catch (const aotc::AotcError& e) {
  std::cerr << e.kind() << ": " << e.what() << "\n";
  return e.exit_code();
}
