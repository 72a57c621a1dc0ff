// GraphedEntry (graphs.h): CUDA graphs of an entry's plan, as runtime/graphs.py.
#include "graphs.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <optional>

#ifdef AOTC_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace aotc::fe {

namespace {

using Key = std::vector<std::vector<int64_t>>;
constexpr size_t kSeen = 64;   // sizes remembered as called once, waiting for a second call

Key key_of(const std::vector<at::Tensor>& inputs) {
  Key key;
  for (const auto& t : inputs) key.emplace_back(t.sizes().begin(), t.sizes().end());
  return key;
}

std::string first_line(const std::string& s) {
  return s.substr(0, std::min<size_t>(s.find('\n'), 300));
}

// Bitwise the same values (NaNs in the same places count as equal).
bool same(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (a.is_floating_point() || a.is_complex())
    return ((a == b) | (at::isnan(a) & at::isnan(b))).all().item<bool>();
  return at::equal(a, b);
}

}  // namespace

const std::string& graphs_unavailable() {
#ifdef AOTC_CUDA_GRAPHS
  static const std::string why;
#else
  static const std::string why =
      "this aotc runtime was built without CUDA graphs (torch without CUDA, or CUDA's runtime "
      "headers not found, when aotc was installed)";
#endif
  return why;
}

struct Captured {   // one graph: the buffers it reads and writes, and its error flag
#ifdef AOTC_CUDA_GRAPHS
  std::unique_ptr<at::cuda::CUDAGraph> graph;
#endif
  std::vector<at::Tensor> in;
  std::vector<c10::IValue> out;
  at::Tensor flag;
};

struct GraphedEntry::Impl {
  c10::Device device;
  bool dynamic;
  std::string reason, full;   // why graphs are off; why new sizes are no longer captured
  std::vector<at::Tensor> state;
  size_t max_graphs;
  std::list<std::pair<Key, Captured>> graphs;   // least recently used first
  std::list<Key> seen;
  size_t evicted = 0;
  std::mutex lock;
#ifdef AOTC_CUDA_GRAPHS
  std::optional<at::cuda::MempoolId_t> pool;
#endif

  Captured* find(const Key& key);
  bool wanted(const Key& key);
  Captured* capture(const Key& key, const std::vector<at::Tensor>& inputs, const PlainRun& plain);
  void record(Captured& g, const PlainRun& plain, int warmups);
  RunResult replay(Captured& g, const std::vector<at::Tensor>& inputs, const PlainRun& plain);
  std::string mismatch(Captured& g, const std::vector<at::Tensor>& inputs, const PlainRun& plain,
                       const std::function<void()>& restore);
  void disable(const std::string& why) {
    reason = why;
    graphs.clear();
    seen.clear();
  }
};

GraphedEntry::GraphedEntry(c10::Device device, bool dynamic, std::string off,
                           std::vector<at::Tensor> state, int max_graphs)
    : impl_(new Impl{device, dynamic, std::move(off), "", std::move(state),
                     dynamic ? size_t(std::max(1, max_graphs)) : 1}) {
  if (impl_->reason.empty()) impl_->reason = graphs_unavailable();
}

GraphedEntry::~GraphedEntry() = default;

std::string GraphedEntry::status() const {
  std::lock_guard<std::mutex> hold(impl_->lock);
  if (!impl_->reason.empty()) return impl_->reason;
  return impl_->graphs.empty() ? "pending" : "graph";
}

RunResult GraphedEntry::call(const std::vector<at::Tensor>& inputs, const PlainRun& plain) {
  Impl& s = *impl_;
  bool defined = std::all_of(inputs.begin(), inputs.end(), [](const at::Tensor& t) { return t.defined(); });
  if (defined) {
    std::lock_guard<std::mutex> hold(s.lock);
    Key key = key_of(inputs);
    Captured* g = s.find(key);
    if (!g && s.reason.empty() && s.wanted(key)) g = s.capture(key, inputs, plain);
    if (g) return s.replay(*g, inputs, plain);
  }
  return plain.run(inputs, true);
}

Captured* GraphedEntry::Impl::find(const Key& key) {
  auto it = std::find_if(graphs.begin(), graphs.end(), [&](const auto& p) { return p.first == key; });
  if (it == graphs.end()) return nullptr;
  graphs.splice(graphs.end(), graphs, it);   // the most recently used last
  return &graphs.back().second;
}

