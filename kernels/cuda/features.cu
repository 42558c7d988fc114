/*
 * features.cu — what libloopserve_cuda.so does, as the ABI reports it
 * (loopserve.h, ls_features), and the selector of the kernel families that
 * have not yet passed a validation run on a GPU (loopserve_cuda.h,
 * ls_cuda_kernels).
 *
 * It lacks speculative decoding, the per-op profile, the compressed
 * key/value cache modes, token masks and the weight quantizer (which the
 * command line runs on the CPU library); quantized weights and stacks
 * come with their kernel families. Their entry points exist all the same,
 * so one binding opens either library; they answer LS_ERR_UNSUPPORTED
 * (ls_session_new refuses a compressed kv_mode with a message), their
 * parameters unnamed since they read none.
 */
#include "cuda_internal.h"

/* The families a validation run on a GPU has passed with: on for every
 * model. A family joins this set in the change that commits the JSON of
 * its first passing run (bench/gpu-runs/). */
#define LSC_KERNELS_VERIFIED (LS_CUDA_KERNELS_QUANT | LS_CUDA_KERNELS_STACKS) /* gpu-2026-11-28-h200.json */

/* The unverified families the caller enabled (ls_cuda_kernels). */
static int32_t enabled_families;

extern "C" int32_t ls_cuda_kernels_verified(void) { return LSC_KERNELS_VERIFIED; }

extern "C" int32_t ls_cuda_kernels(int32_t families) {
    if (families != -1) enabled_families = families & LS_CUDA_KERNELS_ALL;
    return lsc_kernels_on();
}

int32_t lsc_kernels_on(void) { return LSC_KERNELS_VERIFIED | enabled_families; }

extern "C" int32_t ls_features(void) {
    const int32_t on = lsc_kernels_on();
    return (on & LS_CUDA_KERNELS_QUANT ? LS_FEATURE_QUANTIZED : 0) | (on & LS_CUDA_KERNELS_STACKS ? LS_FEATURE_STACKS : 0);
}

extern "C" void ls_model_set_profile(ls_model *, int32_t) {}

extern "C" int32_t ls_model_profile_read(ls_model *, double *, int32_t, int32_t) {
    return LS_ERR_UNSUPPORTED;
}

extern "C" int32_t ls_spec_cycle_masked(ls_session *, int32_t, const ls_spec_params *, ls_mask_fn, void *,
                                        int32_t *, int32_t *, float *) {
    return LS_ERR_UNSUPPORTED;
}

extern "C" int32_t ls_spec_cycle_logits(ls_session *s, int32_t pending, const ls_spec_params *params,
                                        int32_t *out_tokens, int32_t *out_stats, float *logits_out) {
    return ls_spec_cycle_masked(s, pending, params, NULL, NULL, out_tokens, out_stats, logits_out);
}

extern "C" int32_t ls_spec_cycle(ls_session *s, int32_t pending, const ls_spec_params *params, int32_t *out_tokens,
                                 int32_t *out_stats) {
    return ls_spec_cycle_logits(s, pending, params, out_tokens, out_stats, NULL);
}

extern "C" ls_quantizer *ls_quantizer_new(int32_t, int32_t, char *err, int32_t err_len) {
    ls_set_error(err, err_len, "the CUDA library has no weight quantizer (LS_FEATURE_QUANTIZE); use libloopserve.so");
    return NULL;
}

extern "C" void ls_quantizer_free(ls_quantizer *) {}

extern "C" int32_t ls_quantizer_simd(const ls_quantizer *) {
    return LS_ERR_UNSUPPORTED;
}

extern "C" int32_t ls_quantize(ls_quantizer *, const ls_quantize_params *, const void *, int32_t,
                               uint8_t *, uint16_t *, uint16_t *, char *, int32_t) {
    return LS_ERR_UNSUPPORTED;
}
