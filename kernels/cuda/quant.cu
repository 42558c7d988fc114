/*
 * quant.cu — the quantized matmuls of libloopserve_cuda.so (int4 / int2
 * block matrices, int8 / int6 / int4 heads) and the embedding read from a
 * quantized head. The arithmetic is kernels/cuda/quant_math.h's, shared
 * with the host programs that hold it to the CPU library; this file only
 * lays it out over threads:
 *   - activations: one block per token row: the row's amax (a block tree of
 *     lsq_amax_step, order-free), then every code (lsq_act_code);
 *   - matmul: one warp per output row and tile of up to 8 tokens, the
 *     schedule written at the top of quant_math.h: lane l takes unit
 *     32 r + l in round r (its codes unpacked once for the tile), the
 *     G / 32 lanes of a group add their exact sums by xor shuffles, and lane
 *     k < 8 folds the round's groups of residue k into acc[k] in increasing
 *     order. Each token's sums and fold are its own, so a token's bits do not
 *     depend on the tile or the launch it shares.
 */
#include "cuda_internal.h"
#include "reduce.cuh"

// ---- activations ----

struct amax_op {
    __device__ float operator()(float a, float b) const { return lsq_amax_step(a, b); }
};

__global__ static void k_quantize(int8_t *q, float *d, const float *x, int32_t ldx, int32_t in) {
    __shared__ float red[32];
    const int32_t t = blockIdx.x;
    const float *xr = x + (int64_t)t * ldx;
    int8_t *qr = q + (int64_t)t * in;
    float amax = 0.0f;
    for (int32_t i = threadIdx.x; i < in; i += blockDim.x) amax = lsq_amax_step(amax, xr[i]);
    amax = block_reduce(amax, red, amax_op(), 0.0f); /* partial maxima are never NaN: 0 is the identity */
    float dt, inv;
    lsq_row_scale(amax, &dt, &inv);
    for (int32_t i = threadIdx.x; i < in; i += blockDim.x) qr[i] = (int8_t)lsq_act_code(xr[i], inv);
    if (threadIdx.x == 0) d[t] = dt;
}

cudaError_t lsc_quantize(int8_t *q, float *d, const float *x, int32_t ldx, int32_t in, int32_t T) {
    k_quantize<<<T, LS_CUDA_BLOCK>>>(q, d, x, ldx, in);
    return cudaGetLastError();
}

// ---- matmul ----

/* acc[j] (lanes 0..7: accumulator `lane`) of row o against the activation
 * rows q + j * in, j < nt. */
template <int TILE>
__device__ static void qrow_tile(float acc[TILE], const lsq_matrix &w, int32_t o, const int8_t *__restrict__ q,
                                 int32_t nt, int lane) {
    const int32_t in = w.in, G = w.group, ng = in / G, units = in / LSQ_UNIT, gl = lsq_group_lanes(G);
    const int32_t steps = lsq_chain_steps(G), k = lane & (LSQ_ACCS - 1);
    const uint8_t *row = w.qweight + (int64_t)o * lsq_row_bytes(in, w.bits);
    const uint16_t *sr = w.scales + (int64_t)o * ng;
    const uint16_t *zr = w.zeros ? w.zeros + (int64_t)o * ng : NULL;
    const bool offsets = w.bits == 2; /* the whole warp agrees */
    for (int32_t r = 0; r < lsq_rounds(in); r++) {
        const int32_t u = LSQ_WARP * r + lane;
        const bool have = u < units;
        uint32_t cw[LSQ_WORDS];
        if (have) lsq_unit_codes(cw, row, in, u, w.bits);
        int32_t isum[TILE], qsum[TILE];
#pragma unroll
        for (int j = 0; j < TILE; j++) {
            isum[j] = qsum[j] = 0;
            if (j < nt && have) {
                uint32_t qw[LSQ_WORDS];
                lsq_load_words(qw, reinterpret_cast<const uint8_t *>(q + (int64_t)j * in + (int64_t)LSQ_UNIT * u), 8);
                isum[j] = lsq_unit_isum(cw, qw, w.bits, &qsum[j]);
            }
        }
        /* each group's G / 32 lanes end up holding the group's sums */
        for (int32_t off = 1; off < gl; off <<= 1)
#pragma unroll
            for (int j = 0; j < TILE; j++) {
                isum[j] += __shfl_xor_sync(FULL_MASK, isum[j], off);
                if (offsets) qsum[j] += __shfl_xor_sync(FULL_MASK, qsum[j], off);
            }
        for (int32_t s = 0; s < steps; s++) {
            const int32_t g = lsq_chain_group(r, s, k, G, ng);
            const int32_t src = g >= 0 ? lsq_chain_lane(g, G) : 0;
            const bool mine = lane < LSQ_ACCS && g >= 0;
            const float sc = mine ? lsq_f16(sr[g]) : 0.0f;
            const float z = mine && zr ? lsq_f16(zr[g]) : 0.0f;
#pragma unroll
            for (int j = 0; j < TILE; j++) {
                const int32_t vi = __shfl_sync(FULL_MASK, isum[j], src);
                const int32_t vq = offsets ? __shfl_sync(FULL_MASK, qsum[j], src) : 0;
                if (mine && j < nt) acc[j] = lsq_group_step(acc[j], vi, vq, sc, z, w.bits);
            }
        }
    }
}

