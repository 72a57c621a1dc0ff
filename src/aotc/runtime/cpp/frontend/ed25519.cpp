// Ed25519 verification (ed25519.h): arithmetic mod p = 2^255 - 19 in five 51-bit limbs, points
// of the twisted Edwards curve -x^2 + y^2 = 1 + d x^2 y^2 in extended coordinates (RFC 8032
// 5.1.4), scalars mod L for the hash, and the check of 5.1.7 with OpenSSL's acceptance rules.
// Constants are derived from their definitions (d = -121665/121666, sqrt(-1) = 2^((p-1)/4),
// B = the point with y = 4/5 and x even) rather than written out.
#include "ed25519.h"

#include <array>
#include <cstdint>
#include <cstring>

#include "sha512.h"

namespace aotc::fe {

namespace {

using u128 = unsigned __int128;
using Bytes32 = std::array<uint8_t, 32>;
constexpr uint64_t kMask = (uint64_t(1) << 51) - 1;

// ------------------------------------------------------------------- the field, mod 2^255-19
// A value is v[0] + v[1] 2^51 + ... + v[4] 2^204; every function returns limbs below 2^52, the
// bound mul() and sub() assume.
struct Fe {
  uint64_t v[5];
};

uint64_t load64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = x << 8 | p[i];
  return x;
}

// The low 255 bits of 32 little-endian bytes (bit 255 is the caller's: a sign bit). A value in
// [p, 2^255) is kept as it is, i.e. taken mod p by the arithmetic.
Fe fe_bytes(const uint8_t* s) {
  return {{load64(s) & kMask, (load64(s + 6) >> 3) & kMask, (load64(s + 12) >> 6) & kMask,
           (load64(s + 19) >> 1) & kMask, (load64(s + 24) >> 12) & kMask}};
}

Fe fe_small(uint64_t n) { return {{n, 0, 0, 0, 0}}; }

// One carry pass: limbs below 2^51, plus at most 19 * (carry out of the top) in v[0].
Fe carry(Fe f) {
  for (int i = 0; i < 4; ++i) f.v[i + 1] += f.v[i] >> 51, f.v[i] &= kMask;
  f.v[0] += 19 * (f.v[4] >> 51), f.v[4] &= kMask;
  return f;
}

Fe add(const Fe& a, const Fe& b) {
  Fe r;
  for (int i = 0; i < 5; ++i) r.v[i] = a.v[i] + b.v[i];
  return carry(r);
}

// a - b + 4p, limb by limb (4p's limbs exceed any b below 2^52, so nothing wraps).
Fe sub(const Fe& a, const Fe& b) {
  constexpr uint64_t kFourP0 = (kMask - 18) * 4, kFourP = kMask * 4;
  Fe r;
  r.v[0] = a.v[0] + kFourP0 - b.v[0];
  for (int i = 1; i < 5; ++i) r.v[i] = a.v[i] + kFourP - b.v[i];
  return carry(r);
}

Fe neg(const Fe& a) { return sub(fe_small(0), a); }

Fe mul(const Fe& a, const Fe& b) {
  const uint64_t *x = a.v, *y = b.v;
  uint64_t y1 = 19 * y[1], y2 = 19 * y[2], y3 = 19 * y[3], y4 = 19 * y[4];
  u128 r[5] = {
      u128(x[0]) * y[0] + u128(x[1]) * y4 + u128(x[2]) * y3 + u128(x[3]) * y2 + u128(x[4]) * y1,
      u128(x[0]) * y[1] + u128(x[1]) * y[0] + u128(x[2]) * y4 + u128(x[3]) * y3 + u128(x[4]) * y2,
      u128(x[0]) * y[2] + u128(x[1]) * y[1] + u128(x[2]) * y[0] + u128(x[3]) * y4 + u128(x[4]) * y3,
      u128(x[0]) * y[3] + u128(x[1]) * y[2] + u128(x[2]) * y[1] + u128(x[3]) * y[0] + u128(x[4]) * y4,
      u128(x[0]) * y[4] + u128(x[1]) * y[3] + u128(x[2]) * y[2] + u128(x[3]) * y[1] + u128(x[4]) * y[0]};
  for (int i = 0; i < 4; ++i) r[i + 1] += r[i] >> 51, r[i] &= kMask;
  Fe out;
  for (int i = 0; i < 5; ++i) out.v[i] = uint64_t(r[i] & kMask);
  out.v[0] += 19 * uint64_t(r[4] >> 51);   // r[4] >> 51 < 2^64 / 19 for limbs below 2^52
  return carry(out);
}

Fe sq(const Fe& a) { return mul(a, a); }

// a^e, e given as 32 little-endian bytes (square and multiply, from the top bit).
Fe pow(const Fe& a, const Bytes32& e) {
  Fe r = fe_small(1);
  for (int bit = 255; bit >= 0; --bit) {
    r = sq(r);
    if ((e[bit / 8] >> (bit % 8)) & 1) r = mul(r, a);
  }
  return r;
}

// p - k, or (p - k) / 2^shift, as an exponent: p = 2^255 - 19 is ed ff .. ff 7f.
Bytes32 p_minus(uint8_t k, int shift) {
  Bytes32 e;
  e.fill(0xff);
  e[31] = 0x7f;
  e[0] = uint8_t(0xed - k);
  for (int s = 0; s < shift; ++s)   // one bit right, over the 256-bit number
    for (int i = 0; i < 32; ++i) e[i] = uint8_t(e[i] >> 1 | (i < 31 ? e[i + 1] << 7 : 0));
  return e;
}

Fe inv(const Fe& a) { return pow(a, p_minus(2, 0)); }

// The canonical encoding: the value reduced into [0, p), little-endian.
Bytes32 fe_encode(const Fe& f) {
  Fe t = carry(carry(f));   // now below 2^255, every limb below 2^51
  uint64_t q = (t.v[0] + 19) >> 51;   // 1 when t >= p, i.e. t + 19 >= 2^255
  for (int i = 1; i < 5; ++i) q = (t.v[i] + q) >> 51;
  t.v[0] += 19 * q;
  for (int i = 0; i < 4; ++i) t.v[i + 1] += t.v[i] >> 51, t.v[i] &= kMask;
  t.v[4] &= kMask;   // drops 2^255: t + 19 - 2^255 = t - p
  Bytes32 out{};
  for (int bit = 0, i = 0; i < 5; ++i)
    for (int k = 0; k < 51; ++k, ++bit) out[bit / 8] |= uint8_t(((t.v[i] >> k) & 1) << (bit % 8));
  return out;
}

bool fe_equal(const Fe& a, const Fe& b) { return fe_encode(a) == fe_encode(b); }
bool fe_negative(const Fe& a) { return fe_encode(a)[0] & 1; }

// ------------------------------------------------------------------------------- the curve
struct Point {
  Fe x, y, z, t;   // x/z, y/z, and t/z = xy
};

struct Constants {
  Fe d, d2, sqrt_m1;
};

const Constants& constants() {
  static const Constants k = [] {
    Fe d = neg(mul(fe_small(121665), inv(fe_small(121666))));
    return Constants{d, add(d, d), pow(fe_small(2), p_minus(1, 2))};   // 2^((p-1)/4): 2 is no square
  }();
  return k;
}

Point identity() { return {fe_small(0), fe_small(1), fe_small(1), fe_small(0)}; }

Point add(const Point& p, const Point& q) {   // RFC 8032 5.1.4: complete, doubling included
  Fe a = mul(sub(p.y, p.x), sub(q.y, q.x)), b = mul(add(p.y, p.x), add(q.y, q.x));
  Fe c = mul(mul(p.t, constants().d2), q.t), d = mul(add(p.z, p.z), q.z);
  Fe e = sub(b, a), f = sub(d, c), g = add(d, c), h = add(b, a);
  return {mul(e, f), mul(g, h), mul(f, g), mul(e, h)};
}

Point twice(const Point& p) {
  Fe a = sq(p.x), b = sq(p.y), c = add(sq(p.z), sq(p.z)), h = add(a, b);
  Fe e = sub(h, sq(add(p.x, p.y))), g = sub(a, b), f = add(c, g);
  return {mul(e, f), mul(g, h), mul(f, g), mul(e, h)};
}

Point negate(const Point& p) { return {neg(p.x), p.y, p.z, neg(p.t)}; }

// [k]P, k as 32 little-endian bytes (variable time: nothing here is secret).
Point times(const Point& p, const uint8_t* k) {
  Point r = identity();
  for (int bit = 255; bit >= 0; --bit) {
    r = twice(r);
    if ((k[bit / 8] >> (bit % 8)) & 1) r = add(r, p);
  }
  return r;
}

Bytes32 encode(const Point& p) {
  Fe zi = inv(p.z), x = mul(p.x, zi);
  Bytes32 out = fe_encode(mul(p.y, zi));
  out[31] |= uint8_t(fe_negative(x) << 7);
  return out;
}

// RFC 8032 5.1.3 as OpenSSL does it (ed25519.h): false where (y^2 - 1) / (d y^2 + 1) is no square.
bool decode(const uint8_t* s, Point& out) {
  const Constants& c = constants();
  Fe y = fe_bytes(s), y2 = sq(y), one = fe_small(1);
  Fe u = sub(y2, one), v = add(mul(c.d, y2), one);
  Fe v3 = mul(sq(v), v), v7 = mul(sq(v3), v);
  Fe x = mul(mul(u, v3), pow(mul(u, v7), p_minus(5, 3)));   // (u/v)^((p+3)/8)
  Fe vx2 = mul(v, sq(x));
  if (!fe_equal(vx2, u)) {
    if (!fe_equal(vx2, neg(u))) return false;
    x = mul(x, c.sqrt_m1);
  }
  if (fe_negative(x) != bool(s[31] >> 7)) x = neg(x);   // x = 0 with the sign set: kept 0
  out = {x, y, one, mul(x, y)};
  return true;
}

const Point& base() {
  static const Point b = [] {
    Point p = identity();
    Bytes32 y = fe_encode(mul(fe_small(4), inv(fe_small(5))));   // y = 4/5; sign bit 0: x even
    decode(y.data(), p);   // a point of the curve: it decodes
    return p;
  }();
  return b;
}

// --------------------------------------------------------------------------- scalars mod L
// L = 2^252 + 27742317777372353535851937790883648493, as little-endian 64-bit words.
constexpr uint64_t kL[4] = {0x5812631a5cf5d3ed, 0x14def9dea2f79cd6, 0, 0x1000000000000000};

bool below_l(const uint64_t* w) {
  for (int i = 3; i >= 0; --i)
    if (w[i] != kL[i]) return w[i] < kL[i];
  return false;
}

void words(const uint8_t* s, size_t n, uint64_t* out) {
  for (size_t i = 0; i < n / 8; ++i) out[i] = load64(s + 8 * i);
}

// The 512-bit little-endian number h mod L, by binary long division (r < L < 2^253 throughout).
Bytes32 reduce_l(const std::array<uint8_t, 64>& h) {
  uint64_t r[4] = {0, 0, 0, 0};
  for (int bit = 511; bit >= 0; --bit) {
    for (int i = 3; i > 0; --i) r[i] = r[i] << 1 | r[i - 1] >> 63;
    r[0] = r[0] << 1 | ((h[bit / 8] >> (bit % 8)) & 1);
    if (below_l(r)) continue;
    uint64_t borrow = 0;
    for (int i = 0; i < 4; ++i) {
      u128 d = u128(r[i]) - kL[i] - borrow;
      r[i] = uint64_t(d), borrow = uint64_t(d >> 64) & 1;
    }
  }
  Bytes32 out;
  for (int i = 0; i < 32; ++i) out[i] = uint8_t(r[i / 8] >> (8 * (i % 8)));
  return out;
}

}  // namespace

bool ed25519_verify(std::string_view public_key, std::string_view signature,
                    std::string_view message) {
  if (public_key.size() != kEd25519KeyBytes || signature.size() != kEd25519SignatureBytes)
    return false;
  auto key = reinterpret_cast<const uint8_t*>(public_key.data());
  auto sig = reinterpret_cast<const uint8_t*>(signature.data());
  uint64_t s[4];
  words(sig + 32, 32, s);
  if (!below_l(s)) return false;   // S >= L: not canonical
  Point a;
  if (!decode(key, a)) return false;
  Sha512 h;
  h.update(sig, 32);
  h.update(key, 32);
  h.update(message.data(), message.size());
  Bytes32 k = reduce_l(h.digest());
  Point check = add(times(base(), sig + 32), times(negate(a), k.data()));
  Bytes32 r = encode(check);
  return std::memcmp(r.data(), sig, 32) == 0;
}

}  // namespace aotc::fe
