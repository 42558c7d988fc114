// fuzz: mutated model files and descriptors through the loader.
#define _GNU_SOURCE /* memfd_create, mkstemp */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../model_desc.h"
#include "driver.h"

// A value that sits at a boundary of the checks, or anywhere.
static uint64_t edge_value(uint64_t old, uint64_t *st) {
    static const uint64_t edges[] = {0, 1, 2, 3, 7, 8, 31, 32, 64, 256, 4096, 65536, 65537, 1048577,
                                     0x7fffffffull, 0x80000000ull, 0xffffffffull, 0x8000000000000000ull,
                                     0xffffffffffffffffull};
    uint64_t r = rng_next(st);
    switch (r % 4) {
    case 0: return edges[rng_next(st) % (sizeof edges / sizeof edges[0])];
    case 1: return old + 1 + rng_next(st) % 4;
    case 2: return old - 1 - rng_next(st) % 4;
    default: return rng_next(st);
    }
}

// One mutation of the descriptor: a dimension, a tensor's range or dtype,
// a reserved field, or one tensor's span copied over another's.
static void mutate_desc(ls_model_desc *d, uint64_t *st) {
    uint64_t r = rng_next(st);
    ls_tensor_span *t = &d->tensors[rng_next(st) % LS_TENSOR_N];
    switch (r % 6) {
    case 0: { // a config field, as its 32 bits
        uint32_t w[sizeof d->config / 4];
        memcpy(w, &d->config, sizeof w);
        size_t k = rng_next(st) % (sizeof w / sizeof w[0]);
        w[k] = (uint32_t)edge_value(w[k], st);
        memcpy(&d->config, w, sizeof w);
        break;
    }
    case 1: t->offset = edge_value(t->offset, st); break;
    case 2: t->length = edge_value(t->length, st); break;
    case 3: t->dtype = (int32_t)(rng_next(st) % 5) - (rng_next(st) % 8 == 0 ? 7 : 0); break;
    case 4: t->reserved = (int32_t)(rng_next(st) % 3); break;
    default: *t = d->tensors[rng_next(st) % LS_TENSOR_N]; break;
    }
}

// Mutations of what the library still checks: the descriptor's fields
// against the file, and the file's bytes (cuts, non-finite weights); the
// loader must reject or accept each pair without a sanitizer report.
int cmd_fuzz(int argc, char **argv) {
    long long iters, seed;
    if (argc < 3 || argc > 4 || parse_i64(argv[1], 1, 10000000, &iters) != 0 ||
        parse_i64(argv[2], 0, INT64_MAX, &seed) != 0)
        return usage();
    int verbose = argc == 4 && strcmp(argv[3], "-v") == 0, rc = 0;
    char err[512];
    ls_model_desc orig_desc;
    if (read_model_desc(argv[0], &orig_desc, err, sizeof err) != 0) {
        printf("error: %s\n", err);
        return 2;
    }
    FILE *f = fopen(argv[0], "rb");
    if (!f) {
        printf("error: cannot open %s\n", argv[0]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < 16) {
        fclose(f);
        printf("error: %s is too small to fuzz\n", argv[0]);
        return 2;
    }
    unsigned char *orig = malloc((size_t)size), *buf = malloc((size_t)size);
    if (!orig || !buf || fread(orig, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        printf("error: cannot read %s\n", argv[0]);
        return 2;
    }
    fclose(f);
    // An in-memory file reopened by path: thousands of rewrites of a file on
    // disk cost seconds (truncation frees blocks), and the loader only needs
    // a path. Beside the input when memfd is unavailable.
    char path[4096];
    int fd = memfd_create("asan_fuzz", MFD_CLOEXEC);
    int on_disk = fd < 0;
    if (on_disk) {
        snprintf(path, sizeof path, "%s.fuzz-XXXXXX", argv[0]);
        fd = mkstemp(path);
    } else {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (fd < 0) {
        printf("error: cannot create a scratch file\n");
        return 2;
    }

    uint64_t st = (uint64_t)seed;
    long loaded = 0, rejected = 0;
    for (long long it = 0; it < iters; it++) {
        size_t n = (size_t)size;
        memcpy(buf, orig, n);
        ls_model_desc desc = orig_desc;
        int muts = 1 + (int)(rng_next(&st) % 3);
        for (int k = 0; k < muts; k++) {
            uint64_t r = rng_next(&st);
            if (r % 8 == 0) { // cut the file
                n = (size_t)(rng_next(&st) % n);
            } else if (r % 8 == 1) { // a non-finite fp16 value somewhere
                size_t at = (size_t)(rng_next(&st) % (n / 2)) * 2;
                buf[at] = 0x00;
                buf[at + 1] = rng_next(&st) % 2 ? 0x7c : 0xfe;
            } else {
                mutate_desc(&desc, &st);
            }
        }
        if (ftruncate(fd, (off_t)n) != 0 || pwrite(fd, buf, n, 0) != (ssize_t)n) {
            printf("error: cannot write %s\n", path);
            rc = 2;
            break;
        }
        err[0] = 'x';
        ls_model *m = ls_model_load(path, &desc, 1, LS_SIMD_PORTABLE, err, sizeof err);
        if (m) {
            loaded++;
            ls_model_free(m);
        } else {
            if (err[0] == '\0' || err[0] == 'x') {
                printf("error: load failed without a message (iteration %lld)\n", it);
                rc = 2;
                break;
            }
            if (verbose) printf("%s\n", err);
            rejected++;
        }
    }
    close(fd);
    if (on_disk) unlink(path);
    free(orig);
    free(buf);
    if (rc == 0) printf("ok %ld loaded %ld rejected\n", loaded, rejected);
    return rc;
}