// Whether to capture at `key` now: a static entry at once, a dynamic one on the second call
// with these sizes, unless the cache is full.
bool GraphedEntry::Impl::wanted(const Key& key) {
  if (!dynamic) return true;
  if (!full.empty()) return false;
  auto it = std::find(seen.begin(), seen.end(), key);
  if (it != seen.end()) {
    seen.erase(it);
    return true;
  }
  seen.push_back(key);
  if (seen.size() > kSeen) seen.pop_front();
  return false;
}

Captured* GraphedEntry::Impl::capture(const Key& key, const std::vector<at::Tensor>& inputs,
                                      const PlainRun& plain) {
  if (graphs.size() >= max_graphs) {
    graphs.pop_front();
    if (++evicted >= max_graphs)
      full = std::to_string(evicted) + " graphs evicted from a cache of " + std::to_string(max_graphs) +
             ": new sizes run without a graph";
  }
  Captured g;
  for (const auto& a : inputs) g.in.push_back(at::empty(a.sizes(), a.options()).copy_(a));
  std::vector<at::Tensor> snapshot;
  for (const auto& t : state) snapshot.push_back(t.clone());
  auto restore = [&] {
    for (size_t i = 0; i < state.size(); ++i) state[i].copy_(snapshot[i]);
  };
  try {
    record(g, plain, dynamic ? 1 : 2);
  } catch (const std::exception& e) {   // something in the plan cannot be captured
    restore();
    disable("capture failed: " + first_line(e.what()));
    return nullptr;
  }
  restore();
  std::string why = mismatch(g, inputs, plain, restore);
  restore();
  if (!why.empty()) {
    disable(why);
    return nullptr;
  }
  graphs.emplace_back(key, std::move(g));
  return &graphs.back().second;
}

// Why replays differ from a plain run of the same inputs (from the same state), or "".
std::string GraphedEntry::Impl::mismatch(Captured& g, const std::vector<at::Tensor>& inputs,
                                         const PlainRun& plain, const std::function<void()>& restore) {
  restore();
  RunResult want = plain.run(inputs, true);
  restore();
  RunResult got = replay(g, inputs, plain);
  if (want.failed_step >= 0 || got.failed_step >= 0)
    return want.failed_step == got.failed_step ? "" : "graph replay and a plain run disagree on an index check";
  for (size_t i = 0; i < std::min(got.outputs.size(), want.outputs.size()); ++i)
    if (got.outputs[i].isTensor() && !same(got.outputs[i].toTensor(), want.outputs[i].toTensor()))
      return "graph replay differs from a plain run at output " + std::to_string(i);
  return "";
}

#ifdef AOTC_CUDA_GRAPHS

// Captures the plan on `g.in` after `warmups` plain runs, all on a side stream (lazy
// initialisation stays off the graph), into this entry's memory pool.
void GraphedEntry::Impl::record(Captured& g, const PlainRun& plain, int warmups) {
  c10::cuda::CUDAGuard on(device.index());
  auto side = c10::cuda::getStreamFromPool(false, device.index());
  c10::cuda::device_synchronize();   // the inputs' copies done before the side stream reads them
  c10::cuda::CUDAStreamGuard on_side(side);
  for (int i = 0; i < warmups; ++i) plain.run(g.in, true);
  c10::cuda::device_synchronize();
  if (!pool) pool = at::cuda::graph_pool_handle();
  g.graph = std::make_unique<at::cuda::CUDAGraph>();
  g.graph->capture_begin(*pool);
  RunResult r;
  try {
    r = plain.run(g.in, false);
  } catch (...) {
    try {
      g.graph->capture_end();   // leaves the stream usable; its own error is the same
    } catch (...) {
    }
    throw;
  }
  g.graph->capture_end();
  g.out = std::move(r.outputs);
  g.flag = r.flag;
}

RunResult GraphedEntry::Impl::replay(Captured& g, const std::vector<at::Tensor>& inputs,
                                     const PlainRun& plain) {
  for (size_t i = 0; i < inputs.size(); ++i) g.in[i].copy_(inputs[i]);
  g.graph->replay();
  RunResult r;
  if (g.flag.defined()) {   // index checks made during the replay
    int32_t code = g.flag.item<int32_t>();
    if (code != 0) {
      r.failed_step = plain.step_of(code);
      return r;
    }
  }
  for (const auto& o : g.out)
    r.outputs.push_back(o.isTensor() ? c10::IValue(o.toTensor().clone()) : o);
  return r;
}

#else

void GraphedEntry::Impl::record(Captured&, const PlainRun&, int) {
  throw std::runtime_error(graphs_unavailable());
}

RunResult GraphedEntry::Impl::replay(Captured&, const std::vector<at::Tensor>&, const PlainRun&) {
  throw std::runtime_error(graphs_unavailable());
}

#endif

}  // namespace aotc::fe
