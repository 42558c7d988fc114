/*
 * bufpool.h — a runtime's store of freed session buffers (bufpool.c).
 * Not ABI.
 */
#ifndef LS_BUFPOOL_H
#define LS_BUFPOOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LS_BUFPOOL_SLOTS 64              /* buffers held at most */
#define LS_BUFPOOL_MAX_BYTES (64u << 20) /* bytes held at most */
#define LS_BUFPOOL_MIN_BYTES (64u << 10) /* smaller buffers go straight back to the allocator */

typedef struct {
    pthread_mutex_t mu; /* sessions are made and freed while a begun step (pipeline.c) grows caches */
    void *block[LS_BUFPOOL_SLOTS]; /* each starts with its header (bufpool.c) */
    int32_t n;
    size_t bytes; /* capacity of the held blocks */
} ls_bufpool;

/* An empty pool; false when its lock cannot be made. */
bool ls_bufpool_init(ls_bufpool *bp);

/* `bytes` zeroed bytes (NULL when bytes is 0 or memory is short): a held
 * buffer of at least that size, at most twice it, else a fresh one. */
void *ls_bufpool_alloc0(ls_bufpool *bp, size_t bytes);

/* Gives p (from ls_bufpool_alloc0 of this pool, or NULL) back: held for the
 * next allocation while there is room, else freed. */
void ls_bufpool_free(ls_bufpool *bp, void *p);

/* Frees every held buffer, and the lock: the runtime's end. */
void ls_bufpool_drain(ls_bufpool *bp);

#endif
