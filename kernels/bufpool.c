/*
 * bufpool.c — freed session buffers kept for the runtime's next sessions.
 *
 * A session's K/V cache and chunk scratch are hundreds of KB to MBs. Fresh
 * from the allocator they are fresh pages, and the first touch of each is
 * a page fault: on virtual machines 1-4 us a page, which made a new
 * session's 128-token prefill twice as slow as the same prefill in a
 * reused one. A buffer given back here keeps its pages mapped; the next
 * allocation of a similar size takes it, zeroed as calloc would be.
 *
 * Each buffer carries a header with its capacity. Held buffers are
 * poisoned for AddressSanitizer, and so is the part of a reused one past
 * the bytes asked for, so reuse hides no overflow. Not thread-safe: the
 * ABI calls every function from one thread (loopserve.h).
 */
#include "bufpool.h"

#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Header before the bytes handed out: 64 bytes keep them as aligned as
 * calloc's (16) and off the header's cache line. */
#define HEADER 64

static size_t capacity_of(const void *block) { return *(const size_t *)block; }
static void *data_of(void *block) { return (char *)block + HEADER; }

void *ls_bufpool_alloc0(ls_bufpool *bp, size_t bytes) {
    if (bytes == 0 || bytes > SIZE_MAX - HEADER) return NULL;
    int32_t best = -1;
    if (bytes >= LS_BUFPOOL_MIN_BYTES)
        for (int32_t i = 0; i < bp->n; i++) {
            size_t cap = capacity_of(bp->block[i]);
            if (cap >= bytes && cap / 2 <= bytes && (best < 0 || cap < capacity_of(bp->block[best]))) best = i;
        }
    if (best >= 0) {
        void *block = bp->block[best];
        bp->block[best] = bp->block[--bp->n];
        bp->bytes -= capacity_of(block);
        UNPOISON(data_of(block), bytes);
        memset(data_of(block), 0, bytes);
        return data_of(block);
    }
    void *block = calloc(1, HEADER + bytes);
    if (!block) return NULL;
    *(size_t *)block = bytes;
    return data_of(block);
}

void ls_bufpool_free(ls_bufpool *bp, void *p) {
    if (!p) return;
    void *block = (char *)p - HEADER;
    size_t cap = capacity_of(block);
    if (cap < LS_BUFPOOL_MIN_BYTES || bp->n == LS_BUFPOOL_SLOTS || cap > LS_BUFPOOL_MAX_BYTES - bp->bytes) {
        free(block);
        return;
    }
    POISON(p, cap);
    bp->block[bp->n++] = block;
    bp->bytes += cap;
}

void ls_bufpool_drain(ls_bufpool *bp) {
    for (int32_t i = 0; i < bp->n; i++) free(bp->block[i]);
    bp->n = 0;
    bp->bytes = 0;
}
