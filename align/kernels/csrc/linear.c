/* y (M, N) = x (M, K) @ W^T (+ residual) in fp32 on weights packed once into 16-column panels (CPU).

   Built and loaded by align/kernels/native.py; align/inference/fused_layers.py packs the weights and checks shapes.

   Why: a decode step multiplies few rows by many weights, once per layer, and the weights are cold (the 32k-token
   head streams the caches clean every step). oneDNN's and MKL's small-M kernels read cold weights at 1-7 GB/s on a
   Zen 4 core that streams 16 GB/s (bench/linear_kernels.py), so a layer's small matmuls cost several times their
   bytes. Here a weight panel (K x 16 floats, contiguous) is streamed in once, front to back with a software
   prefetch a few KB ahead, and multiplied into tiles of rows held in registers (one broadcast FMA per row and k;
   the tile's shape is the ISA's, below); further row tiles of the same panels read them from cache.

   Every output element is one fp32 FMA chain over k in order (plus the residual added after), whatever M, the
   row's block or the thread count: a row's result does not depend on the batch it is in.

   A prologue can transform each row of x while it is copied (the copy that transposes x is made anyway), so the
   decoder's elementwise steps before a matmul cost no pass over memory and no temporary of their own:
   - PROLOGUE_RMSNORM: row * w / sqrt(mean(row^2) + eps), the pre-attention and pre-MLP RMSNorm;
   - PROLOGUE_SWIGLU: x holds (gate, up) side by side, 2K wide; the row multiplied is silu(gate) * up.
   Each row is transformed on its own (16-lane vectors in a fixed order), so row invariance holds with them. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "workers.h"

enum { PROLOGUE_NONE = 0, PROLOGUE_RMSNORM = 1, PROLOGUE_SWIGLU = 2 };

/* packed: (ceil(N / 16), K, 16), columns past N zero */
void align_linear_pack(const float *w, int64_t N, int64_t K, float *packed) {
    const int64_t panels = (N + 15) / 16;
    memset(packed, 0, (size_t)(panels * K * 16) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) packed[((n / 16) * K + k) * 16 + n % 16] = w[n * K + k];
}

typedef struct {
    const float *packed, *residual;
    const float *xt; /* x as row blocks of 16 transposed: block b is (K, 16), rows b*16.. (the last block padded) */
    float *y;
    int64_t M, K, N, ldy, ldr, first, last; /* this worker's panels */
} Job;

#define PREFETCH_AHEAD 64 /* k steps (4 KB of panel) */

/* Tiles: rows s..s+MR-1 of row block b times NP consecutive panels from p, MR x NP x NV16 accumulators in
   registers. The shape is the ISA's (simd.h): with AVX-512 (32 registers of 16 floats) three panels x up to 8
   rows, 24 accumulators, so each k costs 3 weight loads and 8 broadcasts for 24 FMAs (a one-panel x 16-row tile
   needs 17 loads for 16 FMAs, and a core that retires two 512-bit FMAs a cycle waits on its loads: measured on a
   Zen 5 core, 16 x 3072 x 512 at 90 GMAC/s with two panels, 113 with three); elsewhere one panel: AVX2 (16
   registers of 8 floats) 2 vectors x 6 rows, 12 accumulators (7% faster than 4 rows on the same core); NEON (32
   registers of 4) 4 x 6; SSE (16 of 4) 4 x 3. Panels left over at a worker's end run one at a time. Either way an
   output element is the same FMA chain over k, so the tile shape never changes a result. */
#if VL == 16
#define TILE_PANELS 3
#define TILE_ROWS 8
#elif VL == 8 || defined(__aarch64__)
#define TILE_PANELS 1
#define TILE_ROWS 6
#else
#define TILE_PANELS 1
#define TILE_ROWS 3
#endif

/* y[r0 + r][the panel's columns] = out[r] (+ residual), the panel's last columns cut at N */
static void store_rows(const Job *j, const float (*out)[16], int64_t p, int64_t r0, int MR) {
    const int64_t n0 = p * 16, cols = j->N - n0 < 16 ? j->N - n0 : 16;
    for (int r = 0; r < MR; r++) {
        float *yr = j->y + (r0 + r) * j->ldy + n0;
        if (j->residual) {
            const float *res = j->residual + (r0 + r) * j->ldr + n0;
            for (int64_t c = 0; c < cols; c++) yr[c] = out[r][c] + res[c];
        } else {
            memcpy(yr, out[r], (size_t)cols * sizeof(float));
        }
    }
}

