/* Row reductions of the sampler over fp32 logits (CPU), each row on its own in a fixed order of operations, so a
   row's results do not depend on the other rows of the call (batch invariance).

   Built and loaded by align/kernels/native.py; align/inference/sampler.py checks shapes and dtypes and calls it.

   align_greedy: per row the first index of the maximum (argmax's tie rule) and logsumexp, in two passes over the
   row (max, then the sum of exp(x - max) in 16 lanes folded pairwise), instead of torch's chunk maxima + gather +
   log_softmax, which write a (R, V) result and read the logits four times. align_softmax_weights: the sampled rows'
   exp(x - max) weights, written once, with their fp32 sums per `chunk` tokens (16 lanes folded pairwise, the tail
   in order) and logsumexp from those sums in float64: the inputs of sampler.inverse_cdf.
   Vectors and exp are simd.h's. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "simd.h"

static float row_max(const float *x, int64_t V, int64_t *first) {
    const float m = row_maxv(x, V);
    if (first) {
        int64_t i = 0;
        for (; i + VL <= V; i += VL) { /* skip whole vectors without the maximum */
            const vi hit = loadv(x + i) == m;
            int any = 0;
            for (int l = 0; l < VL; l++) any |= hit[l];
            if (any) break;
        }
        while (i < V && !(x[i] == m)) i++;
        *first = i < V ? i : 0;
    }
    return m;
}

/* sum of exp(x - m) over the row: 16 lanes, then folded; the tail in order */
static float row_exp_sum(const float *x, int64_t V, float m) {
    vf acc[NV16] = {{0}};
    int64_t v = 0;
    for (; v + 16 <= V; v += 16)
        for (int h = 0; h < NV16; h++) acc[h] += expv(loadv(x + v + h * VL) - m);
    float s = fold16(acc);
    for (; v < V; v++) s += exp1(x[v] - m);
    return s;
}

void align_greedy(const float *x, int64_t R, int64_t V, int64_t ld, int64_t *tok, float *logprob) {
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * ld;
        int64_t t;
        const float m = row_max(row, V, &t);
        const float lse = m + logf(row_exp_sum(row, V, m));
        tok[r] = t;
        logprob[r] = row[t] - lse;
    }
}

void align_softmax_weights(const float *x, int64_t R, int64_t V, int64_t ld, int64_t chunk, float *w,
                           double *mass, float *lse) {
    const int64_t nc = (V + chunk - 1) / chunk;
    for (int64_t r = 0; r < R; r++) {
        const float *row = x + r * ld;
        float *wr = w + r * V;
        double *mr = mass + r * nc;
        const float m = row_max(row, V, NULL);
        double total = 0.0;
        for (int64_t c = 0; c < nc; c++) {
            const int64_t end = (c + 1) * chunk < V ? (c + 1) * chunk : V;
            int64_t v = c * chunk;
            vf acc[NV16] = {{0}};
            for (; v + 16 <= end; v += 16)
                for (int h = 0; h < NV16; h++) {
                    vf y = expv(loadv(row + v + h * VL) - m);
                    y = selectv(y < 1e-37f, splat(0.0f), y); /* a masked (-inf) logit: weight 0, never sampled */
                    storev(wr + v + h * VL, y);
                    acc[h] += y;
                }
            float s = fold16(acc);
            for (; v < end; v++) {
                const float e = exp1(row[v] - m);
                wr[v] = e < 1e-37f ? 0.0f : e;
                s += wr[v];
            }
            mr[c] = s;
            total += s;
        }
        lse[r] = (float)((double)m + log(total));
    }
}
