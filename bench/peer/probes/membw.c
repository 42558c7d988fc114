// membw: read bandwidth of a working set, for bench/peer.ts's roofline.
// Built at bench time: gcc -O3 -march=native -pthread membw.c -o membw
//
// usage: membw BYTES THREADS SECONDS
// Allocates BYTES, splits it into THREADS contiguous parts (as a matmul
// split across output rows splits a weight matrix), and has each thread sum
// its part with wide loads, pass after pass, for about SECONDS. Prints one
// JSON line: the best pass's bandwidth (a working set larger than the last
// level cache gives DRAM bandwidth; one that fits gives that cache level's).
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    const uint8_t *p;
    size_t n;
    uint64_t sink;
    pthread_barrier_t *start, *end;
    int passes;
    double t_start, t_end; // this pass, taken by the worker itself
} job_t;

/* The widest load this build has: 512-bit, 256-bit, or one 64-bit word. */
#if defined(__AVX512F__)
typedef __m512i vec;
#define VEC_ZERO() _mm512_setzero_si512()
#define VEC_ADD(a, b) _mm512_add_epi64(a, b)
#define VEC_LOAD(p) _mm512_load_si512((const void *) (p))
static uint64_t vec_sum(vec a) { return (uint64_t) _mm512_reduce_add_epi64(a); }
#elif defined(__AVX2__)
typedef __m256i vec;
#define VEC_ZERO() _mm256_setzero_si256()
#define VEC_ADD(a, b) _mm256_add_epi64(a, b)
#define VEC_LOAD(p) _mm256_load_si256((const __m256i *) (p))
static uint64_t vec_sum(vec a) {
    uint64_t t[4];
    _mm256_storeu_si256((__m256i *) t, a);
    return t[0] + t[1] + t[2] + t[3];
}
#else
typedef uint64_t vec;
#define VEC_ZERO() 0
#define VEC_ADD(a, b) ((a) + (b))
#define VEC_LOAD(p) (*(const uint64_t *) (p))
static uint64_t vec_sum(vec a) { return a; }
#endif

/* Sums the part four loads at a time, into four accumulators so the adds do not wait on each other. */
static uint64_t read_all(const uint8_t *p, size_t n) {
    const size_t w = sizeof(vec);
    vec a0 = VEC_ZERO(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 4 * w <= n; i += 4 * w) {
        a0 = VEC_ADD(a0, VEC_LOAD(p + i));
        a1 = VEC_ADD(a1, VEC_LOAD(p + i + w));
        a2 = VEC_ADD(a2, VEC_LOAD(p + i + 2 * w));
        a3 = VEC_ADD(a3, VEC_LOAD(p + i + 3 * w));
    }
    return vec_sum(VEC_ADD(VEC_ADD(a0, a1), VEC_ADD(a2, a3)));
}

static void *worker(void *arg) {
    job_t *j = arg;
    for (int pass = 0; pass < j->passes; pass++) {
        pthread_barrier_wait(j->start);
        j->t_start = now();
        j->sink += read_all(j->p, j->n);
        j->t_end = now();
        pthread_barrier_wait(j->end);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: membw BYTES THREADS SECONDS\n");
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10);
    int threads = atoi(argv[2]);
    double seconds = atof(argv[3]);
    if (bytes < 4096 || threads < 1 || threads > 256 || seconds <= 0) {
        fprintf(stderr, "membw: need BYTES >= 4096, THREADS in 1..256, SECONDS > 0\n");
        return 2;
    }
    size_t part = (bytes / threads) & ~(size_t) 255;
    uint8_t *buf = aligned_alloc(64, part * threads);
    if (!buf) {
        fprintf(stderr, "membw: cannot allocate %zu bytes\n", part * threads);
        return 1;
    }
    memset(buf, 1, part * threads); // touch every page before timing

    // Calibrate the pass count from one single-threaded pass.
    double t0 = now();
    volatile uint64_t sink = read_all(buf, part * threads);
    double one = now() - t0;
    int passes = (int) (seconds / (one / threads + 1e-7));
    if (passes < 3) passes = 3;
    if (passes > 100000) passes = 100000;

    pthread_barrier_t start, end;
    pthread_barrier_init(&start, NULL, threads + 1);
    pthread_barrier_init(&end, NULL, threads + 1);
    job_t *jobs = calloc(threads, sizeof(job_t));
    pthread_t *tids = calloc(threads, sizeof(pthread_t));
    if (!jobs || !tids) return 1;
    for (int t = 0; t < threads; t++) {
        jobs[t] = (job_t) {buf + part * t, part, 0, &start, &end, passes};
        if (pthread_create(&tids[t], NULL, worker, &jobs[t]) != 0) {
            fprintf(stderr, "membw: cannot start thread %d\n", t);
            return 1;
        }
    }
    // A pass lasts from the first worker's start to the last one's end: the
    // workers time themselves, since the main thread may wake late.
    double best = 1e30;
    for (int pass = 0; pass < passes; pass++) {
        pthread_barrier_wait(&start);
        pthread_barrier_wait(&end);
        double s = 1e30, e = 0;
        for (int t = 0; t < threads; t++) {
            if (jobs[t].t_start < s) s = jobs[t].t_start;
            if (jobs[t].t_end > e) e = jobs[t].t_end;
        }
        if (e - s < best) best = e - s;
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        sink += jobs[t].sink;
    }
    printf("{\"probe\":\"membw\",\"bytes\":%zu,\"threads\":%d,\"passes\":%d,\"GBps\":%.3f,\"sink\":%llu}\n",
           part * threads, threads, passes, (double) (part * threads) / best / 1e9, (unsigned long long) (sink & 1));
    return 0;
}
