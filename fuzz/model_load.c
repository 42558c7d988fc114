/*
 * model_load.c — libFuzzer target for what the kernel library checks of
 * untrusted input when it loads a model (kernels/model.c): the model
 * descriptor (loopserve.h, ls_model_desc: dimensions, and each tensor's
 * byte range and dtype) against the mapped model file. The file's own
 * format is validated in TypeScript, fuzzed by fuzz/validator.ts.
 *
 * Each input is the descriptor up to its layers (ls_model_desc.layers), one
 * byte k, k layer slots (ls_layer_spans, at most LS_MAX_LAYERS), then the
 * model file's bytes; what an input lacks of the descriptor stays zero. The
 * whole descriptor is mostly empty layer slots and larger than the fuzzer's
 * inputs: the count keeps the file within reach. The file
 * goes through the public entry point, ls_model_load, by path: it is written
 * to an in-memory file (memfd) reopened through /proc/self/fd, so what is
 * fuzzed is exactly what the server runs. A model the loader accepts is then
 * run: one generation step (forward pass and sampling) over two tokens, so
 * weights that pass the checks are also safe to compute with.
 *
 * Built with LS_LOAD_TO_HEAP (model.c): the file is read into a heap buffer
 * of exactly its size, so AddressSanitizer reports a read one byte past it.
 * fuzz/build.ts compiles it with clang's libFuzzer; fuzz/replay_main.c runs
 * it over saved inputs without libFuzzer (the regression test).
 *
 * Findings beyond the sanitizers' own: a refusal with an empty message, or a
 * loaded model whose description contradicts the limits the loader enforces.
 */
#define _GNU_SOURCE /* memfd_create */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loopserve.h"

static int scratch_fd = -1;
static char scratch_path[64];

static void finding(const char *what, const char *detail) {
    fprintf(stderr, "model_load: %s: %s\n", what, detail);
    abort();
}

static void open_scratch(void) {
    scratch_fd = memfd_create("model_load_fuzz", MFD_CLOEXEC);
    if (scratch_fd < 0) {
        perror("memfd_create");
        exit(1);
    }
    snprintf(scratch_path, sizeof scratch_path, "/proc/self/fd/%d", scratch_fd);
}

static void write_scratch(const uint8_t *data, size_t size) {
    if (ftruncate(scratch_fd, 0) != 0 || ftruncate(scratch_fd, (off_t)size) != 0) {
        perror("ftruncate");
        exit(1);
    }
    for (size_t done = 0; done < size;) {
        ssize_t w = pwrite(scratch_fd, data + done, size - done, (off_t)done);
        if (w <= 0) {
            perror("pwrite");
            exit(1);
        }
        done += (size_t)w;
    }
}

// One ls_session_step over the first and last token ids, at up to two loops.
static void run_loaded(ls_model *m, size_t file_size) {
    ls_model_info info;
    ls_model_info_get(m, &info);
    // Every weight is in the file: a model larger than its file was not validated.
    if ((uint64_t)info.vocab_size * (uint64_t)info.dim * 2u > file_size)
        finding("loaded model larger than its file", "vocab_size * dim fp16 values do not fit");
    if (info.dim % info.n_heads != 0 || info.head_dim * info.n_heads != info.dim || info.head_dim % 2 != 0 ||
        info.n_heads % info.n_kv_heads != 0)
        finding("loaded model with inconsistent heads", "dim, n_heads, n_kv_heads, head_dim");

    int32_t n = info.max_seq_len < 2 ? 1 : 2;
    int32_t loops = info.default_loops < 2 ? info.default_loops : 2;
    char err[256] = "";
    ls_session_params sp = {.max_seq = n, .loops = loops};
    ls_session *s = ls_session_new(m, &sp, err, sizeof err);
    if (s == NULL) finding("session refused for a loaded model", err[0] ? err : "(no message)");
    int32_t tokens[2] = {0, info.vocab_size - 1};
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    if (logits == NULL) finding("out of memory", "logits");
    ls_step_params step = {.loops = loops, .sampling = {.temperature = 0.8f, .top_p = 0.9f, .repetition_penalty = 1.1f, .seed = 7}};
    int32_t tok = ls_session_step(s, tokens, n, &step, logits);
    // LS_ERR_ARG: every logit NaN, which weights may legitimately produce.
    if (tok != LS_ERR_ARG && (tok < 0 || tok >= info.vocab_size)) {
        char b[64];
        snprintf(b, sizeof b, "returned %d for vocab %d", tok, info.vocab_size);
        finding("ls_session_step on a loaded model", b);
    }
    free(logits);
    ls_session_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (scratch_fd < 0) open_scratch();
    static ls_model_desc desc;
    memset(&desc, 0, sizeof desc);
    const size_t head = offsetof(ls_model_desc, layers);
    size_t desc_bytes = size < head ? size : head;
    memcpy(&desc, data, desc_bytes);
    if (size > head) {
        size_t k = data[head] < LS_MAX_LAYERS ? data[head] : LS_MAX_LAYERS;
        size_t layer_bytes = k * sizeof desc.layers[0];
        if (layer_bytes > size - head - 1) layer_bytes = size - head - 1;
        memcpy(desc.layers, data + head + 1, layer_bytes);
        desc_bytes = head + 1 + layer_bytes;
    }
    write_scratch(data + desc_bytes, size - desc_bytes);
    char err[512];
    memset(err, 'x', sizeof err);
    ls_model *m = ls_model_load(scratch_path, &desc, 1, LS_SIMD_AUTO, err, sizeof err);
    if (m == NULL) {
        if (memchr(err, '\0', sizeof err) == NULL) finding("refusal message not terminated", "err");
        if (err[0] == '\0') finding("refused without a message", "err is empty");
        return 0;
    }
    run_loaded(m, size - desc_bytes);
    ls_model_free(m);
    return 0;
}
