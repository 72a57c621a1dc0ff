// generate ART IDS.safetensors N [--no-cuda-graph]: greedy decoding with a generator artifact's
// entries, prefill then N - 1 decode steps (their KV cache is the module's state, updated in
// place; on a GPU, decode replays a CUDA graph unless --no-cuda-graph); prints the N new tokens
// of each row, one row per line, and on stderr each entry's graph status and the mean time of a
// decode step after the first (which captures the graph). The next token is the plan's own greedy
// token (format 18: flat output 1, int64 [batch, 1]) where the entry returns one, else the
// logits' argmax.
#include <aotc/module.h>
#include <ATen/ATen.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <iostream>

at::Tensor next_token(const std::vector<at::Tensor>& outputs) {
  if (outputs.size() > 1 && outputs[1].scalar_type() == at::kLong && outputs[1].dim() == 2 &&
      outputs[1].size(1) == 1)
    return outputs[1];
  const at::Tensor& logits = outputs.at(0);
  at::Tensor last = logits.dim() == 3 ? logits.select(1, -1) : logits.reshape({logits.size(0), -1});
  return last.argmax(-1).reshape({-1, 1});
}

int main(int argc, char** argv) try {
  if (argc != 4 && argc != 5) return 2;
  aotc::LoadOptions options;
  if (argc == 5 && std::string(argv[4]) == "--no-cuda-graph") options.cuda_graph = aotc::LoadOptions::Graphs::Off;
  aotc::Module m(argv[1], options);
  at::Tensor ids = aotc::load_tensors(argv[2]).at(0).to(m.device());
  std::vector<at::Tensor> tokens{next_token(m.run("prefill", {ids}))};
  auto sync = [&] {
    if (!m.device().is_cpu()) c10::impl::getDeviceGuardImpl(m.device().type())->synchronizeDevice(m.device().index());
  };
  auto step = [&] { tokens.push_back(next_token(m.run("decode", {tokens.back()}))); };
  int steps = std::atoi(argv[3]) - 2;   // timed: the decode steps after the first (a capture)
  if (steps >= 0) step();
  sync();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  sync();
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  at::Tensor all = at::cat(tokens, 1).cpu();
  for (const auto& [entry, status] : m.graph_status()) std::cerr << "graph " << entry << ": " << status << "\n";
  if (steps > 0) std::cerr << "decode_us_per_step " << us / steps << "\n";
  for (int64_t r = 0; r < all.size(0); ++r) {
    for (int64_t k = 0; k < all.size(1); ++k) std::cout << all[r][k].item<int64_t>() << " ";
    std::cout << "\n";
  }
} catch (const aotc::AotcError& e) {
  std::cerr << e.kind() << ": " << e.what() << "\n";
  return e.exit_code();
}
