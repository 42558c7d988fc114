/*
 * selftest.cu — ls_cuda_selftest (loopserve_cuda.h): the device half of the
 * proofs that the CUDA library's arithmetic is the CPU library's, bit for
 * bit, for each enabled kernel family (quant_math.h and exit_math.h say how
 * each proof is split; the harness runs the host half). The kernels run on
 * generated inputs and are compared with the host execution of the same
 * functions:
 *   quantized  quant.cu: activation codes and scales, every matrix format
 *              (int4 and int2 blocks, int8 / int6 / int4 heads), group, a
 *              row length that ends mid-round, 1 to 64 tokens (every tile),
 *              store and add, and the embedding read from a quantized head;
 *   stacks     exits.cu: the exit gate's decisions and distributions over
 *              four steps, gates of dim 2048 and 64, thresholds 0 to 1.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

namespace {

uint64_t rng_state = 0x9e3779b97f4a7c15ull;
uint32_t next() {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* Host and device copies of one generated case's buffers. */
struct buffers {
    void *dev[6] = {};
    ~buffers() {
        for (void *p : dev)
            if (p) cudaFree(p);
    }
};

struct selftest {
    char *report;
    int32_t report_len;
    int32_t failed = 0, cases = 0;
    cudaError_t error = cudaSuccess;

    void fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    bool ok(cudaError_t e) {
        if (e != cudaSuccess && error == cudaSuccess) error = e;
        return e == cudaSuccess;
    }
};

void selftest::fail(const char *fmt, ...) {
    if (failed++ > 0) return; /* the first difference is the one reported */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(report, (size_t)report_len, fmt, ap);
    va_end(ap);
}

/* Bit for bit, except that any NaN equals any NaN: x86 makes the negative
 * default NaN where CUDA makes the positive canonical one. */
bool same(float a, float b) { return (a != a && b != b) || memcmp(&a, &b, sizeof a) == 0; }

