/*
 * exit_math.h — the learned exit gate's arithmetic (loopserve.h, learned
 * early exit), written once for the CUDA library's gate kernel (exits.cu)
 * and the host programs that hold it to the CPU library: the harness
 * (bench/gpu/harness/, in CI) and the CUDA library's self-test
 * (ls_cuda_selftest, on a GPU). Plain C11 as well as CUDA C++.
 *
 * After each step s of a row that may exit, in the CPU library's order
 * (kernels/cpu/batch.c), every step a correctly rounded fp32 operation:
 *   z        = b + h[0] w[0] + h[1] w[1] + ...   one serial sum, products
 *                                               rounded before they are added
 *   lambda   = 1 / (1 + exp(-z))
 *   p        = lambda * r;  r = r * (1 - lambda);  cdf = cdf + p
 *   the row exits when cdf >= threshold.
 * exp is double exp rounded to fp32 on both sides (libm's on the host,
 * CUDA's on the device): the correctly rounded value but for arguments
 * within a double's last bit of a rounding boundary. The CPU library's
 * gate calls libm's expf, which is not correctly rounded everywhere (0.502
 * ulp): the harness measures where the two differ (one ulp of lambda, on
 * a few arguments in ten thousand).
 */
#ifndef LS_CUDA_EXIT_MATH_H
#define LS_CUDA_EXIT_MATH_H

#include <math.h>
#include <stdint.h>

#include "quant_math.h" /* lsq_add, lsq_mul, lsq_div: the pinned fp32 steps */

/* A row's running exit distribution (r_s and the cdf of exiting by now). */
typedef struct {
    float threshold;
    float remaining; /* 1 before the first step */
    float cdf;       /* 0 before the first step */
} lsx_exit_state;

LSQ_FN float lsx_exp(float x) { return (float)exp((double)x); }

/* The gate's logit for a hidden state h (dim): gate holds the dim weights,
 * then the bias (the CPU library's exit_gate layout). */
LSQ_FN float lsx_gate_logit(const float *h, const float *gate, int32_t dim) {
    float z = gate[dim];
    for (int32_t i = 0; i < dim; i++) z = lsq_add(z, lsq_mul(h[i], gate[i]));
    return z;
}

LSQ_FN float lsx_gate_lambda(float z) { return lsq_div(1.0f, lsq_add(1.0f, lsx_exp(-z))); }

/* One step's decision: folds lambda into the state; 1 when the row exits. */
LSQ_FN int lsx_exit_step(lsx_exit_state *e, float lambda) {
    const float p = lsq_mul(lambda, e->remaining);
    e->remaining = lsq_mul(e->remaining, lsq_add(1.0f, -lambda));
    e->cdf = lsq_add(e->cdf, p);
    return e->cdf >= e->threshold;
}

#endif
