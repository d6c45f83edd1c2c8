/* Attention of a flat batch of query tokens over a paged KV cache, read in place (CPU).

   Built and loaded by align/kernels/native.py (cc -O3 -march=native, ctypes); the caller in
   align/inference/paged_attention.py checks every shape, dtype and index before calling, so nothing here
   re-validates.

   Token t of the step belongs to row tok_row[t] (-1: a padding token, whose output is zeros) and sits at position
   tok_pos[t]; it attends to its row's keys lo..tok_pos[t] (lo = tok_pos[t] - window + 1 with a sliding window,
   else 0). Key j of a row lives in block block_tables[row][j / bs] at offset j % bs. The cache layout is this
   kernel's own: keys (blocks, KVH, Dh, bs), i.e. transposed within a block, so 16 consecutive keys' d-th
   components are one vector and a query's scores for 16 keys are Dh broadcast multiply-adds with no horizontal
   sums; values (blocks, KVH, bs, Dh), accumulated in registers. bs and Dh are multiples of 16 (checked by the
   caller). The G = H / KVH query heads of one KV head are computed together, so each key and value vector is read
   once for all of them; a block's slice of one head is one contiguous run, and the next block of the row is
   prefetched while one is read (blocks are scattered; the hardware prefetcher only follows the run it is in).

   Every (token, KV head) pair is computed on its own, in one fixed order of operations whatever else is in the
   batch: a token's result is bitwise the same alone, in any batch, decoded or in a prefill chunk, on any number of
   threads. Scores sum over d in order, the softmax's max and sum run in key order, values accumulate in key order;
   all in fp32 for both cache dtypes (fp32, bf16). Vectors and exp are simd.h's (their width is the ISA's; the
   tiles below fit its registers). */

#include <stdint.h>
#include <string.h>

#include "simd.h"
#include "workers.h"

typedef struct {
    const float *q;              /* (N, H, Dh) fp32 */
    const void *k;               /* (blocks, KVH, Dh, bs): a block's keys of one head, transposed */
    const void *v;               /* (blocks, KVH, bs, Dh) */
    const int64_t *tables;       /* (R, nb) */
    const int64_t *tok_row, *tok_pos;
    float *out;                  /* (N, H, Dh) fp32 */
    float *scratch;              /* per worker, see align_paged_attention_scratch */
    int64_t nb, N, H, KVH, Dh, bs, window, max_keys, bf16;
    float scale;
    int64_t first, last;         /* this worker's (token, kv head) items */
} Job;

/* VL consecutive cache values at element index idx, as fp32 (bf16 is the top half of an fp32). */
static inline vf loadc(const Job *j, const void *base, int64_t idx) {
    return j->bf16 ? load_bf16((const uint16_t *)base + idx) : loadv((const float *)base + idx);
}

static inline void prefetch(const void *base, int64_t idx, int64_t n, int64_t esz) {
    const char *p = (const char *)base + idx * esz;
    for (int64_t b = 0; b < n * esz; b += 64) __builtin_prefetch(p + b);
}

/* exp(x - max) for x <= max, in place over n values; returns their sum (in index order). */
static float exp_sum(float *x, int64_t n, float max) {
    int64_t i = 0;
    for (; i + VL <= n; i += VL) storev(x + i, expv(loadv(x + i) - max));
    for (; i < n; i++) x[i] = exp1(x[i] - max);
    float s = 0.0f;
    for (i = 0; i < n; i++) s += x[i];
    return s;
}

/* query heads scored together against a chunk of 16 keys: SG x NV16 accumulators */
#define SG (ACC_BUDGET / NV16 < 4 ? ACC_BUDGET / NV16 : 4)

