// aotc vectorizable float math. glibc's expf/tanhf/erff are scalar calls that stop the compiler
// from vectorizing a loop; these branch-free versions inline and vectorize under
// `#pragma omp simd`, with no dependence on the host's libm vector ABI (artifacts run on any
// glibc). Accuracy: exp within 2 ulp (Cephes polynomial), tanh and erf within ~2e-7 absolute.

static inline float aotc_bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

static inline float aotc_expf(float x) {
    float xc = std::min(std::max(x, -103.9f), 88.72283f);
    float n = std::nearbyint(xc * 1.44269504088896341f);
    float r = xc - n * 0.693359375f - n * -2.12194440e-4f;
    float z = r * r;
    float p = ((((1.9875691500E-4f * r + 1.3981999507E-3f) * r + 8.3334519073E-3f) * r
                + 4.1665795894E-2f) * r + 1.6666665459E-1f) * r + 5.0000001201E-1f;
    p = p * z + r + 1.0f;
    // 2^n in two halves so that n down to -150 (subnormal results) stays exact
    int32_t ni = (int32_t)n;
    int32_t h = ni / 2;
    float s1 = aotc_bits_to_float((uint32_t)(h + 127) << 23);
    float s2 = aotc_bits_to_float((uint32_t)(ni - h + 127) << 23);
    float y = p * s1 * s2;
    y = x > 88.72283f ? std::numeric_limits<float>::infinity() : y;
    y = x < -103.9f ? 0.0f : y;
    return x != x ? x : y;
}

static inline float aotc_tanhf(float x) {
    float a = std::fabs(x);
    float e = aotc_expf(2.0f * std::min(a, 9.0f));
    float big = 1.0f - 2.0f / (e + 1.0f);
    float s = x * x;
    float small = ((((-5.70498872745E-3f * s + 2.06390887954E-2f) * s - 5.37397155531E-2f) * s
                    + 1.33314422036E-1f) * s - 3.33332819422E-1f) * s * a + a;
    float y = a < 0.625f ? small : big;
    y = std::copysign(y, x);
    return x != x ? x : y;
}

static inline float aotc_erff(float x) {
    float a = std::fabs(x);
    // |x| < 0.5: Taylor series of erf; else 1 - erfc with erfc from a Chebyshev fit
    float s = a * a;
    float small = a * (1.12837916709551257f + s * (-0.37612638903183752f + s * (
        0.11283791670955126f + s * (-0.02686617064513125f + s * (0.00522397762544218f
        + s * -0.00085483269811297f)))));
    float t = 1.0f / (1.0f + 0.5f * a);
    float poly = -a * a - 1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f
        + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f
        + t * (-0.82215223f + t * 0.17087277f))))))));
    float big = 1.0f - t * aotc_expf(poly);
    float y = a < 0.5f ? small : big;
    y = std::copysign(y, x);
    return x != x ? x : y;
}

static inline float aotc_sigmoidf(float x) { return 1.0f / (1.0f + aotc_expf(-x)); }
