// peak: arithmetic peak per core kind, for bench/peer.ts's roofline.
// Built at bench time: gcc -O3 -march=native -pthread peak.c -o peak
//
// usage: peak fma|vnni THREADS SECONDS
//   fma   fp32 fused multiply-add (AVX-512, else AVX2+FMA): GFLOP/s, 2 per FMA lane
//   vnni  u8 x s8 -> s32 dot products (AVX-512 VNNI, else AVX-VNNI): GOP/s,
//         2 per multiply-accumulate (the unit int8 matmul rooflines use)
// Twelve independent accumulator chains per thread hide the instruction
// latency, so the loop is bound by the issue rate alone. Prints one JSON
// line; {"supported":false} when the CPU lacks the instructions.
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

enum { ITERS = 1 << 20 };
static int mode_vnni;
static double seconds;

typedef struct {
    double ops; // operations done
    double sink;
} job_t;

#if defined(__AVX512F__)
#define ISA_FMA "avx512"
typedef __m512 vf;
#define VF_SET1 _mm512_set1_ps
#define VF_FMA _mm512_fmadd_ps
#define VF_LANES 16
static float vf_sum(vf v) { return _mm512_reduce_add_ps(v); }
#else
#define ISA_FMA "avx2"
typedef __m256 vf;
#define VF_SET1 _mm256_set1_ps
#define VF_FMA _mm256_fmadd_ps
#define VF_LANES 8
static float vf_sum(vf v) {
    float t[8];
    _mm256_storeu_ps(t, v);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

#if defined(__AVX512VNNI__)
#define ISA_VNNI "avx512-vnni"
#define HAVE_VNNI 1
typedef __m512i vi;
#define VI_SET1 _mm512_set1_epi32
#define VI_DP _mm512_dpbusd_epi32
#define VI_BYTES 64
static int vi_sum(vi v) { return _mm512_reduce_add_epi32(v); }
#elif defined(__AVXVNNI__)
#define ISA_VNNI "avx-vnni"
#define HAVE_VNNI 1
typedef __m256i vi;
#define VI_SET1 _mm256_set1_epi32
#define VI_DP _mm256_dpbusd_avx_epi32
#define VI_BYTES 32
static int vi_sum(vi v) {
    int t[8];
    _mm256_storeu_si256((__m256i *) t, v);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#else
#define HAVE_VNNI 0
#endif

/* One step of the twelve chains a0..a11 (a multiply-add on x and y each),
 * and their sum: the same for the fp32 and the int8 peak. */
#define CHAINS_STEP(OP)                                                                       \
    do {                                                                                      \
        a0 = OP(a0, x, y); a1 = OP(a1, x, y); a2 = OP(a2, x, y); a3 = OP(a3, x, y);           \
        a4 = OP(a4, x, y); a5 = OP(a5, x, y); a6 = OP(a6, x, y); a7 = OP(a7, x, y);           \
        a8 = OP(a8, x, y); a9 = OP(a9, x, y); a10 = OP(a10, x, y); a11 = OP(a11, x, y);       \
    } while (0)
#define CHAINS_SUM(SUM) \
    (SUM(a0) + SUM(a1) + SUM(a2) + SUM(a3) + SUM(a4) + SUM(a5) + SUM(a6) + SUM(a7) + SUM(a8) + SUM(a9) + SUM(a10) + SUM(a11))

static double run_fma(double *sink) {
    // Distinct starting values: equal chains would be merged by the compiler.
    vf a0 = VF_SET1(0.f), a1 = VF_SET1(1.f), a2 = VF_SET1(2.f), a3 = VF_SET1(3.f), a4 = VF_SET1(4.f),
       a5 = VF_SET1(5.f), a6 = VF_SET1(6.f), a7 = VF_SET1(7.f), a8 = VF_SET1(8.f), a9 = VF_SET1(9.f),
       a10 = VF_SET1(10.f), a11 = VF_SET1(11.f);
    const vf x = VF_SET1(0.999999f), y = VF_SET1(1e-7f);
    for (int i = 0; i < ITERS; i++) CHAINS_STEP(VF_FMA);
    *sink += CHAINS_SUM(vf_sum);
    return (double) ITERS * 12 * VF_LANES * 2;
}

#if HAVE_VNNI
static double run_vnni(double *sink) {
    vi a0 = VI_SET1(0), a1 = VI_SET1(1), a2 = VI_SET1(2), a3 = VI_SET1(3), a4 = VI_SET1(4), a5 = VI_SET1(5),
       a6 = VI_SET1(6), a7 = VI_SET1(7), a8 = VI_SET1(8), a9 = VI_SET1(9), a10 = VI_SET1(10), a11 = VI_SET1(11);
    const vi x = VI_SET1(0x01010101), y = VI_SET1(0x01ff01ff);
    for (int i = 0; i < ITERS; i++) CHAINS_STEP(VI_DP);
    *sink += CHAINS_SUM(vi_sum);
    return (double) ITERS * 12 * VI_BYTES * 2; // VI_BYTES multiply-accumulates per instruction
}
#endif

static void *worker(void *arg) {
    job_t *j = arg;
    double t0 = now();
    while (now() - t0 < seconds) {
#if HAVE_VNNI
        j->ops += mode_vnni ? run_vnni(&j->sink) : run_fma(&j->sink);
#else
        j->ops += run_fma(&j->sink);
#endif
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[1], "fma") && strcmp(argv[1], "vnni"))) {
        fprintf(stderr, "usage: peak fma|vnni THREADS SECONDS\n");
        return 2;
    }
    mode_vnni = !strcmp(argv[1], "vnni");
    int threads = atoi(argv[2]);
    seconds = atof(argv[3]);
    if (threads < 1 || threads > 256 || seconds <= 0) {
        fprintf(stderr, "peak: need THREADS in 1..256 and SECONDS > 0\n");
        return 2;
    }
#if !HAVE_VNNI
    if (mode_vnni) {
        printf("{\"probe\":\"vnni\",\"threads\":%d,\"supported\":false}\n", threads);
        return 0;
    }
#endif
    job_t *jobs = calloc(threads, sizeof(job_t));
    pthread_t *tids = calloc(threads, sizeof(pthread_t));
    if (!jobs || !tids) return 1;
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        if (pthread_create(&tids[t], NULL, worker, &jobs[t]) != 0) {
            fprintf(stderr, "peak: cannot start thread %d\n", t);
            return 1;
        }
    }
    double ops = 0, sink = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tids[t], NULL);
        ops += jobs[t].ops;
        sink += jobs[t].sink;
    }
    double dt = now() - t0;
#if HAVE_VNNI
    const char *isa = mode_vnni ? ISA_VNNI : ISA_FMA;
#else
    const char *isa = ISA_FMA;
#endif
    printf("{\"probe\":\"%s\",\"isa\":\"%s\",\"threads\":%d,\"supported\":true,\"Gops\":%.3f,\"sink\":%d}\n",
           argv[1], isa, threads, ops / dt / 1e9, sink != 0);
    return 0;
}
