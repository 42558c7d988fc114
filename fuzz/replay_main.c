/*
 * replay_main.c — runs a libFuzzer target over saved inputs without
 * libFuzzer: `replay FILE...` calls LLVMFuzzerTestOneInput once per file and
 * prints "ok FILE" after each. Linked with a target and the kernels under
 * gcc's AddressSanitizer and UndefinedBehaviorSanitizer, it is how the
 * regression test replays fuzz/regressions/ on machines without clang.
 * A finding aborts (sanitizer report or the target's own abort).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *grown = realloc(buf, cap);
            if (grown == NULL) {
                fclose(f);
                free(buf);
                fprintf(stderr, "%s: out of memory\n", path);
                return -1;
            }
            buf = grown;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        if (r == 0) break;
        len += r;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "%s: read error\n", path);
        return -1;
    }
    // An exactly-sized copy, so a read past the input is reported as libFuzzer's would be.
    uint8_t *exact = malloc(len ? len : 1);
    if (exact == NULL) {
        free(buf);
        return -1;
    }
    if (len) memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    printf("ok %s\n", path);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: replay FILE...\n");
        return 1;
    }
    for (int i = 1; i < argc; i++)
        if (replay(argv[i]) != 0) return 1;
    return 0;
}
