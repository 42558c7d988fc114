/*
 * exits.cu — the device side of learned early exit in a batched step
 * (block_steps.h runs the schedule, batch.cu its operations): each asked
 * row's gate and exit decision (exit_math.h, the CPU library's arithmetic
 * in its order), rows of a block moving when the running ones are put in
 * order, and the copy policy's copies of an exit step's keys and values
 * into the units a row skipped. Also the gate's share of ls_cuda_selftest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

// ---- the self-test's share ----

namespace {

uint64_t gate_rng = 0x2545f4914f6cdd1dull;
float uniform_pm1() {
    gate_rng ^= gate_rng << 13;
    gate_rng ^= gate_rng >> 7;
    gate_rng ^= gate_rng << 17;
    return (float)((double)(gate_rng >> 11) * 0x1.0p-52 - 1.0);
}

bool same(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

} // namespace

/* Rows of a dim-2048 and a dim-64 gate, thresholds across [0, 1], four
 * steps each: the device's decisions and distributions against the host's. */
int32_t lsc_exit_selftest(char *report, int32_t report_len) {
    const int32_t rows = 64, steps = 4, dims[2] = {2048, 64};
    int32_t failed = 0, cases = 0;
    float *h_dev = NULL, *gate_dev = NULL;
    int32_t *asks_dev = NULL, *exited_dev = NULL;
    lsx_exit_state *states_dev = NULL;
    float *h = (float *)malloc((size_t)rows * 2048 * sizeof(float)), *gate = (float *)malloc(2049 * sizeof(float));
    lsx_exit_state states[64], got[64];
    int32_t asks[128], exited[64];
    cudaError_t e = h && gate ? cudaSuccess : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaMalloc((void **)&h_dev, (size_t)rows * 2048 * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&gate_dev, 2049 * sizeof(float));
    if (e == cudaSuccess) e = cudaMalloc((void **)&asks_dev, sizeof asks);
    if (e == cudaSuccess) e = cudaMalloc((void **)&exited_dev, sizeof exited);
    if (e == cudaSuccess) e = cudaMalloc((void **)&states_dev, sizeof states);
    for (int d = 0; d < 2 && e == cudaSuccess; d++) {
        const int32_t dim = dims[d];
        for (int32_t i = 0; i <= dim; i++) gate[i] = uniform_pm1() * (i == dim ? 2.0f : 3.0f / sqrtf((float)dim));
        for (int32_t r = 0; r < rows; r++) {
            states[r] = lsx_exit_state{(float)r / (float)(rows - 1), 1.0f, 0.0f};
            asks[2 * r] = rows - 1 - r; /* rows read out of order */
            asks[2 * r + 1] = r;
        }
        e = cudaMemcpy(gate_dev, gate, ((size_t)dim + 1) * sizeof(float), cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(states_dev, states, sizeof states, cudaMemcpyHostToDevice);
        if (e == cudaSuccess) e = cudaMemcpy(asks_dev, asks, sizeof asks, cudaMemcpyHostToDevice);
        for (int32_t s = 0; s < steps && e == cudaSuccess; s++) {
            for (int64_t i = 0; i < (int64_t)rows * dim; i++) h[i] = uniform_pm1() * 1.7f;
            e = cudaMemcpy(h_dev, h, (size_t)rows * dim * sizeof(float), cudaMemcpyHostToDevice);
            if (e == cudaSuccess) e = lsc_exit_decide(exited_dev, asks_dev, rows, h_dev, gate_dev, dim, states_dev);
            if (e == cudaSuccess) e = cudaMemcpy(exited, exited_dev, sizeof exited, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess) e = cudaMemcpy(got, states_dev, sizeof got, cudaMemcpyDeviceToHost);
            for (int32_t i = 0; i < rows && e == cudaSuccess; i++) {
                const int32_t r = asks[2 * i + 1];
                const float z = lsx_gate_logit(h + (int64_t)asks[2 * i] * dim, gate, dim);
                const int want = lsx_exit_step(&states[r], lsx_gate_lambda(z));
                cases++;
                if (want == exited[i] && same(states[r].remaining, got[r].remaining) && same(states[r].cdf, got[r].cdf))
                    continue;
                if (failed++ == 0)
                    snprintf(report, (size_t)report_len,
                             "exit gate, dim %d, step %d, row %d: device cdf %.9g remaining %.9g exits %d, host %.9g "
                             "%.9g %d",
                             dim, s, r, got[r].cdf, got[r].remaining, exited[i], states[r].cdf, states[r].remaining,
                             want);
                states[r] = got[r]; /* each step from the device's state: one difference reported once */
            }
        }
    }
    void *dev[] = {h_dev, gate_dev, asks_dev, exited_dev, states_dev};
    for (void *p : dev)
        if (p) cudaFree(p);
    free(h);
    free(gate);
    if (e != cudaSuccess) {
        snprintf(report, (size_t)report_len, "CUDA error in the exit gate's self-test: %s", cudaGetErrorString(e));
        cudaGetLastError();
        return LS_ERR_STATE;
    }
    if (failed == 0)
        snprintf(report, (size_t)report_len,
                 "%d exit decisions bit-identical: gates of dim 2048 and 64, thresholds 0 to 1, four steps", cases);
    return failed;
}