/* Lane 0's view of the eight accumulators of token j. */
__device__ static inline void gather_accs(float a[LSQ_ACCS], float acc) {
#pragma unroll
    for (int i = 0; i < LSQ_ACCS; i++) a[i] = __shfl_sync(FULL_MASK, acc, i);
}

enum { QEPI_STORE, QEPI_ADD, QEPI_SWIGLU };

template <int TILE, int EPI>
__global__ static void k_qmatmul(float *__restrict__ y, int32_t ldy, const int8_t *__restrict__ q,
                                 const float *__restrict__ d, lsq_matrix w, lsq_matrix wb, int32_t T) {
    const int lane = threadIdx.x & 31;
    const int32_t o = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    const int32_t t0 = blockIdx.y * TILE;
    const int32_t nt = T - t0 < TILE ? T - t0 : TILE;
    if (o >= w.rows) return; // the whole warp leaves together
    const int8_t *qt = q + (int64_t)t0 * w.in;
    float acc[TILE], accb[TILE];
#pragma unroll
    for (int j = 0; j < TILE; j++) acc[j] = accb[j] = 0.0f;
    qrow_tile<TILE>(acc, w, o, qt, nt, lane);
    if (EPI == QEPI_SWIGLU) qrow_tile<TILE>(accb, wb, o, qt, nt, lane);
#pragma unroll
    for (int j = 0; j < TILE; j++) {
        if (j >= nt) break; // nt is the same for the whole warp
        float a[LSQ_ACCS], b[LSQ_ACCS];
        gather_accs(a, acc[j]);
        if (EPI == QEPI_SWIGLU) gather_accs(b, accb[j]);
        if (lane == 0) {
            const float dt = d[t0 + j];
            float *yo = y + (int64_t)(t0 + j) * ldy + o;
            if (EPI == QEPI_SWIGLU) {
                const float av = lsq_finish(a, dt, 0.0f, 0), bv = lsq_finish(b, dt, 0.0f, 0);
                *yo = av / (1.0f + expf(-av)) * bv; /* as the fp16 path's SwiGLU */
            } else {
                *yo = lsq_finish(a, dt, EPI == QEPI_ADD ? *yo : 0.0f, EPI == QEPI_ADD);
            }
        }
    }
}

template <int TILE, int EPI>
static cudaError_t qmatmul_tiles(float *y, int32_t ldy, const int8_t *q, const float *d, const lsq_matrix &w,
                                 const lsq_matrix &wb, int32_t T) {
    dim3 grid(blocks_for(w.rows, MM_WARPS), blocks_for(T, TILE));
    k_qmatmul<TILE, EPI><<<grid, LS_CUDA_BLOCK>>>(y, ldy, q, d, w, wb, T);
    return cudaGetLastError();
}

/* The smallest tile that takes every token at once, up to 8 (as the fp16 matmul). */
template <int EPI>
static cudaError_t qmatmul_epi(float *y, int32_t ldy, const int8_t *q, const float *d, const lsq_matrix &w,
                               const lsq_matrix &wb, int32_t T) {
    if (T == 1) return qmatmul_tiles<1, EPI>(y, ldy, q, d, w, wb, T);
    if (T == 2) return qmatmul_tiles<2, EPI>(y, ldy, q, d, w, wb, T);
    if (T <= 4) return qmatmul_tiles<4, EPI>(y, ldy, q, d, w, wb, T);
    return qmatmul_tiles<8, EPI>(y, ldy, q, d, w, wb, T);
}

cudaError_t lsc_qmatmul(float *y, int32_t ldy, const int8_t *q, const float *d, const lsq_matrix *w, int32_t T,
                        int add) {
    return add ? qmatmul_epi<QEPI_ADD>(y, ldy, q, d, *w, *w, T) : qmatmul_epi<QEPI_STORE>(y, ldy, q, d, *w, *w, T);
}

cudaError_t lsc_qmatmul_swiglu(float *g, int32_t ldg, const int8_t *q, const float *d, const lsq_matrix *w1,
                               const lsq_matrix *w3, int32_t T) {
    return qmatmul_epi<QEPI_SWIGLU>(g, ldg, q, d, *w1, *w3, T);
}

// ---- the embedding of a model whose quantized head stands in for it ----

__global__ static void k_embed_quantized(float *h, lsq_matrix head, const int32_t *tokens) {
    const int32_t t = blockIdx.x, dim = head.in, ng = dim / head.group;
    const int64_t tok = tokens[t];
    const uint8_t *row = head.qweight + tok * lsq_row_bytes(dim, head.bits);
    const uint16_t *sr = head.scales + tok * ng;
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x)
        h[(int64_t)t * dim + i] = lsq_mul((float)lsq_code(row, dim, i, head.bits), lsq_f16(sr[i / head.group]));
}

cudaError_t lsc_embed_quantized(float *h, const lsq_matrix *head, const int32_t *tokens, int32_t T) {
    k_embed_quantized<<<T, LS_CUDA_BLOCK>>>(h, *head, tokens);
    return cudaGetLastError();
}
