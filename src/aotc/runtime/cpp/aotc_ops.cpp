// aotc's own ops (`aotc::<name>.<overload>`), as runtime/aotc_ops.py implements them for the
// Python runner: a fixed table, like the ATen op table the schema checks plans against.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "frontend/rules.h"
#include "include/aotc/errors.h"
#include "instr.h"

namespace aotc {

namespace {

// softmax(q k^T * scale, soft-capped where softcap > 0, masked[, with each head's sink logit])
// v, as runtime/attention.py computes it: ATen's attention without a softcap or sinks, the
// explicit product with them.
at::Tensor attention(const at::Tensor& q, at::Tensor k, at::Tensor v,
                     const std::optional<at::Tensor>& mask, double scale, double softcap,
                     const std::optional<at::Tensor>& sinks) {
  bool gqa = q.size(1) != k.size(1);
  if (softcap <= 0 && !sinks)
    return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale, gqa);
  if (gqa) {
    k = k.repeat_interleave(q.size(1) / k.size(1), 1);
    v = v.repeat_interleave(q.size(1) / v.size(1), 1);
  }
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * scale;
  if (softcap > 0) scores = at::tanh(scores / softcap) * softcap;
  if (mask)
    scores = scores.masked_fill(mask->logical_not(), -std::numeric_limits<double>::infinity());
  if (!sinks) return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), v);
  std::vector<int64_t> shape(scores.sizes().begin(), scores.sizes().end());
  shape.back() = 1;
  at::Tensor sink = sinks->to(scores.scalar_type()).reshape({1, -1, 1, 1}).expand(shape);
  at::Tensor weights = at::softmax(at::cat({scores, sink}, -1), -1, at::kFloat);
  return at::matmul(weights.slice(-1, 0, -1).to(q.scalar_type()), v);
}

// The position as an int, inside the cache (runtime/aotc_ops.py's _checked): a manifest whose
// max_cache_len claims more slots than the plan's cache has is refused before any write.
int64_t checked_position(const at::Tensor& pos, const at::Tensor& cache) {
  int64_t at = pos.reshape(-1)[0].item<int64_t>(), slots = cache.size(2);
  if (at < 0 || at >= slots)
    throw GuardError("decode position outside the KV cache", "aotc::decode_attention",
                     "0 <= position < " + std::to_string(slots) + " (the cache's slots)",
                     std::to_string(at),
                     "reset() the module; an artifact whose generation.max_cache_len exceeds its "
                     "cache is damaged: re-export it");
  return at;
}

// decode_attention(query [B, H, 1, D], key_cache [B, Hkv, M, D], value_cache, position [1]
// int64, scale[, window[, softcap[, sinks]]]): one query token attending the cache's keys
// 0..position (with window > 0 only the last `window` of them; with softcap > 0 its scores
// soft-capped; with sinks [H], one more logit per head in each softmax).
// On a CPU the position is read (no device to wait for) and attention runs over the valid
// keys only; elsewhere the rest of the cache is masked, so nothing is read back from the device.
void decode_attention(torch::jit::Stack& st) {
  const at::Tensor& q = st[0].toTensor();
  const at::Tensor& k = st[1].toTensor();
  const at::Tensor& v = st[2].toTensor();
  const at::Tensor& pos = st[3].toTensor();
  double scale = st[4].toScalar().toDouble();
  int64_t window = st.size() > 5 ? st[5].toScalar().toLong() : 0;
  double softcap = st.size() > 6 ? st[6].toScalar().toDouble() : 0.0;
  std::optional<at::Tensor> sinks;
  if (st.size() > 7 && !st[7].isNone()) sinks = st[7].toTensor();
  at::Tensor out;
  if (q.device().is_cpu()) {
    int64_t n = checked_position(pos, k) + 1;
    int64_t lo = window > 0 ? std::max<int64_t>(0, n - window) : 0;
    out = attention(q, k.slice(2, lo, n), v.slice(2, lo, n), std::nullopt, scale, softcap, sinks);
  } else {
    at::Tensor keys = at::arange(k.size(2), k.options().dtype(at::kLong));
    at::Tensor at_pos = pos.reshape(1);
    at::Tensor mask = keys <= at_pos;
    if (window > 0) mask = mask & (keys > at_pos - window);
    out = attention(q, k, v, mask.reshape({1, 1, 1, -1}), scale, softcap, sinks);
  }
  st.clear();
  st.emplace_back(std::move(out));
}

// decode_attention_write(query, key_cache, value_cache, position, key, value, scale[, window[,
// softcap[, sinks]]]): key and value [B, Hkv, 1, D] written at `position` of the caches (in
// place: they are the module's state), then decode_attention.
void decode_attention_write(torch::jit::Stack& st) {
  at::Tensor index = st[3].toTensor().reshape({1});
  at::Tensor k = st[1].toTensor(), v = st[2].toTensor();
  if (k.device().is_cpu()) {
    checked_position(index, k);
    k.index_copy_(2, index, st[4].toTensor());
    v.index_copy_(2, index, st[5].toTensor());
  } else {   // the position stays on the device: past the cache, the row is rewritten as is
    at::Tensor clamped = index.clamp(0, k.size(2) - 1);
    at::Tensor inside = ((index >= 0) & (index < k.size(2))).reshape({1, 1, 1, 1});
    k.index_copy_(2, clamped, at::where(inside, st[4].toTensor(), k.index_select(2, clamped)));
    v.index_copy_(2, clamped, at::where(inside, st[5].toTensor(), v.index_select(2, clamped)));
  }
  st.erase(st.begin() + 4, st.begin() + 6);
  decode_attention(st);
}

