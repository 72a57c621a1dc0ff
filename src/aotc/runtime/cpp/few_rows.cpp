// aten::mm on the CPU for products of few rows (a decode step over several sequences): float32
// x [M, K] @ w [K, N], 1 <= M <= kMaxRows, w with unit column stride (the weight layout codegen
// gives decoders' linear layers, codegen/layouts.py), by a kernel that streams the weight once.
//
// torch's CPU product (MKL's sgemm) packs the whole right-hand operand for every call of more
// than one row: a decode step of 2 to 8 rows read and wrote each weight again and cost 2-3.5x
// one row's step (a 46M-parameter LLaMA on 2 cores: 7 ms at one row, 19 ms at 8). Here each
// thread takes column tiles of w and, for each of the K rows of a tile, adds x[m, k] * w[k, tile]
// into M accumulator rows that stay in L1: the weight is read once, in order, whatever M is.
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
constexpr int64_t kTile = 256;     // columns a tile: M x 1 KiB of accumulators, in L1

// Columns [n0, n0 + cols) of y = x @ w, cols <= kTile. (Compiled with -O3, setup.py: GCC's
// unroll-and-jam keeps the rows' sums in registers; at -O2 the 8-row product ran 4x slower.)
#if defined(__x86_64__) && defined(__GNUC__)
#define AOTC_VECTOR_LEVELS __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define AOTC_VECTOR_LEVELS
#endif

AOTC_VECTOR_LEVELS
void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
          int64_t m, int64_t k, int64_t n0, int64_t cols) {
  alignas(64) float acc[kMaxRows][kTile];
  for (int64_t r = 0; r < m; ++r) std::memset(acc[r], 0, sizeof(float) * kTile);
  if (cols == kTile) {
    for (int64_t i = 0; i < k; ++i) {
      const float* row = w + i * ldw + n0;
      for (int64_t r = 0; r < m; ++r) {
        const float a = x[r * ldx + i];
        float* out = acc[r];
#pragma omp simd aligned(out : 64)
        for (int64_t j = 0; j < kTile; ++j) out[j] += a * row[j];
      }
    }
  } else {
    for (int64_t i = 0; i < k; ++i) {
      const float* row = w + i * ldw + n0;
      for (int64_t r = 0; r < m; ++r) {
        const float a = x[r * ldx + i];
        for (int64_t j = 0; j < cols; ++j) acc[r][j] += a * row[j];
      }
    }
  }
  for (int64_t r = 0; r < m; ++r) std::memcpy(y + r * ldy + n0, acc[r], sizeof(float) * cols);
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
