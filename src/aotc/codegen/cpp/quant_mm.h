// aotc's quantized-weight products on CPUs (codegen/cpp/quant_mm.py says how they work)
#ifndef AOTC_QUANT_MM
#define AOTC_QUANT_MM
#include <cstdlib>
typedef float aotc_f16v __attribute__((vector_size(64)));
typedef int8_t aotc_b16v __attribute__((vector_size(16)));
typedef uint8_t aotc_u16v __attribute__((vector_size(16)));
typedef int32_t aotc_i16v __attribute__((vector_size(64)));
// unaligned views for loads (GCC 12 splits a memcpy into an int8 vector into scalar loads)
typedef int8_t aotc_b16u __attribute__((vector_size(16), aligned(1), may_alias));
typedef float aotc_f16u __attribute__((vector_size(64), aligned(1), may_alias));
typedef uint8_t aotc_u16u __attribute__((vector_size(16), aligned(1), may_alias));
typedef uint8_t aotc_u8v __attribute__((vector_size(8)));
typedef int16_t aotc_s16v __attribute__((vector_size(32)));
typedef uint16_t aotc_h8v __attribute__((vector_size(16)));
// 16 bytes (int8 or uint8) to float through int32 (an extension, then a conversion), through
// int16 below AVX-512: GCC 12 turns the direct one, wider than the level's registers, into
// scalar ones
template <typename V>
static inline aotc_f16v aotc_to_f(V b) {
#if defined(__AVX512F__)
    return __builtin_convertvector(__builtin_convertvector(b, aotc_i16v), aotc_f16v);
#else
    return __builtin_convertvector(__builtin_convertvector(__builtin_convertvector(b, aotc_s16v),
                                                           aotc_i16v), aotc_f16v);
#endif
}
static inline float aotc_hsum(aotc_f16v v) {
    float s = 0.0f;
    for (int i = 0; i < 16; ++i) s += v[i];
    return s;
}
// 16 int8 weights at p, as floats
static inline aotc_f16v aotc_q8_load(const int8_t* p) {
    aotc_b16v b = *(const aotc_b16u*)p;
#if defined(__x86_64__)
    __asm__("" : "+x"(b));   // a vector in a register: GCC 12 widens a loaded one byte by byte
#endif
    return aotc_to_f(b);
}
// 16 int4 weights (8 bytes at p) as floats in order (nibble - 8): each byte widened to 16
// bits holds its low nibble in its low byte and its high nibble in its high byte, which read
// as bytes is the weights in order (GCC 12 scalarizes a shuffle of bytes into this order)
static inline aotc_f16v aotc_q4_load(const uint8_t* p) {
    aotc_u8v u; std::memcpy(&u, p, 8);
    aotc_h8v h = __builtin_convertvector(u, aotc_h8v);
    h = (h & (uint16_t)15) | ((h & (uint16_t)240) << 4);
    aotc_b16v q; std::memcpy(&q, &h, 16);
    return aotc_to_f(q - (int8_t)8);
}
// out[r, c + j] (r < R, j < C) = x[r, :] . q[c + j, :] (+ bias) for int8 rows q [N, K]: C
// weight rows at a time, each vector of x loaded once for all of them and C x R independent
// accumulators (one row's chain of additions waits on itself); each sums over k in order
template <int R, int C>
static inline void aotc_q8_dots(const float* x, const int8_t* q, int64_t K, int64_t N,
                                int64_t c, const float* bias, float* out) {
    aotc_f16v acc[C][R] = {};
    const int8_t* w = q + c * K;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        aotc_f16v xv[R];
        for (int r = 0; r < R; ++r) xv[r] = *(const aotc_f16u*)(x + r * K + k);
        for (int j = 0; j < C; ++j) {
            const aotc_f16v wv = aotc_q8_load(w + j * K + k);
            for (int r = 0; r < R; ++r) acc[j][r] += wv * xv[r];
        }
    }
    for (int j = 0; j < C; ++j)
        for (int r = 0; r < R; ++r) {
            float s = aotc_hsum(acc[j][r]);
            for (int64_t i = k; i < K; ++i) s += (float)w[j * K + i] * x[r * K + i];
            out[r * N + c + j] = bias ? s + bias[c + j] : s;
        }
}
// int4's x, prepared once a call (aotc_q4_prepare): each row's 32 values a chunk as the 16
// even ones then the 16 odd ones (the low and high nibbles of 16 bytes need no interleave),
// then the row's sum over each group (the shift by 8 applied once a group: sum (n - 8) x =
// sum n x - 8 sum x); a row is K + K / G floats
template <int G>
static inline void aotc_q4_prepare(const float* x, int64_t M, int64_t K, float* xp) {
    for (int64_t r = 0; r < M; ++r) {
        const float* xr = x + r * K;
        float* p = xp + r * (K + K / G);
        for (int64_t k = 0; k < K; k += 32)
            for (int i = 0; i < 16; ++i) {
                p[k + i] = xr[k + 2 * i];
                p[k + 16 + i] = xr[k + 2 * i + 1];
            }
#if !defined(__AVX512F__)     // the group sums only aotc_q4_dot reads (not the table path)
        for (int64_t g = 0; g < K / G; ++g) {
            float sum = 0.0f;
            for (int64_t k = g * G; k < (g + 1) * G; ++k) sum += xr[k];
            p[K + g] = sum;
        }
#endif
    }
}
// rows of prepared x (aotc_q4_prepare) against int4 row c: packed [N, K/2], scales [N, K/G]
// (K a multiple of G, G of 32); each group's sum scaled once
template <int R, int G>
static inline void aotc_q4_dot(const float* xp, const uint8_t* q, const float* scale,
                               int64_t K, int64_t N, int64_t c, const float* bias, float* out) {
    const int64_t xs = K + K / G;
    aotc_f16v acc[R] = {};
    float shift[R] = {};
    const uint8_t* w = q + c * (K / 2);
    const float* sc = scale + c * (K / G);
    for (int64_t g = 0; g < K / G; ++g) {
        aotc_f16v gacc[R] = {};
        for (int64_t k = g * G; k < (g + 1) * G; k += 32) {
            const aotc_u16v u = *(const aotc_u16u*)(w + k / 2);
            const aotc_f16v lo = aotc_to_f(u & (uint8_t)15), hi = aotc_to_f(u >> 4);
            for (int r = 0; r < R; ++r) {
                gacc[r] += lo * *(const aotc_f16u*)(xp + r * xs + k);
                gacc[r] += hi * *(const aotc_f16u*)(xp + r * xs + k + 16);
            }
        }
        const float s = sc[g];
        for (int r = 0; r < R; ++r) {
            acc[r] += gacc[r] * s;
            shift[r] += s * xp[r * xs + K + g];
        }
    }
    for (int r = 0; r < R; ++r) {
        const float v = aotc_hsum(acc[r]) - 8.0f * shift[r];
        out[r * N + c] = bias ? v + bias[c] : v;
    }
}
#if defined(__AVX512F__)
// int4 where the level permutes 16 floats by a register's indices (vpermps): each group's 16
// weight values (nibble - 8) * scale, the float weights dequantize_int4 gives, are a table in
// one register, and a vector of nibbles (bytes widened to int32; the permute reads their low
// four bits, so the high nibble needs a shift and no mask) indexes it: a table lookup a 16
// weights where the portable path converts and scales. x prepared (aotc_q4_prepare; its
// group sums unused here); C weight rows at a time, two accumulators each (even and odd k)
template <int R, int C, int G>
static inline void aotc_q4_lut_dots(const float* xp, const uint8_t* q, const float* scale,
                                    int64_t K, int64_t N, int64_t c, const float* bias,
                                    float* out) {
    typedef int32_t aotc_n16v __attribute__((vector_size(64)));
    const aotc_f16v values = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
    const int64_t xs = K + K / G;
    aotc_f16v even[C][R] = {}, odd[C][R] = {};
    for (int64_t g = 0; g < K / G; ++g) {
        aotc_f16v table[C];
        for (int j = 0; j < C; ++j) table[j] = values * scale[(c + j) * (K / G) + g];
        for (int64_t k = g * G; k < (g + 1) * G; k += 32)
            for (int j = 0; j < C; ++j) {
                aotc_u16v u = *(const aotc_u16u*)(q + (c + j) * (K / 2) + k / 2);
                __asm__("" : "+x"(u));   // widened in a register (GCC 12 goes byte by byte)
                const aotc_n16v n = __builtin_convertvector(u, aotc_n16v);
                const aotc_f16v lo = __builtin_shuffle(table[j], n);
                const aotc_f16v hi = __builtin_shuffle(table[j], n >> 4);
                for (int r = 0; r < R; ++r) {
                    even[j][r] += lo * *(const aotc_f16u*)(xp + r * xs + k);
                    odd[j][r] += hi * *(const aotc_f16u*)(xp + r * xs + k + 16);
                }
            }
    }
    for (int j = 0; j < C; ++j)
        for (int r = 0; r < R; ++r) {
            const float v = aotc_hsum(even[j][r] + odd[j][r]);
            out[r * N + c + j] = bias ? v + bias[c + j] : v;
        }
}
#endif
// rows (1 to 8) of x against weight rows c .. c + C: int8 (G = 0) or int4 in groups of G
template <int R, int C, int G>
static inline void aotc_dots(const float* x, const void* q, const float* scale, int64_t K,
                             int64_t N, int64_t c, const float* bias, float* out) {
    if constexpr (G == 0) {
        aotc_q8_dots<R, C>(x, (const int8_t*)q, K, N, c, bias, out);
    } else {
#if defined(__AVX512F__)
        aotc_q4_lut_dots<R, C, G>(x, (const uint8_t*)q, scale, K, N, c, bias, out);
#else
        for (int j = 0; j < C; ++j)
            aotc_q4_dot<R, G>(x, (const uint8_t*)q, scale, K, N, c + j, bias, out);
#endif
    }
}
// R rows of x against the weight rows [c0, c1): 4 at a time for 1 or 2 rows (their
// accumulators fit the registers), else one; a row's sums are the same either way
template <int R, int G>
static inline void aotc_dot_block(const float* x, const void* q, const float* scale, int64_t K,
                                  int64_t N, int64_t c0, int64_t c1, const float* bias,
                                  float* out) {
    constexpr int C = R <= 2 ? 4 : 1;
    int64_t c = c0;
    for (; c + C <= c1; c += C) aotc_dots<R, C, G>(x, q, scale, K, N, c, bias, out);
    for (; c < c1; ++c) aotc_dots<R, 1, G>(x, q, scale, K, N, c, bias, out);
}
// out [M, N] = x [M, K] @ dequantized q^T (+ bias) for the columns [c0, c1), 8 rows a pass
// (int4: x prepared by aotc_q4_prepare)
template <int G>
static inline void aotc_dot_columns(const float* x, const void* q, const float* scale,
                                    int64_t M, int64_t K, int64_t N, int64_t c0, int64_t c1,
                                    const float* bias, float* out) {
    const int64_t xs = G ? K + K / (G ? G : 1) : K;     // int4: x prepared (aotc_q4_prepare)
    for (int64_t r0 = 0; r0 < M; r0 += 8) {
        const float* xr = x + r0 * xs;
        float* o = out + r0 * N;
        switch ((int)std::min<int64_t>(8, M - r0)) {
            case 1: aotc_dot_block<1, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
            case 2: aotc_dot_block<2, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
            case 3: aotc_dot_block<3, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
            case 4: aotc_dot_block<4, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
            case 5: aotc_dot_block<5, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
            case 6: aotc_dot_block<6, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
            case 7: aotc_dot_block<7, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
            default: aotc_dot_block<8, G>(xr, q, scale, K, N, c0, c1, bias, o); break;
        }
    }
}
// Many rows (prefill): a panel of AOTC_PANEL_COLS output columns dequantized once into a
// float buffer [K][AOTC_PANEL_COLS] (the weight rows transposed: L2-sized), then multiplied
// with AOTC_PANEL_ROWS rows of x at a time in registers, an outer product a k: each weight is
// converted once a call, not once per row block
#if defined(__AVX512F__)
#define AOTC_PANEL_VECTORS 4
#define AOTC_PANEL_ROWS 6
#else
#define AOTC_PANEL_VECTORS 1
#define AOTC_PANEL_ROWS 4
#endif
#define AOTC_PANEL_COLS (16 * AOTC_PANEL_VECTORS)
// 32 weights of row c from k on, dequantized (int8: its values; int4: (nibble - 8) * scale)
template <int G>
static inline void aotc_dequant32(const void* q, const float* scale, int64_t K, int64_t c,
                                  int64_t k, float* to) {
    if constexpr (G == 0) {
        const int8_t* w = (const int8_t*)q + c * K + k;
        if (k + 32 <= K) {
            *(aotc_f16u*)to = aotc_q8_load(w);
            *(aotc_f16u*)(to + 16) = aotc_q8_load(w + 16);
        } else {
            for (int64_t i = 0; i < 32; ++i) to[i] = k + i < K ? (float)w[i] : 0.0f;
        }
    } else {
        const uint8_t* w = (const uint8_t*)q + c * (K / 2) + k / 2;
        const float s = scale[c * (K / G) + k / G];
        *(aotc_f16u*)to = aotc_q4_load(w) * s;
        *(aotc_f16u*)(to + 16) = aotc_q4_load(w + 8) * s;
    }
}
// values k .. k + 32 of the columns c0 .. c0 + nb of the weight into the panel
// [K][AOTC_PANEL_COLS] (zeros past nb): the transposed writes of a block stay in the L1 cache
template <int G>
static inline void aotc_fill_panel(const void* q, const float* scale, int64_t K, int64_t c0,
                                   int nb, int64_t k, float* panel) {
    float v[32];
    const int64_t kn = std::min<int64_t>(32, K - k);
    for (int j = 0; j < AOTC_PANEL_COLS; ++j) {
        if (j < nb) aotc_dequant32<G>(q, scale, K, c0 + j, k, v);
        for (int64_t i = 0; i < kn; ++i)
            panel[(k + i) * AOTC_PANEL_COLS + j] = j < nb ? v[i] : 0.0f;
    }
}
// out[r, c0 + j] (r < R, j < nb) = x[r, :] . panel[:, j] (+ bias)
template <int R>
static inline void aotc_panel_rows(const float* x, const float* panel, int64_t K, int64_t N,
                                   int64_t c0, int nb, const float* bias, float* out) {
    aotc_f16v acc[R][AOTC_PANEL_VECTORS] = {};
    for (int64_t k = 0; k < K; ++k) {
        const float* p = panel + k * AOTC_PANEL_COLS;
        for (int r = 0; r < R; ++r) {
            const float xv = x[r * K + k];
            for (int v = 0; v < AOTC_PANEL_VECTORS; ++v)
                acc[r][v] += xv * *(const aotc_f16u*)(p + 16 * v);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int v = 0; v < AOTC_PANEL_VECTORS; ++v)
            for (int i = 0; i < 16; ++i) {
                const int j = 16 * v + i;
                if (j < nb) out[r * N + c0 + j] = bias ? acc[r][v][i] + bias[c0 + j] : acc[r][v][i];
            }
}
// rows r0 .. r0 + AOTC_PANEL_ROWS (fewer at the end) of the panel's product
static inline void aotc_panel_block(const float* x, const float* panel, int64_t M, int64_t K,
                                    int64_t N, int64_t c0, int nb, int64_t r0,
                                    const float* bias, float* out) {
    const float* xr = x + r0 * K;
    float* o = out + r0 * N;
    switch ((int)std::min<int64_t>(AOTC_PANEL_ROWS, M - r0)) {
        case 1: aotc_panel_rows<1>(xr, panel, K, N, c0, nb, bias, o); break;
        case 2: aotc_panel_rows<2>(xr, panel, K, N, c0, nb, bias, o); break;
        case 3: aotc_panel_rows<3>(xr, panel, K, N, c0, nb, bias, o); break;
#if AOTC_PANEL_ROWS > 4
        case 4: aotc_panel_rows<4>(xr, panel, K, N, c0, nb, bias, o); break;
        case 5: aotc_panel_rows<5>(xr, panel, K, N, c0, nb, bias, o); break;
        default: aotc_panel_rows<6>(xr, panel, K, N, c0, nb, bias, o); break;
#else
        default: aotc_panel_rows<4>(xr, panel, K, N, c0, nb, bias, o); break;
#endif
    }
}
// out [M, N] = x [M, K] @ dequantized q^T (+ bias), panel by panel through `panel` (a plan
// slot of K x 64 floats); inside a parallel region, its threads share each panel: they fill
// it by blocks of k, then multiply it by blocks of rows
template <int G>
static inline void aotc_panels(const float* x, const void* q, const float* scale, int64_t M,
                               int64_t K, int64_t N, const float* bias, float* out,
                               float* panel) {
    static_assert(AOTC_PANEL_COLS <= 64, "the panel slot holds 64 columns");
    for (int64_t c0 = 0; c0 < N; c0 += AOTC_PANEL_COLS) {
        const int nb = (int)std::min<int64_t>(AOTC_PANEL_COLS, N - c0);
        #pragma omp for schedule(static)
        for (int64_t k = 0; k < K; k += 32) aotc_fill_panel<G>(q, scale, K, c0, nb, k, panel);
        #pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < M; r0 += AOTC_PANEL_ROWS)
            aotc_panel_block(x, panel, M, K, N, c0, nb, r0, bias, out);
    }
}
#endif
