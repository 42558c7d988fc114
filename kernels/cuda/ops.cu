/*
 * ops.cu — the fp16 forward-pass kernels of libloopserve_cuda.so: embedding,
 * rmsnorm, matmul (fp16 weights, fp32 accumulation), RoPE, K/V cache store,
 * attention over the fp16 cache, SwiGLU. They mirror kernels/ops_*.c and
 * kernels/attention.c; see cuda_internal.h for the design.
 *
 * Every reduction has a fixed shape that depends only on its length (lane
 * stride then a shuffle tree, or a block tree), never on how many tokens or
 * rows share the launch: one token's result is the same in a prefill of 64
 * as in a decode step.
 */
#include <math.h>

#include "cuda_internal.h"

#define FULL_MASK 0xffffffffu

// ---- block reductions ----

/* The two ways partial results combine, as functors so one reduction
 * serves both. */
struct add_op {
    __device__ float operator()(float a, float b) const { return a + b; }
};
struct max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/* Reduction over a warp (shuffle tree; lane 0 holds the result). */
template <typename Op> __device__ static float warp_reduce(float v, Op op) {
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_down_sync(FULL_MASK, v, off));
    return v;
}

/* Reduction over the block, returned to every thread; `identity` fills the
 * lanes past the last warp. blockDim.x is a multiple of 32; red holds 32
 * floats. The leading barrier keeps a previous call's result readable until
 * every thread has read it. */
template <typename Op> __device__ static float block_reduce(float v, float *red, Op op, float identity) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? red[lane] : identity;
        v = warp_reduce(v, op);
        if (lane == 0) red[0] = v;
    }
    __syncthreads();
    return red[0];
}

__device__ static float warp_sum(float v) { return warp_reduce(v, add_op()); }
__device__ static float block_sum(float v, float *red) { return block_reduce(v, red, add_op(), 0.0f); }
__device__ static float block_max(float v, float *red) { return block_reduce(v, red, max_op(), -INFINITY); }

static unsigned blocks_for(int64_t n, int per_block) { return (unsigned)((n + per_block - 1) / per_block); }

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

__global__ static void k_rmsnorm(float *out, const float *x, const float *w, int32_t n, float eps) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = out + (size_t)blockIdx.x * n;
    float ss = 0.0f;
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * scale * w[i];
}

cudaError_t lsc_rmsnorm(float *out, const float *x, const float *w, int32_t T, int32_t n, float eps) {
    k_rmsnorm<<<T, LS_CUDA_BLOCK>>>(out, x, w, n, eps);
    return cudaGetLastError();
}

// ---- matmul: one warp per output row and tile of tokens ----

#define MM_WARPS (LS_CUDA_BLOCK / 32)

/* Each token's sum is the one fixed sequence a single token gets (lane
 * stride, then the shuffle tree): a tile of TILE tokens shares the weight
 * reads, never the arithmetic, so a row's result does not depend on the
 * tile size or its tile mates. */
template <int TILE>
__global__ static void k_matmul(float *y, int32_t ldy, const float *x, int32_t ldx, const __half *w,
                                int32_t in, int32_t rows, int32_t T, int add) {
    int lane = threadIdx.x & 31;
    int32_t o = blockIdx.x * MM_WARPS + (threadIdx.x >> 5);
    int32_t t0 = blockIdx.y * TILE;
    int32_t nt = T - t0 < TILE ? T - t0 : TILE;
    if (o >= rows) return; // the whole warp leaves together: no barrier below
    const __half *wr = w + (size_t)o * in;
    const float *xt = x + (size_t)t0 * ldx;
    float acc[TILE];
#pragma unroll
    for (int j = 0; j < TILE; j++) acc[j] = 0.0f;
    for (int32_t i = lane; i < in; i += 32) {
        float wi = __half2float(wr[i]);
#pragma unroll
        for (int j = 0; j < TILE; j++)
            if (j < nt) acc[j] = fmaf(wi, xt[(size_t)j * ldx + i], acc[j]);
    }
#pragma unroll
    for (int j = 0; j < TILE; j++) {
        if (j >= nt) break; // nt is the same for the whole warp
        float a = warp_sum(acc[j]);
        if (lane == 0) {
            float *yo = y + (size_t)(t0 + j) * ldy + o;
            *yo = add ? *yo + a : a;
        }
    }
}

template <int TILE>
static cudaError_t matmul_tiles(float *y, int32_t ldy, const float *x, int32_t ldx, const __half *w, int32_t in,
                                int32_t rows, int32_t T, int add) {
    dim3 grid(blocks_for(rows, MM_WARPS), blocks_for(T, TILE));
    k_matmul<TILE><<<grid, LS_CUDA_BLOCK>>>(y, ldy, x, ldx, w, in, rows, T, add);
    return cudaGetLastError();
}

/* The smallest tile that takes every token at once, up to 8. */
cudaError_t lsc_matmul(float *y, int32_t ldy, const float *x, int32_t ldx, const __half *w, int32_t in,
                       int32_t rows, int32_t T, int add) {
    if (T == 1) return matmul_tiles<1>(y, ldy, x, ldx, w, in, rows, T, add);
    if (T == 2) return matmul_tiles<2>(y, ldy, x, ldx, w, in, rows, T, add);
    if (T <= 4) return matmul_tiles<4>(y, ldy, x, ldx, w, in, rows, T, add);
    return matmul_tiles<8>(y, ldy, x, ldx, w, in, rows, T, add);
}

// ---- rope ----

