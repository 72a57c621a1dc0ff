// generate ART IDS.safetensors N: greedy decoding with a generator artifact's entries, prefill
// then N - 1 decode steps (their KV cache is the module's state, updated in place); prints the
// N new tokens of each row, one row per line.
#include <aotc/module.h>
#include <ATen/ATen.h>

#include <iostream>

at::Tensor next_token(const at::Tensor& logits) {
  at::Tensor last = logits.dim() == 3 ? logits.select(1, -1) : logits.reshape({logits.size(0), -1});
  return last.argmax(-1).reshape({-1, 1});
}

int main(int argc, char** argv) try {
  if (argc != 4) return 2;
  aotc::Module m(argv[1]);
  at::Tensor ids = aotc::load_tensors(argv[2]).at(0);
  std::vector<at::Tensor> tokens{next_token(m.run("prefill", {ids}).at(0))};
  for (int i = 1; i < std::atoi(argv[3]); ++i) tokens.push_back(next_token(m.run("decode", {tokens.back()}).at(0)));
  at::Tensor all = at::cat(tokens, 1);
  for (int64_t r = 0; r < all.size(0); ++r) {
    for (int64_t k = 0; k < all.size(1); ++k) std::cout << all[r][k].item<int64_t>() << " ";
    std::cout << "\n";
  }
} catch (const aotc::AotcError& e) {
  std::cerr << e.kind() << ": " << e.what() << "\n";
  return e.exit_code();
}
