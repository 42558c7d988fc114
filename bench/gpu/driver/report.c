// The driver's records, one JSON object a line on stdout: validate.sh
// gathers them into its JSON file (bench/gpu/report.awk).
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <time.h>

#include "driver.h"

static int32_t failures;

/* s as a JSON string's contents. */
static void put_escaped(const char *s) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
}

static void put_number(double v) {
    if (isfinite(v)) printf("%.6g", v);
    else printf("null");
}

void report_check(const char *name, check_status st, double value, const char *bar, const char *detail,
                  double seconds) {
    static const char *const names[] = {"pass", "fail", "skip"};
    if (st == ST_FAIL) failures++;
    printf("{\"kind\":\"check\",\"name\":\"");
    put_escaped(name);
    printf("\",\"status\":\"%s\",\"value\":", names[st]);
    put_number(value);
    printf(",\"bar\":\"");
    put_escaped(bar);
    printf("\",\"seconds\":%.3f,\"detail\":\"", seconds);
    put_escaped(detail);
    printf("\"}\n");
    fflush(stdout);
}

void report_figure(const char *engine, const char *model, const char *weights, int32_t loops, int32_t rows,
                   const char *exit, double tok_s, double mean_steps) {
    printf("{\"kind\":\"figure\",\"engine\":\"");
    put_escaped(engine);
    printf("\",\"model\":\"");
    put_escaped(model);
    printf("\",\"weights\":\"%s\",\"loops\":%d,\"rows\":%d,\"exit\":\"%s\",\"tok_s\":", weights, loops, rows,
           exit);
    put_number(tok_s);
    printf(",\"mean_steps\":");
    put_number(mean_steps);
    printf("}\n");
    fflush(stdout);
}

int32_t report_failures(void) { return failures; }

double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
