/*
 * sample.cu — greedy sampling on the device with kernels/sample.c's rules
 * (steps 1-3 of the procedure written there):
 *   1. v[i] = logits[i], NaN read as -inf; each distinct history id h in
 *      [0, vocab) gets v[h] = logits[h] / penalty if logits[h] > 0, else
 *      logits[h] * penalty (computed from the untouched logit, so writing it
 *      once per occurrence of h gives the same value: repeats are harmless);
 *   2-3. the first id in rank order (greater value first, lower id on ties)
 *      is returned; if its value is -inf no logit is usable: LS_ERR_ARG.
 * The argmax is a reduction over a strict total order, so its result does
 * not depend on the reduction's shape: it equals the CPU's serial scan.
 *
 * Temperature draws are not re-implemented here: runtime.cu copies the
 * logits to the host and calls sample.c's ls_sample, which keeps the
 * counter-based RNG and its order-sensitive double sums in one place.
 */
#include <math.h>

#include "cuda_internal.h"

#define ARGMAX_THREADS 1024

__device__ static inline float usable(float x) { return x != x ? -INFINITY : x; }

__global__ static void k_penalize_copy(float *v, const float *logits, int32_t vocab) {
    int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < vocab) v[i] = usable(logits[i]);
}

__global__ static void k_penalize_history(float *v, const float *logits, int32_t vocab, const int32_t *history,
                                          int32_t n_history, float penalty) {
    int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_history) return;
    int32_t h = history[j];
    if (h < 0 || h >= vocab) return;
    float l = usable(logits[h]);
    v[h] = l > 0.0f ? l / penalty : l * penalty;
}

/* Does (va, ia) rank before (vb, ib)? */
__device__ static inline bool ranks_before(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

__global__ static void k_argmax(int32_t *out, const float *v, int32_t vocab) {
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int32_t si[ARGMAX_THREADS];
    float bv = -INFINITY;
    int32_t bi = INT32_MAX; // any id ranks before it, -inf ones included
    /* four reads in flight per thread; the order of the comparisons does not
     * matter, the rank order being strict and total */
    for (int32_t base = threadIdx.x; base < vocab; base += 4 * blockDim.x) {
        float x[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int32_t i = base + u * blockDim.x;
            x[u] = i < vocab ? usable(v[i]) : -INFINITY;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int32_t i = base + u * blockDim.x;
            if (i < vocab && ranks_before(x[u], i, bv, bi)) {
                bv = x[u];
                bi = i;
            }
        }
    }
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int32_t stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if ((int32_t)threadIdx.x < stride) {
            int32_t o = threadIdx.x + stride;
            if (ranks_before(sv[o], si[o], sv[threadIdx.x], si[threadIdx.x])) {
                sv[threadIdx.x] = sv[o];
                si[threadIdx.x] = si[o];
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = sv[0] == -INFINITY ? LS_ERR_ARG : si[0];
}

cudaError_t lsc_argmax(int32_t *out, float *penalized, const float *logits, int32_t vocab,
                       const int32_t *history, int32_t n_history, float penalty) {
    const float *v = logits;
    if (penalty != 1.0f && n_history > 0) {
        unsigned threads = 256;
        k_penalize_copy<<<(vocab + threads - 1) / threads, threads>>>(penalized, logits, vocab);
        k_penalize_history<<<(n_history + threads - 1) / threads, threads>>>(penalized, logits, vocab, history,
                                                                            n_history, penalty);
        v = penalized;
    }
    k_argmax<<<1, ARGMAX_THREADS>>>(out, v, vocab);
    return cudaGetLastError();
}
