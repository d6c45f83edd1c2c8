/* Row reductions of the sampler over fp32 logits (CPU), each row on its own in a fixed order of operations, so a
   row's results do not depend on the other rows of the call (batch invariance).

   Built and loaded by align/kernels/native.py; align/inference/sampler.py checks shapes and dtypes and calls it.

   align_greedy: per row the first index of the maximum (argmax's tie rule) and logsumexp, in two passes over the
   row (max, then the sum of exp(x - max) in 16 lanes folded pairwise), instead of torch's chunk maxima + gather +
   log_softmax, which write a (R, V) result and read the logits four times. align_softmax_weights: the sampled rows'
   exp(x - max) weights, written once, with their fp32 sums per `chunk` tokens (16 lanes folded pairwise, the tail
   in order) and logsumexp from those sums in float64: the inputs of sampler.inverse_cdf.
   exp is vexp.h's. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vexp.h"

static inline float fold16(v16 acc) {
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static float row_max(const float *x, int64_t V, int64_t *first) {
    float m = -INFINITY;
    int64_t v = 0;
    if (V >= 16) {
        v16 acc;
        memcpy(&acc, x, 64);
        for (v = 16; v + 16 <= V; v += 16) {
            v16 y;
            memcpy(&y, x + v, 64);
            acc = select16(y > acc, y, acc);
        }
        for (int i = 0; i < 16; i++) m = acc[i] > m ? acc[i] : m;
    }
    for (; v < V; v++) m = x[v] > m ? x[v] : m;
    if (first) {
        int64_t i = 0;
        for (; i + 16 <= V; i += 16) { /* skip whole vectors without the maximum */
            v16 y;
            memcpy(&y, x + i, 64);
            v16i hit = y == m;
            int any = 0;
            for (int l = 0; l < 16; l++) any |= hit[l];
            if (any) break;
        }
        while (i < V && !(x[i] == m)) i++;
        *first = i < V ? i : 0;
    }
    return m;
}

/* sum of exp(x - m) over the row: 16 lanes, then folded; the tail in order */
static float row_exp_sum(const float *x, int64_t V, float m) {
    v16 acc = {0};
    int64_t v = 0;
    for (; v + 16 <= V; v += 16) {
        v16 y;
        memcpy(&y, x + v, 64);
        acc += exp16(y - m);
    }
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
            v16 acc = {0};
            for (; v + 16 <= end; v += 16) {
                v16 y;
                memcpy(&y, row + v, 64);
                y = exp16(y - m);
                y = select16(y < 1e-37f, (v16){0}, y); /* a masked (-inf) logit: weight exactly 0, never sampled */
                memcpy(wr + v, &y, 64);
                acc += y;
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
