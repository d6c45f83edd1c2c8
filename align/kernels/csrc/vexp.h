/* exp for the softmaxes of align's C kernels, 16 lanes at a time (GCC vector extensions, no -ffast-math):
   Cody-Waite range reduction x = k ln2 + r, |r| <= ln2 / 2, then a degree-7 Taylor polynomial of exp(r), scaled
   by 2^k through the exponent bits. Relative error < 2e-7 on (-87, 0]; inputs are clamped to -87 (exp(-87) ~
   1.6e-38, a weight of 0 to fp32 precision beside the maximum's 1), so -inf gives ~1.6e-38, never NaN.
   Every lane is computed alone, so a value's exp does not depend on its neighbours. */
#ifndef ALIGN_VEXP_H
#define ALIGN_VEXP_H

#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

/* lanes of a where the mask is set, else of b (a vector ?: is C++ only) */
static inline v16 select16(v16i mask, v16 a, v16 b) {
    return (v16)((mask & (v16i)a) | (~mask & (v16i)b));
}

static inline v16 exp16(v16 a) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f, ln2_lo = 1.428606765330187e-06f;
    const float shift = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits */
    const v16 lo = (v16){0} - 87.0f;
    a = select16(a < lo, lo, a);
    v16 t = a * log2e + shift;
    v16 k = t - shift;
    v16 r = (a - k * ln2_hi) - k * ln2_lo;
    v16 p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    v16i ki;
    memcpy(&ki, &t, 64);
    ki = (ki - 0x4B400000 + 127) << 23; /* the bits of `shift` leave k, an integer in [-126, 0]: 2^k */
    v16 scale;
    memcpy(&scale, &ki, 64);
    return p * scale;
}

static inline float exp1(float a) {
    v16 x = {0};
    x[0] = a;
    return exp16(x)[0];
}

#endif
