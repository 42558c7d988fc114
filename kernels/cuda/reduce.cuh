/*
 * reduce.cuh — the reductions and launch arithmetic the kernels of
 * libloopserve_cuda.so share (ops.cu, quant.cu). Each reduction has a fixed
 * shape that depends only on the block or warp size, never on how many
 * tokens share a launch.
 */
#ifndef LS_CUDA_REDUCE_CUH
#define LS_CUDA_REDUCE_CUH

#include <stdint.h>

#define FULL_MASK 0xffffffffu

/* How partial results combine, as functors so the reductions take any. */
struct add_op {
    __device__ float operator()(float a, float b) const { return a + b; }
};

/* Reduction over a warp (shuffle tree; lane 0 holds the result). */
template <typename Op> __device__ static inline float warp_reduce(float v, Op op) {
    for (int off = 16; off > 0; off >>= 1) v = op(v, __shfl_down_sync(FULL_MASK, v, off));
    return v;
}

/* Reduction over the block, returned to every thread; `identity` fills the
 * lanes past the last warp. blockDim.x is a multiple of 32; red holds 32
 * floats. The leading barrier keeps a previous call's result readable until
 * every thread has read it. */
template <typename Op> __device__ static inline float block_reduce(float v, float *red, Op op, float identity) {
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

__device__ static inline float warp_sum(float v) { return warp_reduce(v, add_op()); }
__device__ static inline float block_sum(float v, float *red) { return block_reduce(v, red, add_op(), 0.0f); }

static inline unsigned blocks_for(int64_t n, int per_block) { return (unsigned)((n + per_block - 1) / per_block); }

/* Warps per block of the row-per-warp kernels (matmuls). */
#define MM_WARPS (LS_CUDA_BLOCK / 32)

#endif
