/*
 * model_desc.h — how the C drivers load a model: the library takes a model
 * descriptor (loopserve.h, ls_model_desc) that only the TypeScript
 * validator makes, so the test that writes a model file also writes its
 * descriptor beside it, as FILE.desc (test/helpers/model_descriptor.ts:
 * the struct's bytes exactly). Header-only: a driver includes it in the
 * file that loads models.
 */
#ifndef LS_TEST_MODEL_DESC_H
#define LS_TEST_MODEL_DESC_H

#include <stdio.h>
#include <string.h>

#include "loopserve.h"

/* Reads FILE.desc for the model at path; 0, or -1 with the reason in err. */
static int read_model_desc(const char *path, ls_model_desc *desc, char *err, int32_t err_len) {
    char desc_path[4096];
    snprintf(desc_path, sizeof desc_path, "%s.desc", path);
    FILE *f = fopen(desc_path, "rb");
    if (f == NULL) {
        snprintf(err, (size_t)err_len, "cannot open the model descriptor %s", desc_path);
        return -1;
    }
    memset(desc, 0, sizeof *desc);
    size_t got = fread(desc, 1, sizeof *desc, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != sizeof *desc || extra) {
        snprintf(err, (size_t)err_len, "%s is not a %zu-byte model descriptor", desc_path, sizeof *desc);
        return -1;
    }
    return 0;
}

/* ls_model_load of the model at path with its FILE.desc. */
static ls_model *load_model(const char *path, int32_t n_threads, int32_t simd, char *err, int32_t err_len) {
    ls_model_desc desc;
    if (read_model_desc(path, &desc, err, err_len) != 0) return NULL;
    return ls_model_load(path, &desc, n_threads, simd, err, err_len);
}

#endif
