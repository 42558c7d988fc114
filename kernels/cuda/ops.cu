/*
 * ops.cu — the fp16 forward-pass kernels of libloopserve_cuda.so: embedding,
 * rmsnorm, matmul (fp16 weights, fp32 accumulation), RoPE, K/V cache store,
 * attention over the fp16 cache, SwiGLU. They mirror the CPU backend's
 * ops_<path>.c and kernels/cpu/attention.c; see cuda_internal.h for the
 * design.
 *
 * Every reduction has a fixed shape that depends only on its length (lane
 * stride then a shuffle tree, or a block tree), never on how many tokens or
 * rows share the launch: one token's result is the same in a prefill of 64
 * as in a decode step.
 */
#include <math.h>

#include "cuda_internal.h"
#include "reduce.cuh"

// ---- embedding ----

__global__ static void k_embed(float *h, const __half *E, const int32_t *tokens, int32_t dim) {
    int32_t t = blockIdx.x;
    const __half *row = E + (size_t)tokens[t] * dim;
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) h[(size_t)t * dim + i] = __half2float(row[i]);
}

cudaError_t lsc_embed(float *h, const __half *E, const int32_t *tokens, int32_t T, int32_t dim) {
    k_embed<<<T, LS_CUDA_BLOCK>>>(h, E, tokens, dim);
    return cudaGetLastError();
}

// ---- rmsnorm ----

/* 1 / rms of a row of n (every thread of the block gets it). */
__device__ static inline float rms_scale(const float *xr, int32_t n, float eps, float *red) {
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    return 1.0f / sqrtf(ss / (float)n + eps);
}

__global__ static void k_rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = out + (size_t)blockIdx.x * n;
    float scale = rms_scale(xr, n, eps, red);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

cudaError_t lsc_rmsnorm(float *out, const float *x, const float *w, int32_t T, int32_t n, float eps) {
    k_rmsnorm<<<T, LS_CUDA_BLOCK>>>(out, x, w, n, eps);
    return cudaGetLastError();
}

/* k_rmsnorm's norm of y, each value rounded before it is added to h (the
 * CPU library norms the sublayer's output, then adds it). */
__global__ static void k_rmsnorm_add(float *h, const float *y, const float *w, int32_t n, float eps) {
    __shared__ float red[32];
    const float *yr = y + (size_t)blockIdx.x * n;
    float *hr = h + (size_t)blockIdx.x * n;
    float scale = rms_scale(yr, n, eps, red);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) hr[i] = __fadd_rn(hr[i], yr[i] * scale * w[i]);
}

cudaError_t lsc_rmsnorm_add(float *h, const float *y, const float *w, int32_t T, int32_t n, float eps) {
    k_rmsnorm_add<<<T, LS_CUDA_BLOCK>>>(h, y, w, n, eps);
    return cudaGetLastError();
}

// ---- matmul: one warp per output row and tile of tokens ----

/* Eight fp16 weights (16 bytes) as fp32, read past L1: each weight is used
 * once per tile. */
__device__ static inline void load_w8(float wf[8], const __half *w) {
    uint4 raw = __ldg(reinterpret_cast<const uint4 *>(w));
    const __half2 *h2 = reinterpret_cast<const __half2 *>(&raw);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        float2 f = __half22float2(h2[k]);
        wf[2 * k] = f.x;
        wf[2 * k + 1] = f.y;
    }
}

/* One lane's partial dot product of a weight row with TILE token rows.
 * With VEC = 8 the lane takes 8-element chunks lane, lane + 32, ... (16-byte
 * weight loads), then the elements past the last whole chunk one at a time;
 * with VEC = 1 elements lane, lane + 32, ... Either way the sequence of
 * FMAs is a function of `in` alone: a tile shares the weight reads, never
 * the arithmetic. */
template <int TILE, int VEC>
__device__ static inline void dot_tile(float acc[TILE], const __half *__restrict__ wr, const float *__restrict__ xt,
                                       int32_t ldx, int32_t in, int32_t nt, int lane) {
    int32_t done = 0;
    if (VEC == 8) {
        int32_t chunks = in / 8;
#pragma unroll 4
        for (int32_t c = lane; c < chunks; c += 32) {
            float wf[8];
            load_w8(wf, wr + (size_t)c * 8);
#pragma unroll
            for (int j = 0; j < TILE; j++) {
                if (j >= nt) break;
                const float4 *xv = reinterpret_cast<const float4 *>(xt + (size_t)j * ldx + (size_t)c * 8);
                float4 a = xv[0], b = xv[1];
                float s = acc[j];
                s = fmaf(wf[0], a.x, s);
                s = fmaf(wf[1], a.y, s);
                s = fmaf(wf[2], a.z, s);
                s = fmaf(wf[3], a.w, s);
                s = fmaf(wf[4], b.x, s);
                s = fmaf(wf[5], b.y, s);
                s = fmaf(wf[6], b.z, s);
                s = fmaf(wf[7], b.w, s);
                acc[j] = s;
            }
        }
        done = chunks * 8;
    }
    for (int32_t i = done + lane; i < in; i += 32) {
        float wi = __half2float(wr[i]);
#pragma unroll
        for (int j = 0; j < TILE; j++)
            if (j < nt) acc[j] = fmaf(wi, xt[(size_t)j * ldx + i], acc[j]);
    }
}