/* Scores of query heads g0..g0+ng-1 (ng <= SG) against the 16 keys of one chunk: s[g * stride + 0..15]. */
static inline void scores16(const Job *j, const float *qs, int64_t g0, int64_t ng, int64_t kidx, float *s,
                            int64_t stride) {
    const int64_t Dh = j->Dh, bs = j->bs;
    vf a[SG][NV16];
    for (int g = 0; g < SG; g++)
        for (int h = 0; h < NV16; h++) a[g][h] = splat(0.0f);
    const float *q0 = qs + g0 * Dh;
    for (int64_t d = 0; d < Dh; d++)
        for (int h = 0; h < NV16; h++) {
            const vf k = loadc(j, j->k, kidx + d * bs + h * VL);
            for (int g = 0; g < SG; g++)
                if (g < ng) a[g][h] += q0[g * Dh + d] * k;
        }
    for (int g = 0; g < SG && g < ng; g++)
        for (int h = 0; h < NV16; h++) storev(s + (g0 + g) * stride + h * VL, a[g][h]);
}

/* query heads per PV sweep of a CV-vector column slice: GB x CV accumulators within the budget */
#define PV_GB(CV) (ACC_BUDGET / (CV) < 4 ? ACC_BUDGET / (CV) : 4)

/* acc[g][.] = sum over the item's valid keys of w[g][key] * V[key][col .. col + CV * VL) for query heads
   g0..g0+min(GB, ng)-1, with the accumulators held in registers, then written to out scaled by 1 / sums[g]. */
#define DEFINE_PV(CV)                                                                                            \
    static void pv_##CV(const Job *j, const int64_t *table, int64_t h, int64_t lo, int64_t n, const float *w,    \
                        int64_t stride, int64_t g0, int64_t ng, const float *sums, float *outp, int64_t col) {   \
        enum { GB = PV_GB(CV) };                                                                                 \
        const int64_t bs = j->bs, Dh = j->Dh, esz = j->bf16 ? 2 : 4;                                             \
        vf acc[GB][CV];                                                                                          \
        for (int g = 0; g < GB; g++)                                                                             \
            for (int c = 0; c < CV; c++) acc[g][c] = splat(0.0f);                                                \
        int64_t i = 0, blk = lo / bs, off = lo % bs;                                                             \
        const int64_t last_blk = (lo + n - 1) / bs;                                                              \
        while (i < n) {                                                                                          \
            const int64_t base = (table[blk] * j->KVH + h) * bs * Dh;                                            \
            if (blk < last_blk) prefetch(j->v, (table[blk + 1] * j->KVH + h) * bs * Dh, bs * Dh, esz);            \
            for (; off < bs && i < n; off++, i++) {                                                              \
                vf vr[CV];                                                                                       \
                for (int c = 0; c < CV; c++) vr[c] = loadc(j, j->v, base + off * Dh + col + c * VL);             \
                for (int g = 0; g < GB; g++)                                                                     \
                    if (g < ng) {                                                                                \
                        const float wg = w[(g0 + g) * stride + i];                                               \
                        for (int c = 0; c < CV; c++) acc[g][c] += wg * vr[c];                                    \
                    }                                                                                            \
            }                                                                                                    \
            blk++;                                                                                               \
            off = 0;                                                                                             \
        }                                                                                                        \
        for (int g = 0; g < GB && g < ng; g++) {                                                                 \
            const float inv = 1.0f / sums[g0 + g];                                                               \
            for (int c = 0; c < CV; c++) storev(outp + (g0 + g) * Dh + col + c * VL, acc[g][c] * inv);            \
        }                                                                                                        \
    }
DEFINE_PV(1)
DEFINE_PV(2)
DEFINE_PV(4)
DEFINE_PV(8)

/* the widest column slice (vectors) the budget allows for rows of nv vectors */
static int slice_vectors(int64_t nv) {
    int cv = 8;
    while (cv > 1 && (cv > nv || cv > ACC_BUDGET)) cv /= 2;
    return cv;
}

