// aten::mm on the CPU for products of few rows (a decode step over several sequences): float32
// x [M, K] @ w [K, N], 1 <= M <= kMaxRows, w with unit column stride (the weight layout codegen
// gives decoders' linear layers, codegen/layouts.py), by a kernel that streams the weight once.
//
// torch's CPU product (MKL's sgemm) packs the whole right-hand operand for every call of more
// than one row: a decode step of 2 to 8 rows read and wrote each weight again and cost 2-3.5x
// one row's step (a 46M-parameter LLaMA on 2 cores: 7 ms at one row, 19 ms at 8). Here each
// thread takes column tiles of w and, over chunks of its K rows, adds x[m, k] * w[k, block]
// into M x B vectors of accumulators held in registers: the weight is read once, whatever M is.
// Each output is the sum over k in increasing order, the same for every M: a sequence's
// logits do not depend on how many others a step decodes beside it (bitwise).
// Anything else (other dtypes, more rows, other strides, a GPU) is torch's product.
// The Python runner calls it too (_runner.mm, runtime/executor.py runner_mm): both runners agree.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/runtime/operator.h>

#include <algorithm>
#include <cstring>

namespace aotc {

namespace {

constexpr int64_t kMaxRows = 8;    // up to here the kernel is faster than MKL (measured, 2 cores)
constexpr int64_t kTile = 256;     // columns a tile (a thread's unit of work)
constexpr int64_t kChunk = 64;     // rows of w a pass over a tile: 64 KiB of weight
using V = float __attribute__((vector_size(64)));   // 16 floats: zmm, 2 ymm or 4 xmm
constexpr int64_t kLanes = int64_t(sizeof(V) / sizeof(float));

// Rows [k0, k1) of the sums of y = x @ w at the NV vectors of columns from c, for R <= 4 rows
// of x: the R x NV accumulators stay in registers over the chunk (starting from 0 at k0 = 0,
// else from y's partial sums), so each output sums over k in increasing order, one product a
// k, whatever R and NV are. NV is wider for fewer rows: each accumulator's chain of additions
// waits on itself, so one row over 2 vectors was bound by the adds' latency, not the loads.
template <int R, int NV>
__attribute__((always_inline)) inline void block(const float* x, int64_t ldx, const float* w,
                                                 int64_t ldw, float* y, int64_t ldy, int64_t k0,
                                                 int64_t k1, int64_t c) {
  V acc[R][NV] = {};
  if (k0 > 0)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < NV; ++j)
        std::memcpy(&acc[r][j], y + r * ldy + c + j * kLanes, sizeof(V));
  for (int64_t i = k0; i < k1; ++i) {
    const float* row = w + i * ldw + c;
    V b[NV];
    for (int j = 0; j < NV; ++j) std::memcpy(&b[j], row + j * kLanes, sizeof(V));
    for (int r = 0; r < R; ++r) {
      const float a = x[r * ldx + i];
      for (int j = 0; j < NV; ++j) acc[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < NV; ++j)
      std::memcpy(y + r * ldy + c + j * kLanes, &acc[r][j], sizeof(V));
}

// The tail columns (fewer than a vector's worth left): one at a time, k in order.
inline void tail(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                 int64_t ldy, int64_t m, int64_t k, int64_t n0, int64_t cols) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = n0; j < n0 + cols; ++j) {
      float s = 0.0f;
      for (int64_t i = 0; i < k; ++i) s += x[r * ldx + i] * w[i * ldw + j];
      y[r * ldy + j] = s;
    }
}

// Blocks of NV vectors of columns from c0 to c1 (a multiple of NV vectors past c0) over the
// chunk [k0, k1): rows 0-3, then rows 4-7 (whose pass reads the block's weight from L1).
template <int R, int NV>
__attribute__((always_inline)) inline void blocks(const float* x, int64_t ldx, const float* w,
                                                  int64_t ldw, float* y, int64_t ldy,
                                                  int64_t k0, int64_t k1, int64_t c0,
                                                  int64_t c1) {
  constexpr int kLow = R < 4 ? R : 4, kHigh = R - kLow;
  for (int64_t c = c0; c < c1; c += NV * kLanes) {
    block<kLow, NV>(x, ldx, w, ldw, y, ldy, k0, k1, c);
    if constexpr (kHigh > 0)
      block<kHigh, NV>(x + 4 * ldx, ldx, w, ldw, y + 4 * ldy, ldy, k0, k1, c);
  }
}

// Columns [n0, n0 + cols) of y = x @ w, cols <= kTile, kChunk rows of w at a time: blocks of
// 8 vectors of columns for one row of x, 4 for two, 2 for more (and 2 for what the wide blocks
// leave), then the scalar tail.
template <int R>
__attribute__((target_clones("avx512f", "avx2", "default")))
void tile_rows(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
               int64_t k, int64_t n0, int64_t cols) {
  constexpr int NV = R == 1 ? 8 : R == 2 ? 4 : 2;
  const int64_t wide = cols / (NV * kLanes) * (NV * kLanes);
  const int64_t narrow = wide + (cols - wide) / (2 * kLanes) * (2 * kLanes);
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t k1 = std::min(k, k0 + kChunk);
    blocks<R, NV>(x, ldx, w, ldw, y, ldy, k0, k1, n0, n0 + wide);
    if constexpr (NV != 2) blocks<R, 2>(x, ldx, w, ldw, y, ldy, k0, k1, n0 + wide, n0 + narrow);
  }
  tail(x, ldx, w, ldw, y, ldy, R, k, n0 + narrow, cols - narrow);
}

