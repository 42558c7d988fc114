/*
 * bufpool_driver.c — the session buffer pool (kernels/cpu/bufpool.c) under
 * AddressSanitizer + UndefinedBehaviorSanitizer (test/kernels/bufpool_asan.test.ts).
 *
 *   bufpool_driver check           every rule below; exit 0 with one "ok" line each
 *   bufpool_driver overflow BYTES  writes the byte just past a fresh BYTES-byte
 *                                  buffer: ASan must report it
 *   bufpool_driver reused BYTES    the same past a held buffer reused for BYTES
 *
 * Both kinds of buffer are covered: calloc's (under 2 MB) and those mapped
 * on their own into huge pages (2 MB and more, a session's K/V cache).
 * Exit 4 when a rule is broken.
 */
#include <sanitizer/asan_interface.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/bufpool.h"

#define MB ((size_t)1 << 20)

static int failed;
#define CHECK(cond, ...)                                                                                    \
    do {                                                                                                    \
        if (!(cond)) {                                                                                      \
            printf("fail: " __VA_ARGS__);                                                                   \
            printf("\n");                                                                                   \
            failed = 1;                                                                                     \
        }                                                                                                   \
    } while (0)

static int all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* A fresh buffer of `bytes`, dirtied and given back, then asked for again
 * as `again` bytes: the held one comes back zeroed, with the bytes past
 * `again` poisoned; a request under half its size gets another buffer. */
static void check_size(size_t bytes, size_t again) {
    ls_bufpool bp = {0};
    unsigned char *p = ls_bufpool_alloc0(&bp, bytes);
    CHECK(p != NULL, "%zu bytes: no buffer", bytes);
    if (!p) return;
    CHECK(all_zero(p, bytes), "%zu bytes: a fresh buffer is not zeroed", bytes);
    CHECK(!__asan_address_is_poisoned(p + bytes - 1), "%zu bytes: the last byte is poisoned", bytes);
    CHECK(__asan_address_is_poisoned(p + bytes), "%zu bytes: the byte past the end is addressable", bytes);
    memset(p, 0xA5, bytes);
    ls_bufpool_free(&bp, p);
    CHECK(bp.n == 1, "%zu bytes: the freed buffer is not held", bytes);
    CHECK(__asan_address_is_poisoned(p), "%zu bytes: a held buffer is addressable", bytes);
    unsigned char *q = ls_bufpool_alloc0(&bp, again);
    CHECK(q == p, "%zu bytes: a request for %zu did not reuse the held buffer", bytes, again);
    CHECK(all_zero(q, again), "%zu bytes: the reused buffer is not zeroed", bytes);
    CHECK(__asan_address_is_poisoned(q + again), "%zu bytes: past the %zu reused bytes is addressable", bytes, again);
    unsigned char *r = ls_bufpool_alloc0(&bp, bytes / 2 - 1);
    CHECK(r != NULL && r != q, "%zu bytes: a request under half its size took the buffer in use", bytes);
    ls_bufpool_free(&bp, q);
    ls_bufpool_free(&bp, r);
    ls_bufpool_drain(&bp);
    CHECK(bp.n == 0 && bp.bytes == 0, "%zu bytes: drain left buffers held", bytes);
    printf("ok %zu\n", bytes);
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "check") == 0) {
        check_size(256 << 10, 200 << 10); /* calloc's */
        check_size(2 * MB - 64, 2 * MB - 4096); /* the smallest mapped one */
        check_size(3 * MB + 100, 2 * MB + 3); /* whole huge pages and a tail of 4 KB ones */
        // More held than the pool keeps: the extra buffers go straight back.
        ls_bufpool bp = {0};
        void *held[40];
        for (int i = 0; i < 40; i++) held[i] = ls_bufpool_alloc0(&bp, 3 * MB);
        for (int i = 0; i < 40; i++) ls_bufpool_free(&bp, held[i]);
        CHECK(bp.bytes <= LS_BUFPOOL_MAX_BYTES && bp.n == (int32_t)(LS_BUFPOOL_MAX_BYTES / (3 * MB)),
              "the pool holds %d buffers, %zu bytes", bp.n, bp.bytes);
        ls_bufpool_drain(&bp);
        printf("ok limits\n");
        return failed ? 4 : 0;
    }
    if (argc == 3 && (strcmp(argv[1], "overflow") == 0 || strcmp(argv[1], "reused") == 0)) {
        size_t bytes = strtoull(argv[2], NULL, 10);
        ls_bufpool bp = {0};
        volatile unsigned char *p = ls_bufpool_alloc0(&bp, strcmp(argv[1], "reused") == 0 ? bytes + 1000 : bytes);
        if (strcmp(argv[1], "reused") == 0) {
            ls_bufpool_free(&bp, (void *)p);
            p = ls_bufpool_alloc0(&bp, bytes);
        }
        if (!p) return 2;
        p[bytes] = 1; /* ASan stops here */
        printf("wrote past the end unreported\n");
        return 4;
    }
    fprintf(stderr, "usage: bufpool_driver check | overflow BYTES | reused BYTES\n");
    return 2;
}