/* One format, group and row length: weights, then every token count. */
void run_case(selftest &st, int32_t bits, int32_t group, int32_t in) {
    const int32_t rows = 37, max_T = 64, ng = in / group;
    const size_t wbytes = (size_t)rows * (size_t)lsq_row_bytes(in, bits), ns = (size_t)rows * (size_t)ng;
    uint8_t *qweight = (uint8_t *)malloc(wbytes);
    uint16_t *scales = (uint16_t *)malloc(ns * 2), *zeros = (uint16_t *)malloc(ns * 2);
    float *x = (float *)malloc((size_t)max_T * in * sizeof(float)), *y = (float *)malloc((size_t)max_T * rows * sizeof(float));
    float *y0 = (float *)malloc((size_t)max_T * rows * sizeof(float)), *d = (float *)malloc(max_T * sizeof(float));
    int8_t *q = (int8_t *)malloc((size_t)max_T * in), *q_dev_copy = (int8_t *)malloc((size_t)max_T * in);
    buffers b;
    bool host = qweight && scales && zeros && x && y && y0 && d && q && q_dev_copy;
    if (host) {
        for (size_t i = 0; i < wbytes; i++) {
            qweight[i] = (uint8_t)next();
            if (bits == 8 && qweight[i] == 0x80) qweight[i] = 0x81; /* int8 codes are in [-127, 127] */
        }
        for (size_t i = 0; i < ns; i++) {
            scales[i] = (uint16_t)((0x1c00 + next() % 0x1000) | (next() & 1 ? 0x8000 : 0));
            zeros[i] = (uint16_t)((0x1c00 + next() % 0x1000) | (next() & 1 ? 0x8000 : 0));
        }
        const float specials[] = {NAN, INFINITY, -INFINITY, 1e-45f, 3e38f, -0.0f, 0.5f};
        for (int32_t i = 0; i < max_T * in; i++) {
            float v = (float)((int32_t)(next() % 20001) - 10000) / 1000.0f;
            int32_t t = i / in;
            x[i] = t % 7 == 3 ? 0.0f : (t % 5 == 2 && i % 11 == 0) ? specials[next() % 7] : v;
        }
        for (int32_t i = 0; i < max_T * rows; i++) y0[i] = (float)((int32_t)(next() % 2001) - 1000) / 100.0f;
        for (int32_t t = 0; t < max_T; t++) lsq_quantize_row_ref(q + (size_t)t * in, &d[t], x + (size_t)t * in, in);
    }
    size_t sizes[6] = {wbytes, ns * 2, ns * 2, (size_t)max_T * in * sizeof(float), (size_t)max_T * rows * sizeof(float),
                       (size_t)max_T * in + max_T * sizeof(float)};
    for (int i = 0; host && i < 6; i++)
        if (!st.ok(cudaMalloc(&b.dev[i], sizes[i]))) host = false;
    if (host) {
        st.ok(cudaMemcpy(b.dev[0], qweight, wbytes, cudaMemcpyHostToDevice));
        st.ok(cudaMemcpy(b.dev[1], scales, ns * 2, cudaMemcpyHostToDevice));
        st.ok(cudaMemcpy(b.dev[2], zeros, ns * 2, cudaMemcpyHostToDevice));
        st.ok(cudaMemcpy(b.dev[3], x, sizes[3], cudaMemcpyHostToDevice));
    }
    lsq_matrix w = {(const uint8_t *)b.dev[0], (const uint16_t *)b.dev[1], bits == 2 ? (const uint16_t *)b.dev[2] : NULL,
                    rows, in, group, bits};
    lsq_matrix hw = {qweight, scales, bits == 2 ? zeros : NULL, rows, in, group, bits};
    int8_t *dq = (int8_t *)b.dev[5];
    float *dd = (float *)(dq + (size_t)max_T * in), *dy = (float *)b.dev[4];
    const int32_t Ts[] = {1, 2, 3, 5, 8, 9, 64};
    for (int32_t ti = 0; host && st.error == cudaSuccess && ti < 7; ti++) {
        const int32_t T = Ts[ti];
        /* activations: the T rows quantized in one launch */
        float dh[64];
        if (!st.ok(lsc_quantize(dq, dd, (const float *)b.dev[3], in, in, T)) ||
            !st.ok(cudaMemcpy(q_dev_copy, dq, (size_t)T * in, cudaMemcpyDeviceToHost)) ||
            !st.ok(cudaMemcpy(dh, dd, T * sizeof(float), cudaMemcpyDeviceToHost)))
            break;
        for (int32_t t = 0; t < T; t++)
            if (!same(dh[t], d[t]) || memcmp(q_dev_copy + (size_t)t * in, q + (size_t)t * in, (size_t)in) != 0)
                st.fail("activation row %d of %d (in %d): device codes or scale differ from the host's", t, T, in);
        st.cases++;
        for (int add = 0; add <= 1; add++) {
            if (!st.ok(cudaMemcpy(dy, y0, (size_t)T * rows * sizeof(float), cudaMemcpyHostToDevice)) ||
                !st.ok(lsc_qmatmul(dy, rows, dq, dd, &w, T, add)) ||
                !st.ok(cudaMemcpy(y, dy, (size_t)T * rows * sizeof(float), cudaMemcpyDeviceToHost)))
                break;
            for (int32_t t = 0; t < T; t++)
                for (int32_t o = 0; o < rows; o++) {
                    float want = lsq_row_ref(&hw, o, q + (size_t)t * in, d[t], y0[(size_t)t * rows + o], add);
                    float got = y[(size_t)t * rows + o];
                    if (!same(want, got))
                        st.fail("int%d G %d in %d, %d tokens%s: row %d token %d: device %.9g, host %.9g", bits, group, in,
                                T, add ? ", add" : "", o, t, got, want);
                }
            st.cases++;
        }
    }
    /* the embedding read from this matrix as a head */
    if (host && st.error == cudaSuccess && bits != 2) {
        int32_t tokens[5] = {0, rows - 1, 7, 7, 20};
        float *dh = (float *)b.dev[3]; /* x is no longer needed on the device */
        int32_t *dt = (int32_t *)b.dev[4];
        float *h = x; /* the host rows of x are no longer needed either */
        if (st.ok(cudaMemcpy(dt, tokens, sizeof tokens, cudaMemcpyHostToDevice)) &&
            st.ok(lsc_embed_quantized(dh, &w, dt, 5)) &&
            st.ok(cudaMemcpy(h, dh, (size_t)5 * in * sizeof(float), cudaMemcpyDeviceToHost)))
            for (int32_t t = 0; t < 5; t++) {
                const uint8_t *row = qweight + (size_t)tokens[t] * lsq_row_bytes(in, bits);
                for (int32_t i = 0; i < in; i++) {
                    float want = lsq_mul((float)lsq_code(row, in, i, bits), lsq_f16(scales[(size_t)tokens[t] * ng + i / group]));
                    if (!same(want, h[(size_t)t * in + i]))
                        st.fail("int%d head row %d input %d as the embedding: device %.9g, host %.9g", bits, tokens[t], i,
                                h[(size_t)t * in + i], want);
                }
            }
        st.cases++;
    }
    if (!host && st.error == cudaSuccess) st.fail("out of memory generating int%d G %d in %d", bits, group, in);
    free(qweight);
    free(scales);
    free(zeros);
    free(x);
    free(y);
    free(y0);
    free(d);
    free(q);
    free(q_dev_copy);
}

