// harness: the CPU harness's command line (harness.h).
#include "harness.h"

int main(int argc, char **argv) {
    check_quant();
    check_early_exit(argv + 1, argc - 1);
    return failures == 0 ? 0 : 1;
}