/* y = W x (EPI_STORE), y += W x (EPI_ADD), or, with the second matrix wb of
 * the same shape, y = silu(W x) * (Wb x) (EPI_SWIGLU: the gate and up
 * projections in one pass over x, as lsc_swiglu computes it). */
enum { EPI_STORE, EPI_ADD, EPI_SWIGLU };

template <int TILE, int VEC, int EPI>
__global__ static void k_matmul(float *__restrict__ y, int32_t ldy, const float *__restrict__ x, int32_t ldx,
                                const __half *__restrict__ w, const __half *__restrict__ wb, int32_t in, int32_t rows,
                                int32_t T) {
    int lane = threadIdx.x & 31;
    int32_t o = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    int32_t t0 = blockIdx.y * TILE;
    int32_t nt = T - t0 < TILE ? T - t0 : TILE;
    if (o >= rows) return; // the whole warp leaves together: no barrier below
    const float *xt = x + (size_t)t0 * ldx;
    float acc[TILE], accb[TILE];
#pragma unroll
    for (int j = 0; j < TILE; j++) acc[j] = accb[j] = 0.0f;
    dot_tile<TILE, VEC>(acc, w + (size_t)o * in, xt, ldx, in, nt, lane);
    if (EPI == EPI_SWIGLU) dot_tile<TILE, VEC>(accb, wb + (size_t)o * in, xt, ldx, in, nt, lane);
#pragma unroll
    for (int j = 0; j < TILE; j++) {
        if (j >= nt) break; // nt is the same for the whole warp
        float a = warp_sum(acc[j]);
        float b = EPI == EPI_SWIGLU ? warp_sum(accb[j]) : 0.0f;
        if (lane == 0) {
            float *yo = y + (size_t)(t0 + j) * ldy + o;
            if (EPI == EPI_ADD) *yo += a;
            else if (EPI == EPI_SWIGLU) *yo = a / (1.0f + expf(-a)) * b;
            else *yo = a;
        }
    }
}

template <int TILE, int EPI>
static cudaError_t matmul_tiles(float *y, int32_t ldy, const float *x, int32_t ldx, const __half *w, const __half *wb,
                                int32_t in, int32_t rows, int32_t T) {
    dim3 grid(blocks_for(rows, MM_WARPS), blocks_for(T, TILE));
    /* 16-byte weight loads and float4 activation loads need rows that start
     * on 16 bytes: whether they do depends on the shapes, never on T */
    if (in % 8 == 0 && ldx % 4 == 0)
        k_matmul<TILE, 8, EPI><<<grid, LS_CUDA_BLOCK>>>(y, ldy, x, ldx, w, wb, in, rows, T);
    else
        k_matmul<TILE, 1, EPI><<<grid, LS_CUDA_BLOCK>>>(y, ldy, x, ldx, w, wb, in, rows, T);
    return cudaGetLastError();
}

/* The smallest tile that takes every token at once, up to 8. */
template <int EPI>
static cudaError_t matmul_epi(float *y, int32_t ldy, const float *x, int32_t ldx, const __half *w, const __half *wb,
                              int32_t in, int32_t rows, int32_t T) {
    if (T == 1) return matmul_tiles<1, EPI>(y, ldy, x, ldx, w, wb, in, rows, T);
    if (T == 2) return matmul_tiles<2, EPI>(y, ldy, x, ldx, w, wb, in, rows, T);
    if (T <= 4) return matmul_tiles<4, EPI>(y, ldy, x, ldx, w, wb, in, rows, T);
    return matmul_tiles<8, EPI>(y, ldy, x, ldx, w, wb, in, rows, T);
}

cudaError_t lsc_matmul(float *y, int32_t ldy, const float *x, int32_t ldx, const __half *w, int32_t in,
                       int32_t rows, int32_t T, int add) {
    return add ? matmul_epi<EPI_ADD>(y, ldy, x, ldx, w, NULL, in, rows, T)
               : matmul_epi<EPI_STORE>(y, ldy, x, ldx, w, NULL, in, rows, T);
}

