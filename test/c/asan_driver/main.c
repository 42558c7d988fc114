// The subcommands of the sanitized driver (driver.h lists them).
#include <string.h>

#include "driver.h"

int g_fail;

int usage(void) {
    fprintf(stderr,
            "usage: asan_driver load FILE [SIMD]\n"
            "       asan_driver logits FILE LOOPS SIMD TOKEN...\n"
            "       asan_driver invariance FILE LOOPS SIMD TOKEN...\n"
            "       asan_driver batch FILE SIMD TOKEN...\n"
            "       asan_driver fuzz FILE ITERATIONS SEED [-v]\n"
            "       asan_driver sample TEMP TOP_K TOP_P PENALTY SEED COUNTER LOGITS [HISTORY]\n"
            "       asan_driver sample-check\n"
            "       asan_driver f16-check\n"
            "       asan_driver rope-check\n");
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *cmd = argv[1];
    argc -= 2;
    argv += 2;
    if (strcmp(cmd, "load") == 0) return cmd_load(argc, argv);
    if (strcmp(cmd, "logits") == 0) return cmd_logits(argc, argv);
    if (strcmp(cmd, "invariance") == 0) return cmd_invariance(argc, argv);
    if (strcmp(cmd, "batch") == 0) return cmd_batch(argc, argv);
    if (strcmp(cmd, "fuzz") == 0) return cmd_fuzz(argc, argv);
    if (strcmp(cmd, "sample") == 0) return cmd_sample(argc, argv);
    if (strcmp(cmd, "f16-check") == 0) {
        if (argc != 0) return usage();
        return cmd_f16_check();
    }
    if (strcmp(cmd, "rope-check") == 0) {
        if (argc != 0) return usage();
        return cmd_rope_check();
    }
    if (strcmp(cmd, "sample-check") == 0) {
        if (argc != 0) return usage();
        return cmd_sample_check();
    }
    return usage();
}
