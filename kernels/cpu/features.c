/*
 * features.c — the optional capabilities of libloopserve.so (loopserve.h,
 * ls_features): the CPU library implements all of them. The CUDA library
 * reports its own set (kernels/cuda/features.cu).
 */
#include "loopserve.h"

int32_t ls_features(void) {
    return LS_FEATURE_SPECULATIVE | LS_FEATURE_PROFILE | LS_FEATURE_KV_COMPRESSED | LS_FEATURE_STACKS |
           LS_FEATURE_QUANTIZED | LS_FEATURE_TOKEN_MASK | LS_FEATURE_QUANTIZE | LS_FEATURE_RECURRENT;
}
