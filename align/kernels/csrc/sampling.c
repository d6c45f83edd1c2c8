/* Row reductions of the sampler over fp32 logits (CPU), each row on its own in a fixed order of operations, so a
   row's results do not depend on the other rows of the call (batch invariance).

   Built and loaded by align/kernels/native.py; align/inference/sampler.py checks shapes and dtypes and calls it.

   align_greedy: per row the first index of the maximum (argmax's tie rule) and logsumexp, in two passes over the
   row (max, then the sum of exp(x - max) in 16 lanes folded pairwise), instead of torch's chunk maxima + gather +
   log_softmax, which write a (R, V) result and read the logits four times. align_softmax_weights: the sampled rows'
   exp(x - max) weights, written once, with their fp32 sums per `chunk` tokens (16 lanes folded pairwise, the tail
   in order) and logsumexp from those sums in float64. align_inverse_cdf: sampler.inverse_cdf's two-level search
   with the same float64 operations in the same order (sequential cumulative sums, left-side searches), so it picks
   the token torch's ops pick, bit for bit.

   Rows are independent jobs split across `threads` workers (workers.h): the results do not depend on the thread
   count. Vectors and exp are simd.h's. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "workers.h"

/* a call splits its rows into jobs of at least this many. Measured (Intel Xeon, idle, 32k-token rows, ~19 us each on
   one thread; docs/MEASUREMENTS.md, ladder, 2026-12-06): 2 threads on 8 rows were 5-18% slower than one (the
   thread start), on 16 rows 8-26% faster, on 32-160 rows 1.4-1.9x faster. */
#define MIN_ROWS_PER_WORKER 8

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

typedef struct {
    const float *x;
    int64_t lo, hi, V, ld;
    int64_t *tok;
    float *logprob;
} GreedyJob;

static void *greedy_rows(void *arg) {
    const GreedyJob *j = arg;
    for (int64_t r = j->lo; r < j->hi; r++) {
        const float *row = j->x + r * j->ld;
        int64_t t;
        const float m = row_max(row, j->V, &t);
        const float lse = m + logf(row_exp_sum(row, j->V, m));
        j->tok[r] = t;
        j->logprob[r] = row[t] - lse;
    }
    return NULL;
}

static int64_t row_workers(int64_t threads, int64_t R) {
    return align_workers(threads, (R + MIN_ROWS_PER_WORKER - 1) / MIN_ROWS_PER_WORKER);
}

void align_greedy(const float *x, int64_t R, int64_t V, int64_t ld, int64_t *tok, float *logprob, int64_t threads) {
    threads = row_workers(threads, R);
    GreedyJob jobs[ALIGN_MAX_WORKERS];
    for (int64_t w = 0; w < threads; w++) {
        GreedyJob j = {x, R * w / threads, R * (w + 1) / threads, V, ld, tok, logprob};
        jobs[w] = j;
    }
    align_run_workers(greedy_rows, jobs, sizeof(GreedyJob), threads);
}

typedef struct {
    const float *x;
    int64_t lo, hi, V, ld, chunk;
    float *w;
    double *mass;
    float *lse;
} WeightsJob;

static void *weights_rows(void *arg) {
    const WeightsJob *j = arg;
    const int64_t V = j->V, chunk = j->chunk, nc = (V + chunk - 1) / chunk;
    for (int64_t r = j->lo; r < j->hi; r++) {
        const float *row = j->x + r * j->ld;
        float *wr = j->w + r * V;
        double *mr = j->mass + r * nc;
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
        j->lse[r] = (float)((double)m + log(total));
    }
    return NULL;
}

void align_softmax_weights(const float *x, int64_t R, int64_t V, int64_t ld, int64_t chunk, float *w,
                           double *mass, float *lse, int64_t threads) {
    threads = row_workers(threads, R);
    WeightsJob jobs[ALIGN_MAX_WORKERS];
    for (int64_t t = 0; t < threads; t++) {
        WeightsJob j = {x, R * t / threads, R * (t + 1) / threads, V, ld, chunk, w, mass, lse};
        jobs[t] = j;
    }
    align_run_workers(weights_rows, jobs, sizeof(WeightsJob), threads);
}

/* First index i in [0, n) with a[i] >= v (a non-decreasing; torch.searchsorted's left side), clamped to n - 1. */
static int64_t search_left(const double *a, int64_t n, double v) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < n ? lo : n - 1;
}

/* sampler.inverse_cdf for rows [lo, hi). `cum` holds nc doubles of scratch, `inner` chunk doubles. No product here
   is summed into another, so no FMA contraction can change a bit; the pragma below keeps it that way. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void inverse_cdf_row(const float *w, const double *mass, int64_t V, int64_t chunk, double u, double *cum,
                            double *inner, int64_t *tok) {
    const int64_t nc = (V + chunk - 1) / chunk;
    double run = 0.0;
    for (int64_t c = 0; c < nc; c++) cum[c] = run += mass[c];
    const double target = u * cum[nc - 1];
    const int64_t j = search_left(cum, nc, target);
    const double base = j > 0 ? cum[j - 1] : 0.0;
    double frac = (target - base) / mass[j];
    if (frac > 1.0) frac = 1.0;
    run = 0.0;
    for (int64_t k = 0; k < chunk; k++) {
        const int64_t v = j * chunk + k;
        inner[k] = run += v < V ? (double)w[v] : 0.0;
    }
    const double total = inner[chunk - 1];
    for (int64_t k = 0; k < chunk; k++) inner[k] = inner[k] / total;
    *tok = j * chunk + search_left(inner, chunk, frac);
}
#pragma GCC pop_options

/* tok[r] for R rows of weights w (R, V) with chunk masses (R, nc) and uniforms u (R,); 0, or -1 when scratch could
   not be allocated (nothing written). One thread: a row's search touches ~nc + chunk values. */
int align_inverse_cdf(const float *w, const double *mass, int64_t R, int64_t V, int64_t chunk, const double *u,
                      int64_t *tok) {
    const int64_t nc = (V + chunk - 1) / chunk;
    double *scratch = malloc((size_t)(nc + chunk) * sizeof(double));
    if (!scratch) return -1;
    for (int64_t r = 0; r < R; r++)
        inverse_cdf_row(w + r * V, mass + r * nc, V, chunk, u[r], scratch, scratch + nc, tok + r);
    free(scratch);
    return 0;
}