static void attend(const Job *j, int64_t t, int64_t h, float *scratch) {
    const int64_t G = j->H / j->KVH, Dh = j->Dh, bs = j->bs, esz = j->bf16 ? 2 : 4;
    float *outp = j->out + (t * j->H + h * G) * Dh;
    const int64_t row = j->tok_row[t];
    if (row < 0) {
        memset(outp, 0, (size_t)(G * Dh) * sizeof(float));
        return;
    }
    const int64_t pos = j->tok_pos[t];
    const int64_t lo = (j->window > 0 && pos - j->window + 1 > 0) ? pos - j->window + 1 : 0;
    const int64_t n = pos - lo + 1;
    const int64_t *table = j->tables + row * j->nb;
    const int64_t c0 = lo / 16, nc = pos / 16 - c0 + 1, stride = nc * 16;
    float *qs = scratch;                      /* (G, Dh) scaled queries */
    float *s = scratch + G * Dh;              /* (G, nc * 16) scores of whole 16-key chunks, then weights */
    float sums[256];                          /* H <= 256 checked by the caller */
    const float *qp = j->q + (t * j->H + h * G) * Dh;
    for (int64_t x = 0; x < G * Dh; x++) qs[x] = qp[x] * j->scale;
    for (int64_t c = 0; c < nc; c++) {
        const int64_t key = (c0 + c) * 16, blk = table[key / bs];
        const int64_t kidx = (blk * j->KVH + h) * Dh * bs + key % bs;
        if (key % bs == 0 && key + bs <= pos)  /* entering a block with another after it: fetch that one */
            prefetch(j->k, (table[key / bs + 1] * j->KVH + h) * Dh * bs, Dh * bs, esz);
        for (int64_t g0 = 0; g0 < G; g0 += SG) scores16(j, qs, g0, G - g0 < SG ? G - g0 : SG, kidx, s + c * 16, stride);
    }
    const int64_t skip = lo - c0 * 16;  /* keys of the first chunk before lo (the last chunk's past pos are unused) */
    for (int64_t g = 0; g < G; g++) {
        float *sg = s + g * stride + skip;
        float m = sg[0];
        for (int64_t i = 1; i < n; i++) m = sg[i] > m ? sg[i] : m;
        sums[g] = exp_sum(sg, n, m);
    }
    const float *w = s + skip;
    /* V in column slices of cv vectors (the whole head row where the budget allows), the rest one vector a time */
    const int cv = slice_vectors(Dh / VL);
    for (int64_t col = 0; col < Dh;) {
        const int step = col + cv * VL <= Dh ? cv : 1;
        for (int64_t g0 = 0; g0 < G; g0 += PV_GB(step)) {
            switch (step) { /* direct calls, so each sweep is inlined with its constants */
            case 8: pv_8(j, table, h, lo, n, w, stride, g0, G - g0, sums, outp, col); break;
            case 4: pv_4(j, table, h, lo, n, w, stride, g0, G - g0, sums, outp, col); break;
            case 2: pv_2(j, table, h, lo, n, w, stride, g0, G - g0, sums, outp, col); break;
            default: pv_1(j, table, h, lo, n, w, stride, g0, G - g0, sums, outp, col);
            }
        }
        col += step * VL;
    }
}

static void *run(void *arg) {
    const Job *j = (const Job *)arg;
    for (int64_t item = j->first; item < j->last; item++) attend(j, item / j->KVH, item % j->KVH, j->scratch);
    return NULL;
}

/* Scratch floats one worker needs (the caller allocates threads * this). */
int64_t align_paged_attention_scratch(int64_t H, int64_t KVH, int64_t Dh, int64_t max_keys) {
    return (H / KVH) * (Dh + max_keys + 32);
}

/* Returns 0, or -1 when a worker thread could not be started (its items then run on the calling thread). */
int align_paged_attention(const float *q, const void *k, const void *v, int64_t bf16, const int64_t *tables,
                          int64_t nb, const int64_t *tok_row, const int64_t *tok_pos, int64_t N, int64_t H,
                          int64_t KVH, int64_t Dh, int64_t bs, int64_t window, float scale, float *out,
                          float *scratch, int64_t max_keys, int64_t threads) {
    const int64_t items = N * KVH, per_worker = align_paged_attention_scratch(H, KVH, Dh, max_keys);
    threads = align_workers(threads, items);
    Job jobs[ALIGN_MAX_WORKERS];
    for (int64_t w = 0; w < threads; w++) {
        Job j = {q, k, v, tables, tok_row, tok_pos, out, scratch + w * per_worker, nb, N, H, KVH, Dh, bs, window,
                 max_keys, bf16, scale, items * w / threads, items * (w + 1) / threads};
        jobs[w] = j;
    }
    return align_run_workers(run, jobs, sizeof(Job), threads);
}

