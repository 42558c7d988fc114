/*
 * testing.h — hooks of libloopserve.so that exist only for tests; not part
 * of the ABI a server uses (kernels/loopserve.h). The C drivers include it,
 * and build.ts generates test/helpers/abi_testing.generated.ts from it for
 * the TypeScript tests.
 */
#ifndef LOOPSERVE_TESTING_H
#define LOOPSERVE_TESTING_H

#include "loopserve.h"

/* ls_spec_params.flags: with temperature > 0, accept every draft token (a
 * deliberately broken sampler: its output follows the draft distribution;
 * lets a test prove it can tell the difference). */
#define LS_SPEC_TEST_ACCEPT_ALL 2

#endif