#define DEFINE_TILE(NP, MR)                                                                                  \
    static void tile_##NP##_##MR(const Job *j, int64_t p, int64_t b, int64_t s) {                             \
        const int64_t K = j->K;                                                                              \
        const float *wp = j->packed + p * K * 16;                                                            \
        const float *xb = j->xt + b * K * 16 + s; /* (K, 16) block: one base pointer, rows at fixed offsets */ \
        vf acc[MR][NP * NV16];                                                                               \
        for (int r = 0; r < MR; r++)                                                                         \
            for (int c = 0; c < NP * NV16; c++) acc[r][c] = splat(0.0f);                                     \
        const int fetch = b == 0 && s == 0; /* the first row tile streams the panels in; the rest hit cache */  \
        for (int64_t k = 0; k < K; k++) {                                                                    \
            vf w[NP * NV16];                                                                                 \
            for (int c = 0; c < NP; c++) {                                                                   \
                if (fetch) __builtin_prefetch(wp + c * K * 16 + (k + PREFETCH_AHEAD) * 16);                  \
                for (int h = 0; h < NV16; h++) w[c * NV16 + h] = loadv(wp + c * K * 16 + k * 16 + h * VL);    \
            }                                                                                                \
            for (int r = 0; r < MR; r++)                                                                     \
                for (int c = 0; c < NP * NV16; c++) acc[r][c] += xb[k * 16 + r] * w[c];                      \
        }                                                                                                    \
        for (int c = 0; c < NP; c++) {                                                                       \
            if ((p + c + 1) * 16 <= j->N) { /* a whole panel: straight from the registers */                  \
                for (int r = 0; r < MR; r++) {                                                               \
                    const int64_t row = b * 16 + s + r, col = (p + c) * 16;                                  \
                    float *yr = j->y + row * j->ldy + col;                                                   \
                    const float *res = j->residual ? j->residual + row * j->ldr + col : 0;                   \
                    for (int h = 0; h < NV16; h++)                                                           \
                        storev(yr + h * VL, res ? acc[r][c * NV16 + h] + loadv(res + h * VL)                 \
                                                : acc[r][c * NV16 + h]);                                     \
                }                                                                                            \
            } else { /* the last panel, cut at N */                                                          \
                float out[MR][16];                                                                           \
                for (int r = 0; r < MR; r++)                                                                 \
                    for (int h = 0; h < NV16; h++) storev(out[r] + h * VL, acc[r][c * NV16 + h]);            \
                store_rows(j, out, p + c, b * 16 + s, MR);                                                   \
            }                                                                                                \
        }                                                                                                    \
    }

typedef void (*TileFn)(const Job *, int64_t, int64_t, int64_t);
#define DEFINE_TILES_3(NP) DEFINE_TILE(NP, 1) DEFINE_TILE(NP, 2) DEFINE_TILE(NP, 3)
#define DEFINE_TILES_6(NP) DEFINE_TILES_3(NP) DEFINE_TILE(NP, 4) DEFINE_TILE(NP, 5) DEFINE_TILE(NP, 6)
#define DEFINE_TILES_8(NP) DEFINE_TILES_6(NP) DEFINE_TILE(NP, 7) DEFINE_TILE(NP, 8)
#define TABLE_3(NP) {0, tile_##NP##_1, tile_##NP##_2, tile_##NP##_3}
#define TABLE_6(NP) {0, tile_##NP##_1, tile_##NP##_2, tile_##NP##_3, tile_##NP##_4, tile_##NP##_5, tile_##NP##_6}
#define TABLE_8(NP) {0, tile_##NP##_1, tile_##NP##_2, tile_##NP##_3, tile_##NP##_4, tile_##NP##_5, tile_##NP##_6, \
                     tile_##NP##_7, tile_##NP##_8}
