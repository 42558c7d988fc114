// Command-line arguments: integers, floats, SIMD paths and lists.
#define _GNU_SOURCE /* strdup, strtok_r */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

int parse_i64(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    if (*s == '\0') return -1;
    long long v = strtoll(s, &end, 10);
    if (*end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int parse_simd(const char *s, int32_t *out) {
    static const char *names[] = {"auto", "portable", "avx2", "avx512"};
    for (int32_t i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    long long v;
    if (parse_i64(s, 0, 3, &v) != 0) return -1;
    *out = (int32_t)v;
    return 0;
}

int parse_float(const char *s, float *out) {
    char *end;
    if (*s == '\0') return -1;
    if (strcmp(s, "nan") == 0) {
        *out = NAN;
        return 0;
    }
    double d = strtod(s, &end);
    if (*end != '\0') return -1;
    *out = (float)d;
    return 0;
}

static int parse_float_elem(const char *s, void *out) { return parse_float(s, out); }

static int parse_int32_elem(const char *s, void *out) {
    long long x;
    if (parse_i64(s, INT32_MIN, INT32_MAX, &x) != 0) return -1;
    *(int32_t *)out = (int32_t)x;
    return 0;
}

/* Comma-separated values of `size` bytes each, parsed by `parse`: the count, or -1. */
static int parse_list(const char *s, size_t size, int (*parse)(const char *, void *), void **out) {
    int n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    char *v = malloc((size_t)n * size);
    char *copy = strdup(s), *save = NULL;
    int i = 0;
    for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; v && tok && i >= 0; tok = strtok_r(NULL, ",", &save))
        i = i < n && parse(tok, v + (size_t)i * size) == 0 ? i + 1 : -1;
    free(copy);
    if (!v || !copy || i < 0) {
        free(v);
        return -1;
    }
    *out = v;
    return i;
}

int parse_float_list(const char *s, float **out) { return parse_list(s, sizeof **out, parse_float_elem, (void **)out); }

int parse_int_list(const char *s, int32_t **out) { return parse_list(s, sizeof **out, parse_int32_elem, (void **)out); }