__global__ static void k_rope(float *x, int32_t ld, int32_t n_heads, int32_t hd, const float *cs) {
    int32_t t = blockIdx.x, half = hd / 2;
    const float *c = cs + (size_t)t * hd; // (half, 2) per token
    float *xt = x + (size_t)t * ld;
    for (int32_t idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        int32_t head = idx / half, i = idx % half;
        float *v = xt + (size_t)head * hd;
        float co = c[2 * i], si = c[2 * i + 1];
        float x0 = v[i], x1 = v[i + half];
        v[i] = x0 * co - x1 * si;
        v[i + half] = x1 * co + x0 * si;
    }
}

cudaError_t lsc_rope(float *x, int32_t ld, int32_t n_heads, int32_t hd, const float *cs, int32_t T) {
    k_rope<<<T, LS_CUDA_BLOCK>>>(x, ld, n_heads, hd, cs);
    return cudaGetLastError();
}

// ---- K/V cache store ----

__global__ static void k_kv_store(const lsc_row_cache *rows, int32_t loop, const float *k, const float *v,
                                  int32_t n_kv, int32_t hd) {
    int32_t t = blockIdx.x;
    const lsc_row_cache r = rows[t];
    __half *kc = r.kc + loop * r.loop_stride, *vc = r.vc + loop * r.loop_stride;
    int32_t row = r.pos % r.cap;
    int32_t kv_dim = n_kv * hd;
    for (int32_t idx = threadIdx.x; idx < kv_dim; idx += blockDim.x) {
        int32_t kvh = idx / hd, d = idx % hd;
        size_t off = ((size_t)kvh * r.cap + row) * hd + d;
        kc[off] = __float2half_rn(k[(size_t)t * kv_dim + idx]);
        vc[off] = __float2half_rn(v[(size_t)t * kv_dim + idx]);
    }
}

cudaError_t lsc_kv_store(const lsc_row_cache *rows, int32_t loop, const float *k, const float *v, int32_t n_kv,
                         int32_t hd, int32_t T) {
    k_kv_store<<<T, LS_CUDA_BLOCK>>>(rows, loop, k, v, n_kv, hd);
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

// ---- attention: one block per (head, token), online softmax over tiles ----

/* Positions are visited in tiles of blockDim.x, in order. Per tile: each
 * thread scores one position (a head_dim dot product), the block takes the
 * tile max and rescales the running sum and output (m, l, acc) to the new
 * max, then thread d adds p_j * V[j][d] over the tile's positions in order.
 * Thread d < head_dim owns output dimension d. */
__global__ static void k_attention(float *att, const float *q, const lsc_row_cache *rows, int32_t loop,
                                   int32_t n_heads, int32_t n_kv, int32_t hd) {
    __shared__ float qs[LS_CUDA_MAX_HEAD_DIM];
    __shared__ float ps[LS_CUDA_BLOCK];
    __shared__ float red[32];
    int32_t head = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const lsc_row_cache r = rows[t];
    const __half *kc = r.kc + loop * r.loop_stride, *vc = r.vc + loop * r.loop_stride;
    int32_t p = r.pos, window = r.window, cap = r.cap;
    int32_t lo = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
    int32_t cnt = p - lo + 1;
    int32_t kvh = head / (n_heads / n_kv);
    const __half *K = kc + (size_t)kvh * cap * hd;
    const __half *V = vc + (size_t)kvh * cap * hd;
    size_t qo = ((size_t)t * n_heads + head) * hd;

    for (int32_t d = tid; d < hd; d += blockDim.x) qs[d] = q[qo + d];
    __syncthreads();

    float scale = 1.0f / sqrtf((float)hd);
    float m = -INFINITY, l = 0.0f, acc = 0.0f;
    for (int32_t base = 0; base < cnt; base += blockDim.x) {
        int32_t n = cnt - base < (int32_t)blockDim.x ? cnt - base : (int32_t)blockDim.x;
        float s = -INFINITY;
        if (tid < n) {
            const __half *kr = K + (size_t)((lo + base + tid) % cap) * hd;
            float dot = 0.0f;
            for (int32_t d = 0; d < hd; d++) dot = fmaf(qs[d], __half2float(kr[d]), dot);
            s = dot * scale;
        }
        float m_new = fmaxf(m, block_max(s, red));
        float e = tid < n ? expf(s - m_new) : 0.0f;
        ps[tid] = e;
        float tile_sum = block_sum(e, red); // its barriers also publish ps
        float corr = expf(m - m_new);       // 0 on the first tile (m = -inf)
        l = l * corr + tile_sum;
        if (tid < hd) {
            float a = acc * corr;
            for (int32_t j = 0; j < n; j++)
                a = fmaf(ps[j], __half2float(V[(size_t)((lo + base + j) % cap) * hd + tid]), a);
            acc = a;
        }
        m = m_new;
        __syncthreads(); // ps is rewritten by the next tile
    }
    if (tid < hd) att[qo + tid] = acc / l;
}

cudaError_t lsc_attention(float *att, const float *q, const lsc_row_cache *rows, int32_t loop, int32_t n_heads,
                          int32_t n_kv, int32_t hd, int32_t T) {
    dim3 grid((unsigned)n_heads, (unsigned)T);
    k_attention<<<grid, LS_CUDA_BLOCK>>>(att, q, rows, loop, n_heads, n_kv, hd);
    return cudaGetLastError();
}

// ---- swiglu ----

__global__ static void k_swiglu(float *g, const float *u, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

cudaError_t lsc_swiglu(float *g, const float *u, int64_t n) {
    k_swiglu<<<blocks_for(n, LS_CUDA_BLOCK), LS_CUDA_BLOCK>>>(g, u, n);
    return cudaGetLastError();
}
