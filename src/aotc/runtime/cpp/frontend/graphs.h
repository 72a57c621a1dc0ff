// CUDA graphs for the C++ front end: an entry's whole plan captured once per set of input sizes
// and replayed with one launch per call, as runtime/graphs.py does for aotc.load:
//
// - inputs are copied into static buffers the graph reads; outputs are cloned out of the
//   graph's buffers, so a result never changes under the caller when the next call replays;
// - the error flag that index-checking kernels write during a replay is read after it;
// - before a graph is used, the call that captured it is checked against a plain run of the
//   same inputs (from the same state, for a generator's cache): any difference, or anything in
//   the plan that cannot be captured, turns graphs off for the entry with the reason kept;
// - a static entry captures on its first call; one with dynamic dims on the second call with
//   a set of sizes, keeping the `max_graphs` most recently used (they share one memory pool);
// - entries whose sizes depend on tensor values (value-dependent sizes) never capture.
//
// Capture and replay go through torch's own CUDA graph class (its memory pool keeps what a
// graph writes away from every other allocation), so this part of the runtime is built only
// where torch was built for CUDA and CUDA's runtime headers were found at install time
// (setup.py); elsewhere `graphs_unavailable()` says why and entries run their plain plans.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../program.h"

namespace aotc::fe {

// Why this build of the runtime cannot capture CUDA graphs ("" where it can).
const std::string& graphs_unavailable();

// An entry's plain call: its plan run on `inputs` (the flag read unless `read_flag` is false,
// inside a capture), and the plan step that stored an error code.
struct PlainRun {
  std::function<RunResult(const std::vector<at::Tensor>& inputs, bool read_flag)> run;
  std::function<int32_t(int32_t code)> step_of;
};

class GraphedEntry {
 public:
  // `off`: why this entry never captures ("" if it may); `state`: a generator's tensors that
  // the plan updates in place, restored after each trial run of a capture.
  GraphedEntry(c10::Device device, bool dynamic, std::string off, std::vector<at::Tensor> state,
               int max_graphs);
  ~GraphedEntry();
  GraphedEntry(const GraphedEntry&) = delete;
  GraphedEntry& operator=(const GraphedEntry&) = delete;

  // A call: replayed where a graph of these sizes is (or can now be) captured, else plain.
  RunResult call(const std::vector<at::Tensor>& inputs, const PlainRun& plain);
  // "graph" (some sizes replay one), "pending" (none captured yet), or why graphs are off.
  std::string status() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace aotc::fe
