/*
 * bufpool.c — freed session buffers kept for the runtime's next sessions.
 *
 * A session's K/V cache and chunk scratch are hundreds of KB to MBs. Fresh
 * from the allocator they are fresh pages, and the first touch of each is
 * a page fault, slow on virtual machines (docs/kernels.md#tuning-figures).
 * A buffer given back here keeps its pages mapped; the next
 * allocation of a similar size takes it, zeroed as calloc would be.
 *
 * Buffers of 2 MB and more (a session's K/V cache) are mapped on their
 * own and advised into transparent huge pages. Attention reads each head's
 * keys as one short run per dimension row, across megabytes: on 4 KB
 * pages a long context missed the TLB every few runs.
 * A huge page's first touch is also one fault instead of 512.
 *
 * Each buffer carries a header with its capacity. Held buffers are
 * poisoned for AddressSanitizer, and so is the part of a reused one past
 * the bytes asked for, or of a mapped one's last page, so neither hides an
 * overflow. A lock guards the pool: a session may be made or freed on the
 * caller's thread while a begun step (pipeline.c) grows other sessions'
 * caches on the model's.
 */
#define _DEFAULT_SOURCE /* mmap, madvise under -std=c11 */
#include "bufpool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

#define HUGE_PAGE ((size_t)2 << 20)
#define PAGE ((size_t)4 << 10)

static size_t capacity_of(const void *block) { return *(const size_t *)block; }
static void *data_of(void *block) { return (char *)block + HEADER; }

/* Whether a block of this capacity is mapped on its own (else calloc's). */
static int mapped(size_t cap) { return cap >= HUGE_PAGE - HEADER; }
/* Bytes a mapping keeps past its buffer at least, poisoned for
 * AddressSanitizer like calloc's redzone, so a write past the end is
 * reported rather than landing in whatever is mapped next. */
#define TAIL 64

static size_t mapped_bytes(size_t cap) { return (HEADER + cap + TAIL + PAGE - 1) & ~(PAGE - 1); }

/* A zeroed mapping of `len` bytes (a multiple of PAGE) that starts on a
 * huge-page boundary, advised into huge pages: the kernel backs each
 * whole 2 MB inside it with one, the last part with 4 KB pages. */
static void *map_huge(size_t len) {
    char *p = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *start = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (start > p) munmap(p, (size_t)(start - p));
    munmap(start + len, (size_t)(p + HUGE_PAGE - start));
    madvise(start, len, MADV_HUGEPAGE); /* advice only: failure changes nothing */
    return start;
}

static void release_block(void *block) {
    size_t cap = capacity_of(block);
    if (!mapped(cap)) {
        free(block);
        return;
    }
    UNPOISON(block, mapped_bytes(cap)); /* the range may be mapped again, by anyone */
    munmap(block, mapped_bytes(cap));
}

bool ls_bufpool_init(ls_bufpool *bp) {
    bp->n = 0;
    bp->bytes = 0;
    return pthread_mutex_init(&bp->mu, NULL) == 0;
}

void *ls_bufpool_alloc0(ls_bufpool *bp, size_t bytes) {
    if (bytes == 0 || bytes > SIZE_MAX / 2) return NULL; /* none that large exists; the sums below cannot wrap */
    pthread_mutex_lock(&bp->mu);
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
        pthread_mutex_unlock(&bp->mu);
        UNPOISON(data_of(block), bytes);
        memset(data_of(block), 0, bytes);
        return data_of(block);
    }
    pthread_mutex_unlock(&bp->mu);
    void *block = mapped(bytes) ? map_huge(mapped_bytes(bytes)) : calloc(1, HEADER + bytes);
    if (!block) return NULL;
    *(size_t *)block = bytes;
    if (mapped(bytes)) POISON((char *)data_of(block) + bytes, mapped_bytes(bytes) - HEADER - bytes);
    return data_of(block);
}

void ls_bufpool_free(ls_bufpool *bp, void *p) {
    if (!p) return;
    void *block = (char *)p - HEADER;
    size_t cap = capacity_of(block);
    pthread_mutex_lock(&bp->mu);
    int held = cap >= LS_BUFPOOL_MIN_BYTES && bp->n < LS_BUFPOOL_SLOTS && cap <= LS_BUFPOOL_MAX_BYTES - bp->bytes;
    if (held) {
        POISON(p, cap);
        bp->block[bp->n++] = block;
        bp->bytes += cap;
    }
    pthread_mutex_unlock(&bp->mu);
    if (!held) release_block(block);
}

void ls_bufpool_drain(ls_bufpool *bp) {
    for (int32_t i = 0; i < bp->n; i++) release_block(bp->block[i]);
    bp->n = 0;
    bp->bytes = 0;
    pthread_mutex_destroy(&bp->mu);
}
