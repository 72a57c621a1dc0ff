// concurrent ART: one aotc::Module called from 4 threads at once, each on its own inputs, must
// give each call the outputs a lone call gives (bitwise); prints "ok" and exits 0 if so.
#include <aotc/module.h>
#include <ATen/ATen.h>

#include <atomic>
#include <iostream>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  aotc::Module m(argv[1]);
  std::vector<std::vector<at::Tensor>> inputs, want;
  for (int t = 0; t < 4; ++t) {
    inputs.push_back(m.example_inputs());
    want.push_back(m.forward(inputs.back()));
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto out = m.forward(inputs[t]);
        for (size_t k = 0; k < out.size(); ++k) bad += !at::equal(out[k], want[t][k]);
      }
    });
  for (auto& th : threads) th.join();
  std::cout << (bad ? "mismatch" : "ok") << "\n";
  return bad ? 1 : 0;
}