cudaError_t lsc_matmul_swiglu(float *g, int32_t ldg, const float *x, int32_t ldx, const __half *w1, const __half *w3,
                              int32_t in, int32_t rows, int32_t T) {
    return matmul_epi<EPI_SWIGLU>(g, ldg, x, ldx, w1, w3, in, rows, T);
}

// ---- RoPE and the K/V cache store ----

/* One block per token row of qkv ((T, ld): q, then k, then v): rotates
 * pairs (i, i + hd/2) of the n_heads query and n_kv key vectors in place
 * (cs: the row's (hd/2, 2) cos, sin), then stores the rotated keys and the
 * values as fp16 into loop `unit` of the row's cache (n_kv, cap, hd), at
 * ring row rows[t].pos % cap. */
__global__ static void k_rope_store(float *qkv, int32_t ld, int32_t n_heads, int32_t n_kv, int32_t hd,
                                    const float *cs, const lsc_row_cache *rows, int32_t unit) {
    int32_t t = blockIdx.x, half = hd / 2;
    const float *c = cs + (size_t)t * hd;
    float *xt = qkv + (size_t)t * ld;
    for (int32_t idx = threadIdx.x; idx < (n_heads + n_kv) * half; idx += blockDim.x) {
        int32_t head = idx / half, i = idx % half;
        float *v = xt + (size_t)head * hd;
        float co = c[2 * i], si = c[2 * i + 1];
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * co - x1 * si;
        v[i + half] = x1 * co + x0 * si;
    }
    __syncthreads(); // the rotated keys are read by other threads below
    const lsc_row_cache r = rows[t];
    __half *kc = r.kc + unit * r.loop_stride, *vc = r.vc + unit * r.loop_stride;
    int32_t row = r.pos % r.cap, kv_dim = n_kv * hd;
    const float *k = xt + (size_t)n_heads * hd, *v = k + kv_dim;
    for (int32_t idx = threadIdx.x; idx < kv_dim; idx += blockDim.x) {
        int32_t kvh = idx / hd, d = idx % hd;
        size_t off = ((size_t)kvh * r.cap + row) * hd + d;
        kc[off] = __float2half_rn(k[idx]);
        vc[off] = __float2half_rn(v[idx]);
    }
}

cudaError_t lsc_rope_store(float *qkv, int32_t ld, int32_t n_heads, int32_t n_kv, int32_t hd, const float *cs,
                           const lsc_row_cache *rows, int32_t unit, int32_t T) {
    k_rope_store<<<T, LS_CUDA_BLOCK>>>(qkv, ld, n_heads, n_kv, hd, cs, rows, unit);
    return cudaGetLastError();
}

// ---- cache row copy (prefix reuse) ----

__global__ static void k_copy_rows(__half *dst, int32_t dcap, const __half *src, int32_t scap, int32_t hd,
                                   int32_t lo) {
    int32_t p = lo + blockIdx.x, kvh = blockIdx.y;
    const __half *s = src + ((size_t)kvh * scap + p % scap) * hd;
    __half *d = dst + ((size_t)kvh * dcap + p % dcap) * hd;
    for (int32_t i = threadIdx.x; i < hd; i += blockDim.x) d[i] = s[i];
}

cudaError_t lsc_copy_rows(__half *dst, int32_t dcap, const __half *src, int32_t scap, int32_t n_kv, int32_t hd,
                          int32_t lo, int32_t n) {
    if (n <= lo) return cudaSuccess;
    dim3 grid((unsigned)(n - lo), (unsigned)n_kv);
    k_copy_rows<<<grid, LS_CUDA_BLOCK>>>(dst, dcap, src, scap, hd, lo);
    return cudaGetLastError();
}

// ---- attention: one block per (head, token), a warp per position ----

#define ATT_THREADS 512 /* a decode step has one block per head: many warps each */
#define ATT_WARPS (ATT_THREADS / 32)
#define ATT_SLOTS (LS_CUDA_MAX_HEAD_DIM / 32)
#define ATT_GROUP 4 /* positions a warp reads at once */

/* Warp w visits positions w, w + ATT_WARPS, ... in order, ATT_GROUP of
 * them at a time; lane holds
 * dimensions lane, lane + 32, ... of q, of its running output and of each
 * key and value row it reads (64-byte coalesced reads per slot). A score
 * is the lanes' partial dot products summed by the shuffle tree; each warp
 * keeps its own online softmax (max m, sum l, output acc), and the warps
 * are merged in warp order at the end. Every order is fixed by the
 * position count alone. */