/* Rows of a dim-2048 and a dim-64 gate, thresholds across [0, 1], four
 * steps each: the device's decisions and distributions against the host's. */
void run_exit_case(selftest &st, int32_t dim) {
    const int32_t rows = 64, steps = 4;
    buffers bufs;
    float *h = (float *)malloc((size_t)rows * dim * sizeof(float)), *gate = (float *)malloc(((size_t)dim + 1) * sizeof(float));
    lsx_exit_state states[64], got[64];
    int32_t asks[128], exited[64];
    float *h_dev = NULL, *gate_dev = NULL;
    int32_t *asks_dev = NULL, *exited_dev = NULL;
    lsx_exit_state *states_dev = NULL;
    bool ok = h && gate && st.ok(cudaMalloc((void **)&h_dev, (size_t)rows * dim * sizeof(float))) &&
              st.ok(cudaMalloc((void **)&gate_dev, ((size_t)dim + 1) * sizeof(float))) &&
              st.ok(cudaMalloc((void **)&asks_dev, sizeof asks)) && st.ok(cudaMalloc((void **)&exited_dev, sizeof exited)) &&
              st.ok(cudaMalloc((void **)&states_dev, sizeof states));
    void *owned[5] = {h_dev, gate_dev, asks_dev, exited_dev, states_dev};
    for (int i = 0; i < 5; i++) bufs.dev[i] = owned[i];
    const float spread = 3.0f / sqrtf((float)dim);
    for (int32_t i = 0; ok && i <= dim; i++) gate[i] = ((float)next() / 2147483648.0f - 1.0f) * (i == dim ? 2.0f : spread);
    for (int32_t r = 0; ok && r < rows; r++) {
        states[r] = lsx_exit_state{(float)r / (float)(rows - 1), 1.0f, 0.0f};
        asks[2 * r] = rows - 1 - r; /* rows read out of order */
        asks[2 * r + 1] = r;
    }
    ok = ok && st.ok(cudaMemcpy(gate_dev, gate, ((size_t)dim + 1) * sizeof(float), cudaMemcpyHostToDevice)) &&
         st.ok(cudaMemcpy(states_dev, states, sizeof states, cudaMemcpyHostToDevice)) &&
         st.ok(cudaMemcpy(asks_dev, asks, sizeof asks, cudaMemcpyHostToDevice));
    for (int32_t s = 0; ok && s < steps; s++) {
        for (int64_t i = 0; i < (int64_t)rows * dim; i++) h[i] = ((float)next() / 2147483648.0f - 1.0f) * 1.7f;
        ok = st.ok(cudaMemcpy(h_dev, h, (size_t)rows * dim * sizeof(float), cudaMemcpyHostToDevice)) &&
             st.ok(lsc_exit_decide(exited_dev, asks_dev, rows, h_dev, gate_dev, dim, states_dev)) &&
             st.ok(cudaMemcpy(exited, exited_dev, sizeof exited, cudaMemcpyDeviceToHost)) &&
             st.ok(cudaMemcpy(got, states_dev, sizeof got, cudaMemcpyDeviceToHost));
        for (int32_t i = 0; ok && i < rows; i++) {
            const int32_t r = asks[2 * i + 1];
            const int want = lsx_exit_step(&states[r], lsx_gate_lambda(lsx_gate_logit(h + (int64_t)asks[2 * i] * dim, gate, dim)));
            st.cases++;
            if (want != exited[i] || !same(states[r].remaining, got[r].remaining) || !same(states[r].cdf, got[r].cdf))
                st.fail("exit gate, dim %d, step %d, row %d: device cdf %.9g remaining %.9g exits %d, host %.9g %.9g %d",
                        dim, s, r, got[r].cdf, got[r].remaining, exited[i], states[r].cdf, states[r].remaining, want);
            states[r] = got[r]; /* each step from the device's state: a difference is reported once */
        }
    }
    free(h);
    free(gate);
}

