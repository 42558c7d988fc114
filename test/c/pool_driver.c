/*
 * pool_driver.c — the thread pool (kernels/cpu/threadpool.c) under
 * ThreadSanitizer. Prints "ok <check>" per passed check and "fail: ..." on
 * the first broken one (exit code 1).
 *
 *   every   each task of jobs of 1 to 70001 tasks (past the 65535 a job
 *           word holds) runs exactly once, with uneven task times, at 1
 *           to 8 threads, and the `thread` argument is in range
 *   burst   100000 back-to-back jobs of 2 or 3 tasks: none lost or run
 *           twice across generations
 *   steal   a job whose first range stalls until another thread has run
 *           one of its tasks: finishes only if the others steal from it
 *   sleep   jobs after the workers have gone to sleep still run every task
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/threadpool.h"

#define MAX_TASKS 70001

typedef struct {
    _Atomic int32_t runs[MAX_TASKS];
    _Atomic int32_t bad_thread;
    int32_t n_threads;
    int32_t stall_owner_range; /* steal check: tasks [0, this) are thread 0's */
    _Atomic int32_t stolen;    /* a task of that range ran on another thread */
} job_state;

static int failed;

static void fail(const char *what, long a, long b) {
    printf("fail: %s (%ld, %ld)\n", what, a, b);
    failed = 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void count_task(void *ctx, int32_t task, int32_t thread) {
    job_state *j = ctx;
    if (thread < 0 || thread >= j->n_threads) atomic_store(&j->bad_thread, 1);
    /* uneven task times, so ranges finish at different moments */
    volatile uint32_t x = (uint32_t)task * 2654435761u;
    for (uint32_t k = 0; k < (x >> 26); k++) x = x * 1664525u + 1013904223u;
    atomic_fetch_add_explicit(&j->runs[task], 1, memory_order_relaxed);
}

static int check_runs(job_state *j, int32_t n, const char *what) {
    for (int32_t t = 0; t < n; t++)
        if (atomic_load(&j->runs[t]) != 1) {
            fail(what, t, atomic_load(&j->runs[t]));
            return 0;
        }
    if (atomic_load(&j->bad_thread)) {
        fail("thread index out of range", n, j->n_threads);
        return 0;
    }
    return 1;
}

static void reset(job_state *j, int32_t n, int32_t n_threads) {
    for (int32_t t = 0; t < n; t++) atomic_store(&j->runs[t], 0);
    atomic_store(&j->bad_thread, 0);
    atomic_store(&j->stolen, 0);
    j->n_threads = n_threads;
}

static void check_every(job_state *j) {
    const int32_t threads[] = {1, 2, 3, 4, 8};
    const int32_t sizes[] = {1, 2, 3, 5, 17, 64, 1000, 65535, 65536, MAX_TASKS};
    for (size_t a = 0; a < sizeof threads / sizeof threads[0]; a++) {
        ls_pool *p = ls_pool_new(threads[a]);
        if (!p || ls_pool_threads(p) != threads[a]) {
            fail("pool size", threads[a], p ? ls_pool_threads(p) : -1);
            return;
        }
        for (size_t b = 0; b < sizeof sizes / sizeof sizes[0]; b++) {
            reset(j, sizes[b], threads[a]);
            ls_pool_run(p, count_task, j, sizes[b]);
            if (!check_runs(j, sizes[b], "every: task runs")) return;
        }
        ls_pool_free(p);
    }
    printf("ok every\n");
}

static void check_burst(job_state *j) {
    ls_pool *p = ls_pool_new(3);
    reset(j, 3, 3);
    for (int32_t r = 0; r < 100000; r++) ls_pool_run(p, count_task, j, 2 + (r & 1));
    /* tasks 0 and 1 ran in every job, task 2 in every other one */
    if (atomic_load(&j->runs[0]) != 100000 || atomic_load(&j->runs[1]) != 100000 ||
        atomic_load(&j->runs[2]) != 50000)
        fail("burst: task runs", atomic_load(&j->runs[0]), atomic_load(&j->runs[2]));
    else printf("ok burst\n");
    ls_pool_free(p);
}

static void stall_task(void *ctx, int32_t task, int32_t thread) {
    job_state *j = ctx;
    if (task < j->stall_owner_range && thread != 0) atomic_store(&j->stolen, 1);
    /* thread 0's first task waits until another thread has stolen from its range */
    if (task == 0)
        for (double t0 = now_s(); !atomic_load(&j->stolen) && now_s() - t0 < 20;) {
        }
    atomic_fetch_add_explicit(&j->runs[task], 1, memory_order_relaxed);
}

static void check_steal(job_state *j) {
    ls_pool *p = ls_pool_new(2);
    const int32_t n = 64;
    reset(j, n, 2);
    j->stall_owner_range = n / 2; /* two threads: thread 0 owns [0, 32) */
    ls_pool_run(p, stall_task, j, n);
    if (!atomic_load(&j->stolen)) fail("steal: no task of a stalled range ran elsewhere", 0, 0);
    else if (check_runs(j, n, "steal: task runs")) printf("ok steal\n");
    ls_pool_free(p);
}

static void check_sleep(job_state *j) {
    ls_pool *p = ls_pool_new(4);
    for (int32_t r = 0; r < 3; r++) {
        struct timespec pause = {0, 20 * 1000 * 1000}; /* past the workers' 0.2 ms spin */
        nanosleep(&pause, NULL);
        reset(j, 257, 4);
        ls_pool_run(p, count_task, j, 257);
        if (!check_runs(j, 257, "sleep: task runs")) break;
    }
    if (!failed) printf("ok sleep\n");
    ls_pool_free(p);
}

int main(void) {
    job_state *j = calloc(1, sizeof *j);
    if (!j) return 2;
    check_every(j);
    if (!failed) check_burst(j);
    if (!failed) check_steal(j);
    if (!failed) check_sleep(j);
    free(j);
    return failed;
}
