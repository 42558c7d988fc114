/*
 * stage.cu — a block's small per-step inputs (its rows' cache descriptors,
 * tokens and RoPE rows) written into pinned host memory laid out as the
 * block's device stage (cuda_internal.h, LSC_STAGE_*), and uploaded in one
 * asynchronous copy: one transfer a step instead of several synchronous
 * ones, each a host round trip (LS_CUDA_KERNELS_RESIDENT). The bytes the
 * kernels read are the same as the separate copies': only how they travel
 * changes.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

static_assert(LSC_STAGE_ROWS % 256 == 0 && LSC_STAGE_TOKENS % 256 == 0, "each part of a stage starts 256-byte aligned");

struct lsc_uploader {
    unsigned char *host; /* pinned, LSC_STAGE_BYTES(head_dim) */
    cudaEvent_t copied;  /* recorded after the last upload: the host copy may be rewritten once it has passed */
};

lsc_uploader *lsc_uploader_new(int32_t head_dim) {
    lsc_uploader *u = (lsc_uploader *)calloc(1, sizeof *u);
    if (!u) return NULL;
    if (cudaHostAlloc((void **)&u->host, LSC_STAGE_BYTES(head_dim), cudaHostAllocDefault) != cudaSuccess) u->host = NULL;
    if (!u->host || cudaEventCreateWithFlags(&u->copied, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError(); // a failed allocation leaves no sticky error
        if (u->host) cudaFreeHost(u->host);
        free(u);
        return NULL;
    }
    memset(u->host, 0, LSC_STAGE_BYTES(head_dim)); /* the rows past a call's T go up too: never undefined bytes */
    return u;
}

void lsc_uploader_free(lsc_uploader *u) {
    if (!u) return;
    cudaEventDestroy(u->copied);
    cudaFreeHost(u->host);
    free(u);
}

cudaError_t lsc_uploader_ready(lsc_uploader *u, lsc_row_cache **rows, int32_t **tokens, float **rope) {
    *rows = (lsc_row_cache *)u->host;
    *tokens = (int32_t *)(u->host + LSC_STAGE_ROWS);
    *rope = (float *)(u->host + LSC_STAGE_ROWS + LSC_STAGE_TOKENS);
    return cudaEventSynchronize(u->copied); /* an event never recorded counts as passed */
}

cudaError_t lsc_upload_staged(lsc_uploader *u, const lsc_block *b, int32_t T, int32_t head_dim) {
    /* the rows and tokens parts whole (small), the RoPE part as far as the T rows reach */
    const size_t bytes = LSC_STAGE_ROWS + LSC_STAGE_TOKENS + (size_t)T * head_dim * sizeof(float);
    cudaError_t e = cudaMemcpyAsync(b->stage, u->host, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread);
    return e != cudaSuccess ? e : cudaEventRecord(u->copied, cudaStreamPerThread);
}