#if TILE_ROWS == 8
DEFINE_TILES_8(1)
DEFINE_TILES_8(3)
static const TileFn FULL[9] = TABLE_8(3), ONE_PANEL[9] = TABLE_8(1);
#elif TILE_ROWS == 6
DEFINE_TILES_6(1)
static const TileFn ONE_PANEL[7] = TABLE_6(1);
#define FULL ONE_PANEL
#else
DEFINE_TILES_3(1)
static const TileFn ONE_PANEL[4] = TABLE_3(1);
#define FULL ONE_PANEL
#endif

static void *run(void *arg) {
    const Job *j = (const Job *)arg;
    for (int64_t p = j->first, np; p < j->last; p += np) {
        np = j->last - p >= TILE_PANELS ? TILE_PANELS : 1;
        const TileFn *tiles = np == TILE_PANELS ? FULL : ONE_PANEL;
        for (int64_t b = 0; b * 16 < j->M; b++)
            for (int64_t s = 0; s < 16 && b * 16 + s < j->M; s += TILE_ROWS) {
                const int64_t left = j->M - b * 16 - s < 16 - s ? j->M - b * 16 - s : 16 - s;
                tiles[left < TILE_ROWS ? left : TILE_ROWS](j, p, b, s);
            }
    }
    return NULL;
}

/* Row r of x, transformed by the prologue, into row[0..K). */
static void prologue_row(const float *xr, int64_t K, int prologue, const float *pw, float eps, float *row) {
    int64_t k = 0;
    if (prologue == PROLOGUE_RMSNORM) {
        vf ss[NV16] = {{0}};
        for (; k + 16 <= K; k += 16)
            for (int h = 0; h < NV16; h++) {
                const vf a = loadv(xr + k + h * VL);
                ss[h] += a * a;
            }
        float lanes[16], sum = 0.0f;
        for (int h = 0; h < NV16; h++) storev(lanes + h * VL, ss[h]);
        for (int l = 0; l < 16; l++) sum += lanes[l];
        for (; k < K; k++) sum += xr[k] * xr[k];
        const float inv = 1.0f / sqrtf(sum / (float)K + eps);
        for (k = 0; k < K; k++) row[k] = xr[k] * inv * pw[k];
    } else if (prologue == PROLOGUE_SWIGLU) {
        for (; k + VL <= K; k += VL) {
            const vf g = loadv(xr + k), u = loadv(xr + K + k);
            storev(row + k, g / (1.0f + expv(-g)) * u);
        }
        for (; k < K; k++) row[k] = xr[k] / (1.0f + exp1(-xr[k])) * xr[K + k];
    } else {
        memcpy(row, xr, (size_t)K * sizeof(float));
    }
}

/* Returns 0, -1 when a worker thread could not be started (its panels then run on the calling thread), or -2 when
   the transposed copy of x could not be allocated (nothing computed). pw: the RMSNorm weight (K,), else unused. */
int align_linear(const float *x, int64_t M, int64_t K, int64_t ldx, const float *packed, int64_t N, float *y,
                 int64_t ldy, const float *residual, int64_t ldr, int64_t prologue, const float *pw, float eps,
                 int64_t threads) {
    const int64_t panels = (N + 15) / 16, blocks = (M + 15) / 16;
    float *xt = malloc((size_t)((blocks * 16 + 1) * K) * sizeof(float));
    if (!xt) return -2;
    float *row = xt + blocks * K * 16;
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t r = 0; r < 16; r++) {
            float *col = xt + b * K * 16 + r;
            if (b * 16 + r < M) {
                prologue_row(x + (b * 16 + r) * ldx, K, (int)prologue, pw, eps, row);
                for (int64_t k = 0; k < K; k++) col[k * 16] = row[k];
            } else {
                for (int64_t k = 0; k < K; k++) col[k * 16] = 0.0f;
            }
        }
    threads = align_workers(threads, panels);
    Job jobs[ALIGN_MAX_WORKERS];
    for (int64_t w = 0; w < threads; w++) {
        Job j = {packed, residual, xt, y, M, K, N, ldy, ldr, panels * w / threads, panels * (w + 1) / threads};
        jobs[w] = j;
    }
    const int rc = align_run_workers(run, jobs, sizeof(Job), threads);
    free(xt);
    return rc;
}