__global__ static void __launch_bounds__(ATT_THREADS) k_attention(float *att, const float *q, int32_t ldq, const lsc_row_cache *rows, int32_t unit,
                                   int32_t n_heads, int32_t n_kv, int32_t hd) {
    __shared__ float ws_m[ATT_WARPS], ws_l[ATT_WARPS], ws_f[ATT_WARPS];
    __shared__ float ws_acc[ATT_WARPS][LS_CUDA_MAX_HEAD_DIM];
    int32_t head = blockIdx.x, t = blockIdx.y;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const lsc_row_cache r = rows[t];
    const __half *kc = r.kc + unit * r.loop_stride, *vc = r.vc + unit * r.loop_stride;
    int32_t p = r.pos, window = r.window, cap = r.cap;
    int32_t lo = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
    int32_t cnt = p - lo + 1;
    int32_t kvh = head / (n_heads / n_kv);
    const __half *K = kc + (size_t)kvh * cap * hd;
    const __half *V = vc + (size_t)kvh * cap * hd;
    const float *qh = q + (size_t)t * ldq + (size_t)head * hd;

    float qr[ATT_SLOTS], acc[ATT_SLOTS];
#pragma unroll
    for (int k = 0; k < ATT_SLOTS; k++) {
        int32_t d = lane + 32 * k;
        qr[k] = d < hd ? qh[d] : 0.0f;
        acc[k] = 0.0f;
    }
    float scale = 1.0f / sqrtf((float)hd);
    float m = -INFINITY, l = 0.0f;
    for (int32_t j = warp; j < cnt; j += ATT_WARPS * ATT_GROUP) {
        /* a group's key and value reads are all issued before its first use */
        float s[ATT_GROUP], vv[ATT_GROUP][ATT_SLOTS];
#pragma unroll
        for (int u = 0; u < ATT_GROUP; u++) {
            int32_t ju = j + u * ATT_WARPS;
            bool in = ju < cnt; // the same for the whole warp
            size_t row = in ? (size_t)((lo + ju) % cap) * hd : 0;
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < ATT_SLOTS; k++) {
                int32_t d = lane + 32 * k;
                bool use = in && d < hd;
                dot = use ? fmaf(qr[k], __half2float(K[row + d]), dot) : dot;
                vv[u][k] = use ? __half2float(V[row + d]) : 0.0f;
            }
            dot = __shfl_sync(FULL_MASK, warp_sum(dot), 0);
            s[u] = in ? dot * scale : -INFINITY;
        }
        float m_new = m;
#pragma unroll
        for (int u = 0; u < ATT_GROUP; u++) m_new = fmaxf(m_new, s[u]);
        float corr = expf(m - m_new); // 0 on the first group (m = -inf)
        l *= corr;
#pragma unroll
        for (int k = 0; k < ATT_SLOTS; k++) acc[k] *= corr;
#pragma unroll
        for (int u = 0; u < ATT_GROUP; u++) {
            float e = expf(s[u] - m_new); // 0 past the last position
            l += e;
#pragma unroll
            for (int k = 0; k < ATT_SLOTS; k++) acc[k] = fmaf(e, vv[u][k], acc[k]);
        }
        m = m_new;
    }
    if (lane == 0) {
        ws_m[warp] = m;
        ws_l[warp] = l;
    }
#pragma unroll
    for (int k = 0; k < ATT_SLOTS; k++) {
        int32_t d = lane + 32 * k;
        if (d < hd) ws_acc[warp][d] = acc[k];
    }
    __syncthreads();
    if ((int)threadIdx.x < ATT_WARPS) {
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, ws_m[w]);
        int w = threadIdx.x; // a warp with no position holds nothing
        ws_f[w] = ws_l[w] > 0.0f ? expf(ws_m[w] - M) : 0.0f;
    }
    __syncthreads();
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) L = fmaf(ws_l[w], ws_f[w], L);
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) o = fmaf(ws_acc[w][d], ws_f[w], o);
        att[(size_t)t * n_heads * hd + (size_t)head * hd + d] = o / L;
    }
}

cudaError_t lsc_attention(float *att, const float *q, int32_t ldq, const lsc_row_cache *rows, int32_t unit,
                          int32_t n_heads, int32_t n_kv, int32_t hd, int32_t T) {
    dim3 grid((unsigned)n_heads, (unsigned)T);
    k_attention<<<grid, ATT_THREADS>>>(att, q, ldq, rows, unit, n_heads, n_kv, hd);
    return cudaGetLastError();
}
