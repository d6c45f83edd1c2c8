/* The vector type of the build's ISA and the kernels' exp, in GCC vector extensions (no intrinsics, no
   -ffast-math).

   Why a width of the ISA's and not a fixed 16 floats: GCC lowers a vector wider than the target's registers into
   pieces with stack traffic between them (a 64-byte vector on an AVX2 build ran the matmul at 8 GMAC/s instead of
   ~90, the attention 3-10x slower than torch's path), so every kernel computes in `vf`, VL floats: 16 with
   AVX-512, 8 with AVX, 4 otherwise (SSE, NEON). Where a kernel's order of operations is defined over 16 lanes (a
   16-lane partial sum folded pairwise, a panel of 16 columns), it holds NV16 = 16 / VL vectors for them, so the
   arithmetic, and with FMA hardware every result, is the same on every width.

   expv: Cody-Waite range reduction x = k ln2 + r, |r| <= ln2 / 2, then a degree-7 Taylor polynomial of exp(r),
   scaled by 2^k through the exponent bits. Relative error < 2e-7 on (-87, 0]; inputs are clamped to -87 (exp(-87)
   ~ 1.6e-38, a weight of 0 to fp32 precision beside the maximum's 1), so -inf gives ~1.6e-38, never NaN. Every
   lane is computed alone, so a value's exp depends neither on its neighbours nor on the vector width. */
#ifndef ALIGN_SIMD_H
#define ALIGN_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
#define NV16 (16 / VL) /* vectors per 16 lanes */

/* vector registers the kernels may fill with accumulators: 32 registers with AVX-512 and on AArch64, 16 else */
#if defined(__AVX512F__) || defined(__aarch64__)
#define ACC_BUDGET 16
#else
#define ACC_BUDGET 8
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));
typedef uint16_t vh __attribute__((vector_size(VL * 2)));

static inline vf loadv(const float *p) {
    vf x;
    memcpy(&x, p, sizeof x);
    return x;
}

static inline void storev(float *p, vf x) { memcpy(p, &x, sizeof x); }

/* VL bf16 values (the top halves of fp32s) as fp32 */
static inline vf load_bf16(const uint16_t *p) {
    vh h;
    memcpy(&h, p, sizeof h);
    vu u = __builtin_convertvector(h, vu) << 16;
    vf x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline vf splat(float a) { return (vf){0} + a; }

/* lanes of a where the mask is set, else of b (a vector ?: is C++ only) */
static inline vf selectv(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }

static inline vf expv(vf a) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f, ln2_lo = 1.428606765330187e-06f;
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits */
    const vf lo = splat(-87.0f);
    a = selectv(a < lo, lo, a);
    vf t = a * log2e + shift;
    vf k = t - shift;
    vf r = (a - k * ln2_hi) - k * ln2_lo;
    vf p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vi ki;
    memcpy(&ki, &t, sizeof ki);
    ki = (ki - 0x4B400000 + 127) << 23; /* the bits of `shift` leave k, an integer in [-126, 0]: 2^k */
    vf scale;
    memcpy(&scale, &ki, sizeof scale);
    return p * scale;
}

static inline float exp1(float a) { return expv(splat(a))[0]; }

/* the sum of 16 lanes held as NV16 vectors, folded pairwise: (l + l+8), then (+4), then (0+2)+(1+3) */
static inline float fold16(const vf *acc) {
    float s[16], s8[8], s4[4];
    for (int h = 0; h < NV16; h++) storev(s + h * VL, acc[h]);
    for (int i = 0; i < 8; i++) s8[i] = s[i] + s[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* the maximum of a row: lane-wise maxima, then over the lanes (exact in any order); the tail in order */
static inline float row_maxv(const float *x, int64_t V) {
    float m = -INFINITY;
    int64_t v = 0;
    if (V >= VL) {
        vf acc = loadv(x);
        for (v = VL; v + VL <= V; v += VL) {
            const vf y = loadv(x + v);
            acc = selectv(y > acc, y, acc);
        }
        for (int i = 0; i < VL; i++) m = acc[i] > m ? acc[i] : m;
    }
    for (; v < V; v++) m = x[v] > m ? x[v] : m;
    return m;
}

#endif