/* ---- RoPE and the KV write of a step, before its attention ---- */

/* fp32 -> bf16, rounding to nearest even as torch's .to(torch.bfloat16) does (NaN stays a quiet NaN). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* NOTE: no FMA contraction here, so the rotation rounds exactly as the model's apply_rope (x * cos +
   rotate_half(x) * sin: two rounded products, one rounded sum) and q, k are bitwise the model's. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void rotate(const float *x, const float *c, const float *s, int64_t Dh, float *out) {
    const int64_t half = Dh / 2;
    for (int64_t d = 0; d < half; d++) out[d] = x[d] * c[d] + (-x[d + half]) * s[d];
    for (int64_t d = half; d < Dh; d++) out[d] = x[d] * c[d] + x[d - half] * s[d];
}
#pragma GCC pop_options

typedef struct {
    const float *qkv, *cos, *sin;
    const int64_t *slots;
    float *q;
    void *k, *v;
    int64_t ld, H, KVH, Dh, bs, bf16, first, last;
} RopeJob;

static inline void store(const RopeJob *j, void *base, int64_t idx, float x) {
    if (j->bf16) ((uint16_t *)base)[idx] = to_bf16(x);
    else ((float *)base)[idx] = x;
}

static void *rope_run(void *arg) {
    const RopeJob *j = (const RopeJob *)arg;
    const int64_t H = j->H, KVH = j->KVH, Dh = j->Dh, bs = j->bs;
    float kr[1024];  /* Dh <= 1024 checked by the caller */
    for (int64_t t = j->first; t < j->last; t++) {
        const float *row = j->qkv + t * j->ld, *c = j->cos + t * Dh, *s = j->sin + t * Dh;
        for (int64_t h = 0; h < H; h++) rotate(row + h * Dh, c, s, Dh, j->q + (t * H + h) * Dh);
        const int64_t blk = j->slots[t] / bs, off = j->slots[t] % bs;
        for (int64_t h = 0; h < KVH; h++) {
            rotate(row + (H + h) * Dh, c, s, Dh, kr);
            const float *vr = row + (H + KVH + h) * Dh;
            const int64_t kbase = (blk * KVH + h) * Dh * bs + off, vbase = ((blk * KVH + h) * bs + off) * Dh;
            for (int64_t d = 0; d < Dh; d++) {
                store(j, j->k, kbase + d * bs, kr[d]);
                store(j, j->v, vbase + d, vr[d]);
            }
        }
    }
    return NULL;
}

/* qkv (N, ld) fp32: each token's q (H heads), k, v (KVH heads each) side by side; cos, sin (N, Dh) fp32.
   Writes the rotated queries to q (N, H, Dh) and the rotated keys and the values at their slots of one layer's
   cache (the layout above). Returns 0, or -1 when a worker thread could not be started. */
int align_rope_write_kv(const float *qkv, int64_t ld, int64_t N, int64_t H, int64_t KVH, int64_t Dh,
                        const float *cos, const float *sin, const int64_t *slots, float *q, void *k, void *v,
                        int64_t bs, int64_t bf16, int64_t threads) {
    threads = align_workers(threads, N);
    RopeJob jobs[ALIGN_MAX_WORKERS];
    for (int64_t w = 0; w < threads; w++) {
        RopeJob j = {qkv, cos, sin, slots, q, k, v, ld, H, KVH, Dh, bs, bf16, N * w / threads, N * (w + 1) / threads};
        jobs[w] = j;
    }
    return align_run_workers(rope_run, jobs, sizeof(RopeJob), threads);
}