void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
          int64_t m, int64_t k, int64_t n0, int64_t cols) {
  switch (m) {
    case 1: return tile_rows<1>(x, ldx, w, ldw, y, ldy, k, n0, cols);
    case 2: return tile_rows<2>(x, ldx, w, ldw, y, ldy, k, n0, cols);
    case 3: return tile_rows<3>(x, ldx, w, ldw, y, ldy, k, n0, cols);
    case 4: return tile_rows<4>(x, ldx, w, ldw, y, ldy, k, n0, cols);
    case 5: return tile_rows<5>(x, ldx, w, ldw, y, ldy, k, n0, cols);
    case 6: return tile_rows<6>(x, ldx, w, ldw, y, ldy, k, n0, cols);
    case 7: return tile_rows<7>(x, ldx, w, ldw, y, ldy, k, n0, cols);
    default: return tile_rows<8>(x, ldx, w, ldw, y, ldy, k, n0, cols);
  }
}

bool fits(const at::Tensor& x, const at::Tensor& w) {
  return x.device().is_cpu() && w.device().is_cpu() && x.scalar_type() == at::kFloat &&
         w.scalar_type() == at::kFloat && x.dim() == 2 && w.dim() == 2 &&
         x.size(0) >= 1 && x.size(0) <= kMaxRows && x.size(1) == w.size(0) && x.size(1) > 0 &&
         x.stride(1) == 1 && w.stride(1) == 1 &&
         !x.requires_grad() && !w.requires_grad();
}

}  // namespace

// x @ w into a new [M, N] tensor, by the kernel above where it applies, else torch's product.
at::Tensor few_rows_mm(const at::Tensor& x, const at::Tensor& w) {
  if (!fits(x, w)) return at::mm(x, w);
  const int64_t m = x.size(0), k = x.size(1), n = w.size(1);
  at::Tensor y = at::empty({m, n}, x.options());
  const float* xp = x.const_data_ptr<float>();
  const float* wp = w.const_data_ptr<float>();
  float* yp = y.mutable_data_ptr<float>();
  const int64_t ldx = x.stride(0), ldw = w.stride(0), tiles = (n + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      tile(xp, ldx, wp, ldw, yp, n, m, k, t * kTile, std::min(kTile, n - t * kTile));
  });
  return y;
}

// The plan's aten::mm.default call (self, mat2) on the CPU.
void few_rows_mm_call(torch::jit::Stack& st) {
  at::Tensor y = few_rows_mm(st[0].toTensor(), st[1].toTensor());
  st.clear();
  st.emplace_back(std::move(y));
}

}  // namespace aotc
