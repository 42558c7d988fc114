// The CPU harness's reproducible stream and its records (harness.h).
#include <stdio.h>

#include "harness.h"

int failures;

static uint64_t rng = 0x243f6a8885a308d3ull;

uint32_t harness_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

void report(const char *check, int ok, const char *detail) { report_bar(check, ok, "bit-identical", detail); }

void report_bar(const char *check, int ok, const char *bar, const char *detail) {
    printf("{\"kind\":\"check\",\"name\":\"harness/%s\",\"status\":\"%s\",\"value\":null,\"bar\":\"%s\","
           "\"seconds\":0,\"detail\":\"%s\"}\n",
           check, ok ? "pass" : "fail", bar, detail);
    fflush(stdout);
    if (!ok) failures++;
}
