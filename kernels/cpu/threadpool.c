/*
 * threadpool.c — persistent pthreads pool (see threadpool.h).
 *
 * Ownership. A job's tasks are dealt out in contiguous ranges, one per
 * thread (thread t owns [t n / N, (t + 1) n / N)). A thread runs its own
 * range from the front, then steals from the back of the others' ranges
 * until none is left. In a balanced job every thread therefore works on
 * the same rows of the same matrices on every call, which stay in that
 * core's caches, and a claim is a compare-and-swap on the thread's own
 * cache line instead of one shared line that every claim moved between
 * the cores (docs/kernels.md#tuning-figures).
 *
 * Protocol. Each thread's range is one word, gen << 32 | lo << 16 | hi:
 * the owner claims (gen, lo, hi) -> (gen, lo + 1, hi), a thief (gen, lo,
 * hi) -> (gen, lo, hi - 1). The caller writes the job into one of two
 * slots (gen & 1) and every range word, then publishes gen in `gen`.
 * Because the generation is part of every range word, a late worker that
 * still holds an old generation can never claim a task of the next job,
 * so the caller never waits for sleeping workers to wake up: it waits only
 * until every task of the job has finished (`done` == n). A successful
 * claim also proves that the slot fields read before it belong to the
 * claimed generation: they were written before the range word it read,
 * and the caller writes the next job's only after every task of this one
 * (the task just claimed among them) is done. So one slot would be
 * correct too; two keep the next job's writes off the line whose `done`
 * the workers have just added to.
 * Jobs of more than POOL_MAX_TASKS tasks run as consecutive jobs.
 *
 * Sleeping. A worker spins for LS_POOL_SPIN_NS after its last job, then
 * registers in `sleepers` and waits on a condvar. The caller broadcasts only
 * when `sleepers` is non-zero: seq_cst on both sides (worker: sleepers++
 * then re-read gen; caller: store gen then read sleepers) guarantees that
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
#define POOL_MAX_TASKS 0xffff  /* a range word's 16-bit bounds */

