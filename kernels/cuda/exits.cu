/*
 * exits.cu — the device side of learned early exit in a batched step
 * (block_steps.h runs the schedule, batch.cu its operations): each asked
 * row's gate and exit decision (exit_math.h, the CPU library's arithmetic
 * in its order), rows of a block moving when the running ones are put in
 * order, and the copy policy's copies of an exit step's keys and values
 * into the units a row skipped (selftest.cu holds the gate to its host
 * execution).
 */
#include "cuda_internal.h"
#include "reduce.cuh"

#define EXIT_THREADS 64 /* a block's rows: one thread each */

/* Thread i: asked row i. The logit is one serial sum (the CPU library's
 * order), so a thread owns a row's whole gate. */
__global__ static void k_exit_decide(int32_t *exited, const int32_t *asks, int32_t n, const float *h, const float *gate,
                                     int32_t dim, lsx_exit_state *states) {
    const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float z = lsx_gate_logit(h + (int64_t)asks[2 * i] * dim, gate, dim);
    exited[i] = lsx_exit_step(&states[asks[2 * i + 1]], lsx_gate_lambda(z));
}

cudaError_t lsc_exit_decide(int32_t *exited, const int32_t *asks, int32_t n, const float *h, const float *gate,
                            int32_t dim, lsx_exit_state *states) {
    k_exit_decide<<<blocks_for(n, EXIT_THREADS), EXIT_THREADS>>>(exited, asks, n, h, gate, dim, states);
    return cudaGetLastError();
}

__global__ static void k_gather_rows(float *dst, const float *src, const int32_t *from, int32_t dim) {
    const float *s = src + (int64_t)from[blockIdx.x] * dim;
    float *d = dst + (int64_t)blockIdx.x * dim;
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) d[i] = s[i];
}

cudaError_t lsc_gather_rows(float *dst, const float *src, const int32_t *from, int32_t n, int32_t dim) {
    if (n < 1) return cudaSuccess;
    k_gather_rows<<<n, LS_CUDA_BLOCK>>>(dst, src, from, dim);
    return cudaGetLastError();
}

/* Block (u - from, kv head): unit u's keys and values at ring row `row`
 * from the same layer's unit in the step before `from`. */
__global__ static void k_copy_units(__half *kc, __half *vc, int64_t loop_stride, int32_t cap, int32_t row,
                                    int32_t from, int32_t layers, int32_t hd) {
    const int32_t u = from + blockIdx.x, src = from - layers + u % layers, kvh = blockIdx.y;
    const int64_t at = ((int64_t)kvh * cap + row) * hd;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        kc[u * loop_stride + at + d] = kc[src * loop_stride + at + d];
        vc[u * loop_stride + at + d] = vc[src * loop_stride + at + d];
    }
}

cudaError_t lsc_copy_units(__half *kc, __half *vc, int64_t loop_stride, int32_t cap, int32_t row, int32_t from,
                           int32_t to, int32_t layers, int32_t n_kv, int32_t hd) {
    if (to <= from) return cudaSuccess;
    dim3 grid((unsigned)(to - from), (unsigned)n_kv);
    k_copy_units<<<grid, 128>>>(kc, vc, loop_stride, cap, row, from, layers, hd);
    return cudaGetLastError();
}
