/* y (M, N) = x (M, K) @ W^T (+ residual) in fp32 on weights packed once into 16-column panels (CPU).

   Built and loaded by align/kernels/native.py; align/inference/fused_layers.py packs the weights and checks shapes.

   Why: a decode step multiplies few rows by many weights, once per layer, and the weights are cold (the 32k-token
   head streams the caches clean every step). oneDNN's and MKL's small-M kernels read cold weights at 1-7 GB/s on a
   Zen 4 core that streams 16 GB/s (bench/linear_kernels.py), so a layer's small matmuls cost several times their
   bytes. Here a weight panel (K x 16 floats, contiguous) is read once, front to back with a software prefetch a few
   KB ahead, and multiplied into up to 16 rows at a time held in registers (one broadcast FMA per row and k).

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

#include "vexp.h"
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
    const float *x, *packed, *residual;
    const float *xt; /* x as row blocks of 16 transposed: block b is (K, 16), rows b*16.. (the last block padded) */
    float *y;
    int64_t M, K, N, ldx, ldy, ldr, first, last; /* this worker's panels */
} Job;

#define PREFETCH_AHEAD 64 /* k steps (4 KB of panel) */

/* rows r0..r0+MR-1 times panel p */
#define DEFINE_TILE(MR)                                                                                    \
    static void tile_##MR(const Job *j, int64_t p, int64_t r0) {                                            \
        const int64_t K = j->K;                                                                            \
        const float *wp = j->packed + p * K * 16;                                                          \
        const float *xb = j->xt + r0 * K; /* (K, 16): one base pointer, the rows at constant offsets */     \
        v16 acc[MR];                                                                                       \
        for (int r = 0; r < MR; r++) acc[r] = (v16){0};                                                    \
        for (int64_t k = 0; k < K; k++) {                                                                  \
            __builtin_prefetch(wp + (k + PREFETCH_AHEAD) * 16);                                            \
            v16 w;                                                                                         \
            memcpy(&w, wp + k * 16, 64);                                                                   \
            for (int r = 0; r < MR; r++) acc[r] += xb[k * 16 + r] * w;                                     \
        }                                                                                                  \
        const int64_t n0 = p * 16, cols = j->N - n0 < 16 ? j->N - n0 : 16;                                 \
        for (int r = 0; r < MR; r++) {                                                                     \
            float out[16];                                                                                 \
            memcpy(out, &acc[r], 64);                                                                      \
            float *yr = j->y + (r0 + r) * j->ldy + n0;                                                     \
            if (j->residual) {                                                                             \
                const float *res = j->residual + (r0 + r) * j->ldr + n0;                                   \
                for (int64_t c = 0; c < cols; c++) yr[c] = out[c] + res[c];                                \
            } else {                                                                                       \
                memcpy(yr, out, (size_t)cols * sizeof(float));                                             \
            }                                                                                              \
        }                                                                                                  \
    }
DEFINE_TILE(1)
DEFINE_TILE(2)
DEFINE_TILE(3)
DEFINE_TILE(4)
DEFINE_TILE(5)
DEFINE_TILE(6)
DEFINE_TILE(7)
DEFINE_TILE(8)
DEFINE_TILE(9)
DEFINE_TILE(10)
DEFINE_TILE(11)
DEFINE_TILE(12)
DEFINE_TILE(13)
DEFINE_TILE(14)
DEFINE_TILE(15)
DEFINE_TILE(16)

typedef void (*TileFn)(const Job *, int64_t, int64_t);
static const TileFn TILES[17] = {0,       tile_1,  tile_2,  tile_3,  tile_4,  tile_5,  tile_6,  tile_7, tile_8,
                                 tile_9,  tile_10, tile_11, tile_12, tile_13, tile_14, tile_15, tile_16};

static void *run(void *arg) {
    const Job *j = (const Job *)arg;
    for (int64_t p = j->first; p < j->last; p++)
        for (int64_t r0 = 0; r0 < j->M; r0 += 16) TILES[j->M - r0 < 16 ? j->M - r0 : 16](j, p, r0);
    return NULL;
}

/* Row r of x, transformed by the prologue, into row[0..K). */
static void prologue_row(const float *xr, int64_t K, int prologue, const float *pw, float eps, float *row) {
    int64_t k = 0;
    if (prologue == PROLOGUE_RMSNORM) {
        v16 ss = {0};
        for (; k + 16 <= K; k += 16) {
            v16 a;
            memcpy(&a, xr + k, 64);
            ss += a * a;
        }
        float sum = 0.0f;
        for (int l = 0; l < 16; l++) sum += ss[l];
        for (; k < K; k++) sum += xr[k] * xr[k];
        const float inv = 1.0f / sqrtf(sum / (float)K + eps);
        for (k = 0; k < K; k++) row[k] = xr[k] * inv * pw[k];
    } else if (prologue == PROLOGUE_SWIGLU) {
        for (; k + 16 <= K; k += 16) {
            v16 g, u;
            memcpy(&g, xr + k, 64);
            memcpy(&u, xr + K + k, 64);
            v16 y = g / (1.0f + exp16(-g)) * u;
            memcpy(row + k, &y, 64);
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
        Job j = {x, packed, residual, xt, y, M, K, N, ldx, ldy, ldr, panels * w / threads, panels * (w + 1) / threads};
        jobs[w] = j;
    }
    const int rc = align_run_workers(run, jobs, sizeof(Job), threads);
    free(xt);
    return rc;
}