typedef struct {
    _Atomic(ls_pool_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int32_t base; /* task index of the job's first task (jobs split at POOL_MAX_TASKS) */
    _Atomic int32_t done;
} pool_slot;

/* One thread's range of the current job, alone on its cache line. */
typedef struct {
    _Alignas(64) _Atomic uint64_t w; /* gen << 32 | lo << 16 | hi */
} pool_range;

typedef struct {
    ls_pool *pool;
    int32_t id;
} worker_arg;

struct ls_pool {
    int32_t n_threads;
    pthread_t *threads;
    worker_arg *args;
    pool_range *range; /* (n_threads) */
    _Atomic uint32_t gen; /* the published job's generation */
    pool_slot slot[2];
    _Atomic int32_t sleepers;
    _Atomic int32_t stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t next_gen; /* caller-side: the generation of the next job */
};

static inline uint64_t range_word(uint32_t gen, uint32_t lo, uint32_t hi) {
    return (uint64_t)gen << 32 | (uint64_t)lo << 16 | hi;
}

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

/* Claims one task of generation `gen` from range r: from the front when
 * `own`, else from the back. Returns the task's index in the job, or -1
 * when r holds none (its range is empty or belongs to another generation).
 * *fn and *ctx are the job's, valid when a task is returned. */
static int32_t claim(ls_pool *p, pool_range *r, uint32_t gen, int own, ls_pool_fn *fn, void **ctx) {
    const pool_slot *s = &p->slot[gen & 1];
    uint64_t w = atomic_load_explicit(&r->w, memory_order_acquire);
    for (;;) {
        uint32_t lo = (uint32_t)(w >> 16) & 0xffff, hi = (uint32_t)w & 0xffff;
        if ((uint32_t)(w >> 32) != gen || lo >= hi) return -1;
        *fn = atomic_load_explicit(&s->fn, memory_order_acquire);
        *ctx = atomic_load_explicit(&s->ctx, memory_order_acquire);
        uint64_t next = own ? range_word(gen, lo + 1, hi) : range_word(gen, lo, hi - 1);
        if (atomic_compare_exchange_weak_explicit(&r->w, &w, next, memory_order_acq_rel, memory_order_acquire))
            return (int32_t)(own ? lo : hi - 1);
    }
}

/* The other thread's range with the most tasks of generation `gen` left,
 * or NULL when none has any. */
static pool_range *victim(ls_pool *p, uint32_t gen, int32_t thread) {
    pool_range *best = NULL;
    uint32_t most = 0;
    for (int32_t v = 0; v < p->n_threads; v++) {
        if (v == thread) continue;
        uint64_t w = atomic_load_explicit(&p->range[v].w, memory_order_relaxed);
        uint32_t lo = (uint32_t)(w >> 16) & 0xffff, hi = (uint32_t)w & 0xffff;
        if ((uint32_t)(w >> 32) == gen && hi > lo && hi - lo > most) {
            most = hi - lo;
            best = &p->range[v];
        }
    }
    return best;
}

/* Runs this thread's tasks of generation `gen`, then the others' left
 * over. `done` is added once, at the end: the caller cannot publish a
 * newer generation before every task is counted, so none is lost. */
static void run_tasks(ls_pool *p, uint32_t gen, int32_t thread) {
    pool_slot *s = &p->slot[gen & 1];
    int32_t ran = 0, base = -1, task;
    ls_pool_fn fn;
    void *ctx;
    while ((task = claim(p, &p->range[thread], gen, 1, &fn, &ctx)) >= 0) {
        if (base < 0) base = atomic_load_explicit(&s->base, memory_order_acquire);
        fn(ctx, base + task, thread);
        ran++;
    }
    for (pool_range *v; (v = victim(p, gen, thread));) {
        if ((task = claim(p, v, gen, 0, &fn, &ctx)) < 0) continue;
        if (base < 0) base = atomic_load_explicit(&s->base, memory_order_acquire);
        fn(ctx, base + task, thread);
        ran++;
    }
    if (ran) atomic_fetch_add_explicit(&s->done, ran, memory_order_release);
}

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    ls_pool *p = arg->pool;
    uint32_t seen = 0;
    for (;;) {
        /* wait for a generation other than `seen`: spin, then block */
        uint32_t gen = atomic_load(&p->gen);
        if (gen == seen && !atomic_load(&p->stop)) {
            int64_t t0 = now_ns();
            for (uint32_t k = 1;; k++) {
                cpu_relax();
                gen = atomic_load_explicit(&p->gen, memory_order_acquire);
                if (gen != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) break;
                if ((k & 63) == 0 && now_ns() - t0 > LS_POOL_SPIN_NS) break;
            }
        }
        if (gen == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((gen = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
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
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    for (int i = 0; i < 2; i++) {
        atomic_init(&p->slot[i].fn, NULL);
        atomic_init(&p->slot[i].ctx, NULL);
        atomic_init(&p->slot[i].base, 0);
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
    p->range = aligned_alloc(_Alignof(pool_range), (size_t)n_threads * sizeof *p->range);
    if (p->range)
        for (int32_t i = 0; i < n_threads; i++) atomic_init(&p->range[i].w, 0);
    if (!p->threads || !p->args || !p->range) {
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
    free(p->range);
    free(p);
}

int32_t ls_pool_threads(const ls_pool *p) { return p ? p->n_threads : 1; }

/* One job of at most POOL_MAX_TASKS tasks, base.. base + n - 1. */
static void run_job(ls_pool *p, ls_pool_fn fn, void *ctx, int32_t base, int32_t n) {
    uint32_t gen = p->next_gen + 1;
    if (gen == 0) gen = 1; /* 0 means "no job yet" to a fresh worker */
    p->next_gen = gen;
    pool_slot *s = &p->slot[gen & 1];
    atomic_store_explicit(&s->fn, fn, memory_order_release);
    atomic_store_explicit(&s->ctx, ctx, memory_order_release);
    atomic_store_explicit(&s->base, base, memory_order_release);
    atomic_store_explicit(&s->done, 0, memory_order_release);
    int64_t nt = p->n_threads;
    for (int64_t t = 0; t < nt; t++)
        atomic_store_explicit(&p->range[t].w, range_word(gen, (uint32_t)(t * n / nt), (uint32_t)((t + 1) * n / nt)),
                              memory_order_release);
    atomic_store(&p->gen, gen); /* seq_cst: pairs with sleepers */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_tasks(p, gen, 0);
    for (uint32_t k = 1; atomic_load_explicit(&s->done, memory_order_acquire) < n; k++) {
        cpu_relax();
        if ((k & 1023) == 0) sched_yield(); /* a worker was descheduled mid-task */
    }
}

void ls_pool_run(ls_pool *p, ls_pool_fn fn, void *ctx, int32_t n_tasks) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int32_t i = 0; i < n_tasks; i++) fn(ctx, i, 0);
        return;
    }
    for (int32_t base = 0; base < n_tasks; base += POOL_MAX_TASKS)
        run_job(p, fn, ctx, base, n_tasks - base < POOL_MAX_TASKS ? n_tasks - base : POOL_MAX_TASKS);
}
