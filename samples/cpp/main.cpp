// aotc_run [--cuda-graph=on|off] ART [INPUTS.safetensors [OUTPUTS.safetensors]]: load an aotc
// artifact (a directory, or a package from `aotc pack`, read in place) with no Python, run its
// forward entry on random inputs (or on tensors "0", "1", ... of INPUTS), print the outputs and
// the load time and per-call latency (median of 100 calls after warm-up); with OUTPUTS, write
// the outputs there. A CUDA artifact runs on GPU 0 (inputs moved there, outputs back),
// replaying a CUDA graph where it can (--cuda-graph=off: never; on: insist).
#include <aotc/module.h>
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <chrono>
#include <iostream>

using Clock = std::chrono::steady_clock;
double us(Clock::time_point a) { return std::chrono::duration<double, std::micro>(Clock::now() - a).count(); }

int main(int argc, char** argv) try {
  aotc::LoadOptions options;
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--cuda-graph=on" || mode == "--cuda-graph=off") {
    options.cuda_graph = mode == "--cuda-graph=on" ? aotc::LoadOptions::Graphs::On : aotc::LoadOptions::Graphs::Off;
    --argc, ++argv;
  }
  if (argc < 2) return std::cerr << "usage: aotc_run [--cuda-graph=on|off] ART [INPUTS [OUTPUTS]]\n", 2;
  auto start = Clock::now();
  aotc::Module m(argv[1], options);
  double load = us(start);
  std::vector<at::Tensor> x = argc > 2 ? aotc::load_tensors(argv[2]) : m.example_inputs();
  for (auto& t : x) t = t.to(m.device());   // a CUDA artifact's inputs go to its GPU
  auto sync = [&] {   // a GPU runs calls asynchronously: wait for them to time them
    if (!m.device().is_cpu())
      c10::impl::getDeviceGuardImpl(m.device().type())->synchronizeDevice(m.device().index());
  };
  auto out = m.forward(x);
  std::vector<double> times;
  for (int i = 0; i < 110; ++i) {
    auto t = Clock::now();
    m.forward(x);
    sync();
    if (i >= 10) times.push_back(us(t));
  }
  for (auto& t : out) t = t.defined() ? t.cpu() : t;
  std::nth_element(times.begin(), times.begin() + 50, times.end());
  for (size_t i = 0; i < out.size(); ++i) {
    at::Tensor flat = out[i].flatten().to(at::kDouble);
    std::cout << "output " << i << ": " << out[i].sizes();
    for (int64_t k = 0; k < std::min<int64_t>(4, flat.numel()); ++k) std::cout << " " << flat[k].item<double>();
    std::cout << (flat.numel() > 4 ? " ...\n" : "\n");
  }
  std::cout << "load_ms " << load / 1000 << " call_us " << times[50] << " level " << m.level()
            << " graph " << m.graph_status().at("forward") << "\n";
  if (argc > 3) aotc::save_tensors(argv[3], out);
} catch (const aotc::AotcError& e) {
  std::cerr << e.kind() << ": " << e.what() << "\n";
  return e.exit_code();
} catch (const std::exception& e) {   // an ATen error inside a call
  std::cerr << e.what() << "\n";
  return 1;
}
