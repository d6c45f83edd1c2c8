/* The per-row statistics and the logits gradient of the fused linear + cross-entropy head (align/kernels/fused_ce.py)
   over a [rows, V] fp32 logits chunk, in place, one row at a time.

   Why C: torch's log_softmax, exp_ and a batched dot are three ops, each a pass over the whole [chunk, V] block
   (56 MB for a micro-batch of ~430 label tokens at V = 32768) and each bound by memory on a CPU; they took ~40% of
   the head's time on an AMD EPYC (docs/MEASUREMENTS.md, ladder, 2026-12-04). Here a row (V floats: 128 KB, in L2)
   is read three times while it is in cache: its maximum m; then e_v = exp(x_v - m), the sum s = sum e_v and
   d = sum e_v (x_v - m); then, when a gradient is wanted, x_v <- e_v * coef / s with coef = 1 + 2 z lse, and
   x_y -= 1 (d loss / d logits). Per row:
       lse = m + log s,  ce = lse - x_y,  entropy H = lse - sum p_v x_v = log s - d / s.
   Sums are 16 lanes folded pairwise, the tail in order (simd.h), so a row's results depend neither on the other
   rows, nor on the thread count, nor on the vector width. Rows are split over `threads` workers (workers.h). */

#include <math.h>
#include <stdint.h>

#include "simd.h"
#include "workers.h"

/* s = sum exp(x - m) and d = sum exp(x - m) * (x - m); with `store`, x is overwritten by exp(x - m) */
static void row_exp_sums(float *x, int64_t V, float m, int store, float *s_out, float *d_out) {
    vf acc_s[NV16] = {{0}}, acc_d[NV16] = {{0}};
    int64_t v = 0;
    for (; v + 16 <= V; v += 16)
        for (int h = 0; h < NV16; h++) {
            const vf t = loadv(x + v + h * VL) - m;
            const vf e = expv(t);
            acc_s[h] += e;
            acc_d[h] += e * t;
            if (store) storev(x + v + h * VL, e);
        }
    float s = fold16(acc_s), d = fold16(acc_d);
    for (; v < V; v++) {
        const float t = x[v] - m, e = exp1(t);
        s += e;
        d += e * t;
        if (store) x[v] = e;
    }
    *s_out = s;
    *d_out = d;
}

static void row_scale(float *x, int64_t V, float a) {
    int64_t v = 0;
    const vf av = splat(a);
    for (; v + VL <= V; v += VL) storev(x + v, loadv(x + v) * av);
    for (; v < V; v++) x[v] *= a;
}

typedef struct {
    float *x;
    const int64_t *y;
    int64_t r0, r1, V, ld;
    float z;
    int grad;
    float *lse, *ce, *ent;
} Job;

static void *run_rows(void *arg) {
    const Job *j = (const Job *)arg;
    for (int64_t r = j->r0; r < j->r1; r++) {
        float *row = j->x + r * j->ld;
        const int64_t y = j->y[r];
        const float xy = row[y], m = row_maxv(row, j->V);
        float s, d;
        row_exp_sums(row, j->V, m, j->grad, &s, &d);
        const float ls = logf(s), lse = m + ls;
        j->lse[r] = lse;
        j->ce[r] = lse - xy;
        j->ent[r] = ls - d / s;
        if (j->grad) {
            row_scale(row, j->V, (1.0f + 2.0f * j->z * lse) / s);
            row[y] -= 1.0f;
        }
    }
    return NULL;
}

/* x: R rows of V fp32 logits, row stride ld; y: R targets in [0, V). Writes lse, ce, entropy (R each); with
   grad != 0 the rows become d loss / d logits (see the header), else they are left as they were. Returns 0, or -1
   when a worker thread could not be started (its rows then ran on the calling thread: the results are complete). */
int align_ce_rows(float *x, int64_t R, int64_t V, int64_t ld, const int64_t *y, float z, int64_t grad,
                  int64_t threads, float *lse, float *ce, float *ent) {
    Job jobs[ALIGN_MAX_WORKERS];
    const int64_t n = align_workers(threads, R);
    for (int64_t w = 0; w < n; w++)
        jobs[w] = (Job){x, y, R * w / n, R * (w + 1) / n, V, ld, z, (int)(grad != 0), lse, ce, ent};
    return align_run_workers(run_rows, jobs, sizeof(Job), n);
}

/* out[r] = sum_v a[r, v] * b[r, v], 16 lanes folded pairwise, the tail in order. The torch rows' entropy dot
   <p, logits> (fused_ce._chunk_stats): torch's batched dot ran as a batch of GEMVs at ~2.5 GB/s, 10% of a tiny SFT
   step (docs/MEASUREMENTS.md, ladder, 2026-12-06); this reads both rows once at memory speed. */
typedef struct {
    const float *a, *b;
    int64_t r0, r1, V, lda, ldb;
    float *out;
} DotJob;

static void *run_dots(void *arg) {
    const DotJob *j = (const DotJob *)arg;
    for (int64_t r = j->r0; r < j->r1; r++) {
        const float *a = j->a + r * j->lda, *b = j->b + r * j->ldb;
        vf acc[NV16] = {{0}};
        int64_t v = 0;
        for (; v + 16 <= j->V; v += 16)
            for (int h = 0; h < NV16; h++) acc[h] += loadv(a + v + h * VL) * loadv(b + v + h * VL);
        float s = fold16(acc);
        for (; v < j->V; v++) s += a[v] * b[v];
        j->out[r] = s;
    }
    return NULL;
}

int align_row_dots(const float *a, const float *b, int64_t R, int64_t V, int64_t lda, int64_t ldb, int64_t threads,
                   float *out) {
    DotJob jobs[ALIGN_MAX_WORKERS];
    const int64_t n = align_workers(threads, R);
    for (int64_t w = 0; w < n; w++) jobs[w] = (DotJob){a, b, R * w / n, R * (w + 1) / n, V, lda, ldb, out};
    return align_run_workers(run_dots, jobs, sizeof(DotJob), n);
}
