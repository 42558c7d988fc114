/*
 * threadpool.c — persistent pthreads pool (see threadpool.h).
 *
 * Protocol. A job is published by storing `work` = (gen << 32 | 0); tasks are
 * claimed in runs by CAS on that same word, (gen, i) -> (gen, i + take)
 * (run_tasks). Because the
 * generation is part of the word, a late worker that still holds an old
 * generation can never claim a task of the next job, so the caller never
 * waits for sleeping workers to wake up: it waits only until every task of
 * the job has finished (`done` == n_tasks). The job description lives in one
 * of two slots (gen & 1) so the next job can be written while a straggler is
 * still reading the previous slot; its CAS then fails and it reads again.
 *
 * Sleeping. A worker spins for LS_POOL_SPIN_NS after its last job, then
 * registers in `sleepers` and waits on a condvar. The caller broadcasts only
 * when `sleepers` is non-zero: seq_cst on both sides (worker: sleepers++
 * then re-read work; caller: store work then read sleepers) guarantees that
 * one of them sees the other.
 */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define LS_POOL_MAX_THREADS 256
#define LS_POOL_SPIN_NS 200000 /* 0.2 ms: covers the gaps inside a step */

typedef struct {
    _Atomic(ls_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int32_t n_tasks;
    _Atomic int32_t done;
} pool_slot;

typedef struct {
    ls_pool *pool;
    int32_t id;
} worker_arg;

struct ls_pool {
    int32_t n_threads;
    pthread_t *threads;
    worker_arg *args;
    _Atomic uint64_t work; /* gen << 32 | next task index */
    pool_slot slot[2];
    _Atomic int32_t sleepers;
    _Atomic int32_t stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t gen; /* caller-side copy of the current generation */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Claims and runs tasks of generation `gen` until none is left or a newer
 * generation has been published. Tasks are claimed in runs (guided
 * scheduling): a claim takes 1/(2 n_threads) of what is left, at least one,
 * so a job of many small tasks costs a few claims per thread rather than
 * one each (a claim moves the `work` line between cores: ~0.3 us on a
 * 2-vCPU VM), while the shrinking runs still even out the load. `done` is
 * added once, when the thread finds nothing left: the caller cannot publish
 * a newer generation before every task is counted, so none is lost. */
static void run_tasks(ls_pool *p, uint32_t gen, int32_t thread) {
    pool_slot *s = &p->slot[gen & 1];
    int32_t ran = 0;
    for (;;) {
        uint64_t w = atomic_load_explicit(&p->work, memory_order_acquire);
        if ((uint32_t)(w >> 32) != gen) break;
        ls_pool_fn fn = atomic_load_explicit(&s->fn, memory_order_acquire);
        void *ctx = atomic_load_explicit(&s->ctx, memory_order_acquire);
        int32_t n = atomic_load_explicit(&s->n_tasks, memory_order_acquire);
        uint32_t i = (uint32_t)w;
        if ((int64_t)i >= n) break;
        uint32_t take = ((uint32_t)n - i) / (2 * (uint32_t)p->n_threads);
        if (take == 0) take = 1;
        /* Success proves `work` still held this generation, so the fields
         * read above belong to it (the next write to this slot happens only
         * after a newer generation is published). */
        if (!atomic_compare_exchange_weak_explicit(&p->work, &w, w + take, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        for (uint32_t k = 0; k < take; k++) fn(ctx, (int32_t)(i + k), thread);
        ran += (int32_t)take;
    }
    if (ran) atomic_fetch_add_explicit(&s->done, ran, memory_order_release);
}

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    ls_pool *p = arg->pool;
    uint32_t seen = 0;
    for (;;) {
        /* wait for a generation other than `seen`: spin, then block */
        uint32_t gen = (uint32_t)(atomic_load(&p->work) >> 32);
        if (gen == seen && !atomic_load(&p->stop)) {
            int64_t t0 = now_ns();
            for (uint32_t k = 1;; k++) {
                cpu_relax();
                gen = (uint32_t)(atomic_load_explicit(&p->work, memory_order_acquire) >> 32);
                if (gen != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
                if ((k & 63) == 0 && now_ns() - t0 > LS_POOL_SPIN_NS) break;
            }
        }
        if (gen == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((gen = (uint32_t)(atomic_load(&p->work) >> 32)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = gen;
        run_tasks(p, gen, arg->id);
    }
    return NULL;
}

static int32_t online_cores(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int32_t)n : 1;
}

ls_pool *ls_pool_new(int32_t n_threads) {
    if (n_threads <= 0) n_threads = online_cores();
    if (n_threads > LS_POOL_MAX_THREADS) n_threads = LS_POOL_MAX_THREADS;
    ls_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
    atomic_init(&p->work, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    for (int i = 0; i < 2; i++) {
        atomic_init(&p->slot[i].fn, NULL);
        atomic_init(&p->slot[i].ctx, NULL);
        atomic_init(&p->slot[i].n_tasks, 0);
        atomic_init(&p->slot[i].done, 0);
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return NULL;
    }
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->args = calloc((size_t)n_threads, sizeof *p->args);
    if (!p->threads || !p->args) {
        p->n_threads = 1;
        ls_pool_free(p);
        return NULL;
    }
    for (int32_t i = 1; i < n_threads; i++) {
        p->args[i].pool = p;
        p->args[i].id = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
            p->n_threads = i; /* join the ones that started */
            ls_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void ls_pool_free(ls_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p->args);
    free(p);
}

int32_t ls_pool_threads(const ls_pool *p) { return p ? p->n_threads : 1; }

void ls_pool_run(ls_pool *p, ls_pool_fn fn, void *ctx, int32_t n_tasks) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int32_t i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    uint32_t gen = p->gen + 1;
    if (gen == 0) gen = 1; /* 0 means "no job yet" to a fresh worker */
    p->gen = gen;
    pool_slot *s = &p->slot[gen & 1];
    atomic_store_explicit(&s->fn, fn, memory_order_release);
    atomic_store_explicit(&s->ctx, ctx, memory_order_release);
    atomic_store_explicit(&s->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&s->done, 0, memory_order_release);
    atomic_store(&p->work, (uint64_t)gen << 32); /* seq_cst: pairs with sleepers */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p, gen, 0);
    for (uint32_t k = 1; atomic_load_explicit(&s->done, memory_order_acquire) < n_tasks; k++) {
        cpu_relax();
        if ((k & 1023) == 0) sched_yield(); /* a worker was descheduled mid-task */
    }
}