/* One family's cases through run, then its summary (or the first difference) in report. */
template <typename Run>
int32_t family_part(char *report, int32_t report_len, Run run, const char *summary) {
    selftest st{report, report_len};
    run(st);
    if (st.error != cudaSuccess) {
        snprintf(report, (size_t)report_len, "CUDA error: %s", cudaGetErrorString(st.error));
        cudaGetLastError();
        return LS_ERR_STATE;
    }
    if (st.failed == 0) snprintf(report, (size_t)report_len, "%d cases bit-identical: %s", st.cases, summary);
    return st.failed;
}

} // namespace

extern "C" int32_t ls_cuda_selftest(char *report, int32_t report_len) {
    if (!report || report_len < 1) return LS_ERR_ARG;
    report[0] = 0;
    if (ls_cuda_device_count() < 1) {
        snprintf(report, (size_t)report_len, "no usable CUDA device");
        return LS_ERR_STATE;
    }
    int32_t failed = 0, ran = 0;
    /* each enabled family's part, their reports joined */
    for (int32_t family : {LS_CUDA_KERNELS_QUANT, LS_CUDA_KERNELS_STACKS}) {
        if (!(lsc_kernels_on() & family)) continue;
        size_t used = strlen(report);
        if (used + 3 >= (size_t)report_len) break;
        if (used) {
            strcat(report, "; ");
            used += 2;
        }
        char *part = report + used;
        const int32_t part_len = report_len - (int32_t)used;
        int32_t rc = family == LS_CUDA_KERNELS_QUANT
                         ? family_part(part, part_len,
                                       [](selftest &st) {
                                           const int32_t formats[][2] = {{4, 32}, {2, 32}, {8, 32}, {6, 64}}; /* bits, smallest group (int6: rows of 64) */
                                           for (const auto &f : formats)
                                               for (int32_t group = f[1]; group <= LS_QUANT_GROUP_MAX && st.error == cudaSuccess; group *= 2)
                                                   for (int32_t in : {256, 1280}) run_case(st, f[0], group, in);
                                       },
                                       "activation codes, int4/int2 blocks, int8/int6/int4 heads, groups 32-256, 256 and "
                                       "1280 inputs, 1-64 tokens, store and add, the embedding from a quantized head")
                         : family_part(part, part_len,
                                       [](selftest &st) {
                                           for (int32_t dim : {2048, 64})
                                               if (st.error == cudaSuccess) run_exit_case(st, dim);
                                       },
                                       "exit decisions and distributions, gates of dim 2048 and 64, thresholds 0 to 1, four steps");
        if (rc < 0) return rc;
        failed += rc;
        ran++;
    }
    if (ran == 0) snprintf(report, (size_t)report_len, "no kernel family with a self-test is enabled");
    return failed;
}
