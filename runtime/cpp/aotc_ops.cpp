// aotc's own ops (`aotc::<name>.<overload>`), as runtime/aotc_ops.py implements them for the
// Python runner: a fixed table, like the ATen op table the schema checks plans against.
#include <ATen/ATen.h>

#include "instr.h"

namespace aotc {

namespace {

// decode_attention(query [B, H, 1, D], key_cache [B, Hkv, M, D], value_cache, position [1]
// int64, scale): one query token attending the cache's keys 0..position. On a CPU the
// position is read (no device to wait for) and attention runs over the valid prefix only;
// elsewhere the rest of the cache is masked, so nothing is read back from the device.
void decode_attention(torch::jit::Stack& st) {
  const at::Tensor& q = st[0].toTensor();
  const at::Tensor& k = st[1].toTensor();
  const at::Tensor& v = st[2].toTensor();
  const at::Tensor& pos = st[3].toTensor();
  double scale = st[4].toScalar().toDouble();
  bool gqa = q.size(1) != k.size(1);
  at::Tensor out;
  if (q.device().is_cpu()) {
    int64_t n = pos.reshape(-1)[0].item<int64_t>() + 1;
    out = at::scaled_dot_product_attention(q, k.slice(2, 0, n), v.slice(2, 0, n), {}, 0.0,
                                           false, scale, gqa);
  } else {
    at::Tensor keys = at::arange(k.size(2), k.options().dtype(at::kLong));
    at::Tensor mask = (keys <= pos.reshape(1)).reshape({1, 1, 1, -1});
    out = at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale, gqa);
  }
  st.clear();
  st.emplace_back(std::move(out));
}

// decode_attention_write(query, key_cache, value_cache, position, key, value, scale): key and
// value [B, Hkv, 1, D] written at `position` of the caches (in place: they are the module's
// state), then decode_attention.
void decode_attention_write(torch::jit::Stack& st) {
  at::Tensor index = st[3].toTensor().reshape({1});
  st[1].toTensor().index_copy_(2, index, st[4].toTensor());
  st[2].toTensor().index_copy_(2, index, st[5].toTensor());
  st.erase(st.begin() + 4, st.begin() + 6);
  decode_attention(st);
}

}  // namespace

// The aotc op of that name and its argument count, or nullptr.
NativeOp native_op(const std::string& op, const std::string& overload, size_t& arity) {
  if (op == "aotc::decode_attention" && overload == "default") {
    arity = 5;
    return &decode_attention;
  }
  if (op == "aotc::decode_attention_write" && overload == "default") {
    arity = 7;
    return &decode_attention_write;
  }
  return nullptr;
}

}  // namespace aotc