// fft(x, dims, mode[, size]): torch.fft over the dims set in `dims` of x, real or (mode & 4)
// complex as pairs; fftn, ifftn, rfftn (pairs out) or irfftn (real out, the one-sided dim
// `size` long); 16-bit floats computed in float32 (runtime/fourier.py says how `mode`
// encodes the transform, and checks the same).
void fft(torch::jit::Stack& st) {
  const at::Tensor& x = st[0].toTensor();
  int64_t dims = st[1].toInt(), mode = st[2].toInt(), size = st.size() > 3 ? st[3].toInt() : 0;
  bool pairs = mode >> 2 & 1;
  int64_t kind = mode & 3, norm = mode >> 3 & 3, last = mode >> 5, nd = x.dim() - int64_t(pairs);
  std::vector<int64_t> order;
  for (int64_t d = 0; d < std::min<int64_t>(nd, 62); ++d)
    if ((dims >> d & 1) && !(kind >= 2 && d == last)) order.push_back(d);
  bool has_last = last >= 0 && last < 62 && last < nd && (dims >> last & 1);
  if (kind >= 2 && has_last) order.push_back(last);
  int64_t bins = kind == 3 && has_last ? x.size(last) : 0;
  int64_t n = kind == 3 ? (size ? size : 2 * (bins - 1)) : size;
  if (dims <= 0 || mode < 0 || size < 0 || nd < 1 || (nd < 62 && (dims >> nd)) || norm > 2 ||
      (pairs && (x.size(-1) != 2 || !x.is_floating_point())) ||
      (kind >= 2 && !has_last) || (kind < 2 && last) || (kind == 2 && pairs) ||
      (kind == 3 && (!pairs || n < 1 || n > 2 * bins)) || (kind != 3 && size))
    throw ArtifactError("the plan calls aotc::fft with dims or a mode its input cannot take",
                        "aotc::fft", "dims among the " + std::to_string(nd) +
                        " of the input, a mode fft_mode makes and a size only for irfftn "
                        "(1 to 2x its bins)",
                        "dims " + std::to_string(dims) + ", mode " + std::to_string(mode) +
                        ", size " + std::to_string(size), "re-export the model");
  static const char* kNorms[] = {"backward", "forward", "ortho"};
  bool half = x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16;
  at::Tensor work = half ? x.to(at::kFloat) : x;
  at::Tensor z = pairs ? at::view_as_complex(work.contiguous()) : work;
  std::string_view nm = kNorms[norm];
  at::Tensor out;
  if (kind == 3) {
    std::vector<int64_t> s;
    for (size_t i = 0; i + 1 < order.size(); ++i) s.push_back(z.size(order[i]));
    s.push_back(n);
    out = at::fft_irfftn(z, s, order, nm);
  } else {
    out = at::view_as_real(kind == 2   ? at::fft_rfftn(z, std::nullopt, order, nm)
                           : kind == 1 ? at::fft_ifftn(z, std::nullopt, order, nm)
                                       : at::fft_fftn(z, std::nullopt, order, nm));
  }
  st.clear();
  st.emplace_back(half ? out.to(x.scalar_type()) : out);
}

// sdpa_backward(grad, query, key, value, is_causal, scale, enable_gqa[, attn_mask]): (dq, dk,
// dv) of ATen's attention, its forward recomputed under autograd so that the device's fused
// backward runs (runtime/attention.py's sdpa_backward); contiguous, as the plan's slots are.
void sdpa_backward(torch::jit::Stack& st) {
  c10::InferenceMode off(false);
  at::AutoGradMode grad_mode(true);
  auto own = [](const at::Tensor& t) { return t.is_inference() ? t.clone() : t.detach(); };
  at::Tensor grad = own(st[0].toTensor());
  at::Tensor q = own(st[1].toTensor()).requires_grad_();
  at::Tensor k = own(st[2].toTensor()).requires_grad_();
  at::Tensor v = own(st[3].toTensor()).requires_grad_();
  bool causal = st[4].toScalar().toLong() != 0;
  double scale = st[5].toScalar().toDouble();
  bool gqa = st[6].toScalar().toLong() != 0;
  std::optional<at::Tensor> mask;
  if (st.size() > 7 && !st[7].isNone()) mask = own(st[7].toTensor());
  at::Tensor out = at::scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale, gqa);
  auto grads = torch::autograd::grad({out}, {q, k, v}, {grad});
  st.clear();
  for (auto& g : grads) st.emplace_back(g.contiguous());
}

}  // namespace

// The aotc op of that name that this runner implements, with its arguments' kinds ('T' a
// tensor slot, 'i' an int, 'f' a number) and how many of them are required, both from the
// schema's table (artifact/schema/ops.py, generated into rules.h); or nullptr.
NativeOp native_op(const std::string& op, const std::string& overload, std::string& kinds,
                   size_t& least) {
  static const std::pair<const char*, NativeOp> kImplemented[] = {
      {"aotc::decode_attention.default", &decode_attention},
      {"aotc::decode_attention_write.default", &decode_attention_write},
      {"aotc::fft.default", &fft},
      {"aotc::sdpa_backward.default", &sdpa_backward}};
  const std::string name = op + "." + overload;
  for (const auto& [implemented, fn] : kImplemented) {
    if (name != implemented) continue;
    for (const auto& entry : fe::rules::kAotcOps)
      if (name == entry.name) {
        kinds = entry.kinds, least = entry.least;
        return fn;
      }
  }
  return nullptr;
}

}  // namespace aotc
