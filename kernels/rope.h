/*
 * rope.h — the RoPE angle table, computed the same way by the CPU forward
 * pass (ops.h rope) and the CUDA library (kernels/cuda/runtime.cu), which
 * uploads it. Header-only so the CUDA library compiles it too. Not ABI.
 */
#ifndef LS_ROPE_H
#define LS_ROPE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* cs[t][i] = (cos, sin)(pos(t) * theta^(-2i/head_dim)), computed in double,
 * for the T positions pos0, pos0 + 1, ...: cs is (T, head_dim / 2, 2). */
static inline void ls_rope_table(float *cs, int32_t T, int32_t pos0, int32_t head_dim, float theta) {
    int32_t half = head_dim / 2;
    for (int32_t i = 0; i < half; i++) {
        double inv_freq = pow((double)theta, -2.0 * (double)i / (double)head_dim);
        for (int32_t t = 0; t < T; t++) {
            double ang = (double)(pos0 + t) * inv_freq;
            cs[((size_t)t * half + i) * 2] = (float)cos(ang);
            cs[((size_t)t * half + i) * 2 + 1] = (float)sin(ang);
        }
    }
}

#endif
