/*
 * features.cu — what libloopserve_cuda.so lacks, as the ABI reports it
 * (loopserve.h, ls_features): speculative decoding, the per-op profile and
 * the compressed key/value cache modes, and the weight quantizer (which
 * the command line runs on the CPU library). Their entry points exist all the
 * same, so one binding opens either library; they answer LS_ERR_UNSUPPORTED
 * (ls_session_new refuses a compressed kv_mode with a message).
 */
#include "cuda_internal.h"

extern "C" int32_t ls_features(void) { return 0; }

extern "C" void ls_model_set_profile(ls_model *m, int32_t on) {
    (void)m;
    (void)on;
}

extern "C" int32_t ls_model_profile_read(ls_model *m, double *out, int32_t n, int32_t reset) {
    (void)m;
    (void)out;
    (void)n;
    (void)reset;
    return LS_ERR_UNSUPPORTED;
}

extern "C" int32_t ls_spec_cycle_logits(ls_session *s, int32_t pending, const ls_spec_params *params,
                                        int32_t *out_tokens, int32_t *out_stats, float *logits_out) {
    (void)s;
    (void)pending;
    (void)params;
    (void)out_tokens;
    (void)out_stats;
    (void)logits_out;
    return LS_ERR_UNSUPPORTED;
}

extern "C" int32_t ls_spec_cycle(ls_session *s, int32_t pending, const ls_spec_params *params, int32_t *out_tokens,
                                 int32_t *out_stats) {
    return ls_spec_cycle_logits(s, pending, params, out_tokens, out_stats, NULL);
}

extern "C" ls_quantizer *ls_quantizer_new(int32_t n_threads, int32_t simd, char *err, int32_t err_len) {
    (void)n_threads;
    (void)simd;
    ls_set_error(err, err_len, "the CUDA library has no weight quantizer (LS_FEATURE_QUANTIZE); use libloopserve.so");
    return NULL;
}

extern "C" void ls_quantizer_free(ls_quantizer *q) { (void)q; }

extern "C" int32_t ls_quantizer_simd(const ls_quantizer *q) {
    (void)q;
    return LS_ERR_UNSUPPORTED;
}

extern "C" int32_t ls_quantize(ls_quantizer *q, const ls_quantize_params *p, const void *src, int32_t rows,
                               uint8_t *qweight, uint16_t *scales, uint16_t *zeros, char *err, int32_t err_len) {
    (void)q;
    (void)p;
    (void)src;
    (void)rows;
    (void)qweight;
    (void)scales;
    (void)zeros;
    (void)err;
    (void)err_len;
    return LS_ERR_UNSUPPORTED;
}
