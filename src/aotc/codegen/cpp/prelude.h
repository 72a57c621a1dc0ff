// aotc C++ kernel prelude: scalar helpers shared by every generated kernel.
// Plain C++17, no torch headers: kernels outlive torch ABI changes.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>

static inline float aotc_bf16_to_float(uint16_t v) {
    uint32_t u = (uint32_t)v << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline uint16_t aotc_float_to_bf16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;   // round to nearest even, as torch
    return f != f ? (uint16_t)0x7fc0 : (uint16_t)r;          // branch-free: vectorizes
}
static inline float aotc_round_bf16(float f) { return aotc_bf16_to_float(aotc_float_to_bf16(f)); }
static inline float aotc_round_fp16(float f) { return (float)(_Float16)f; }

// NaN-propagating max/min as two selects: a short-circuit `||` stops GCC's if-conversion, so a
// loop with several of them (an unrolled pooling window) would not vectorize
template <typename T> static inline T aotc_maximum(T a, T b) { T m = a < b ? b : a; return b != b ? b : m; }
template <typename T> static inline T aotc_minimum(T a, T b) { T m = b < a ? b : a; return b != b ? b : m; }
// codegen/cpp/room.py: -1 - i for the first of a kernel's n pointers with less room than the
// kernel indexes (the extent it needed stored after the rooms), 0 if every one has enough
static inline int aotc_room_short(int64_t* room, const double* need, int n) {
    for (int i = 0; i < n; ++i)
        if (!((double)room[i] >= need[i])) {   // (a NaN extent is refused too)
            room[n + i] = need[i] < 9.0e18 ? (int64_t)need[i] : std::numeric_limits<int64_t>::max();
            return -1 - i;
        }
    return 0;
}
template <typename T> static inline T aotc_relu(T a) { return a < 0 ? T(0) : a; }
// float relu in integer bit operations (NaN kept): a select here, merged by GCC with a later
// comparison into a select of booleans, stops a loop from vectorizing (relu's mask in training)
static inline float aotc_relu(float a) {
    uint32_t u; std::memcpy(&u, &a, 4);
    uint32_t neg = (uint32_t)((int32_t)u >> 31);
    uint32_t nan = (uint32_t)((int32_t)(0x7f800000u - (u & 0x7fffffffu)) >> 31);
    u &= ~(neg & ~nan);
    float r; std::memcpy(&r, &u, 4);
    return r;
}
template <typename T> static inline T aotc_sign(T a) { return T((T(0) < a) - (a < T(0))); }
template <typename T> static inline T aotc_sigmoid(T a) { return T(1) / (T(1) + std::exp(-a)); }

static inline double aotc_remainder(double a, double b) {
    double r = std::fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline float aotc_remainder(float a, float b) {
    float r = std::fmod(a, b);
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> static inline T aotc_remainder(T a, T b) {
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// Floating floor division exactly as torch's c10::div_floor_floating: from fmod, so that a
// quotient that rounds up to an integer (1 / 0.1f) still floors to the true result.
template <typename T> static inline T aotc_floordiv_fp(T a, T b) {
    if (b == 0) return a / b;
    T mod = std::fmod(a, b);
    T div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= T(1);
    if (div == 0) return std::copysign(T(0), a / b);
    T fl = std::floor(div);
    return (div - fl > T(0.5)) ? fl + T(1) : fl;
}
static inline double aotc_floordiv(double a, double b) { return aotc_floordiv_fp(a, b); }
static inline float aotc_floordiv(float a, float b) { return aotc_floordiv_fp(a, b); }
template <typename T> static inline T aotc_floordiv(T a, T b) {
    T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> static inline T aotc_ipow(T a, T b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    T r = 1;
    while (b) { if (b & 1) r *= a; a *= a; b >>= 1; }
    return r;
}
