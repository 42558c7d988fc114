/*
 * threadpool.h — the library's one persistent thread pool.
 *
 * Created once per model (ls_runtime_init) and reused for every call: no
 * thread is created per token. The calling thread is worker 0 and runs
 * tasks too. Idle workers spin briefly (a decode step issues ~40 jobs a few
 * microseconds apart) and then block on a condition variable, so cores are
 * not burned between requests.
 *
 * A job's tasks are dealt out in contiguous ranges, thread t's range the
 * same on every call of the same size (task t when there are as many tasks
 * as threads); a thread that finishes its own range takes tasks from the
 * back of the others'. Callers must make each task's result independent
 * of which thread runs it (every kernel here splits work across output
 * rows, never across a reduction, so this holds).
 */
#ifndef LS_THREADPOOL_H
#define LS_THREADPOOL_H

#include <stdint.h>

typedef struct ls_pool ls_pool;

/* fn(ctx, task, thread): task in [0, n_tasks), thread in [0, n_threads)
 * (0 is the caller); use `thread` only to pick per-thread scratch. */
typedef void (*ls_pool_fn)(void *ctx, int32_t task, int32_t thread);

/* n_threads <= 0: all online cores. Returns NULL on failure. */
ls_pool *ls_pool_new(int32_t n_threads);
void ls_pool_free(ls_pool *p);
int32_t ls_pool_threads(const ls_pool *p);

/* Runs fn for every task and returns when all have finished; with p NULL,
 * in turn on the calling thread. Not reentrant: call from one thread at a
 * time (the library's single caller). */
void ls_pool_run(ls_pool *p, ls_pool_fn fn, void *ctx, int32_t n_tasks);

#endif
