// gpu_driver — the validation driver's command lines (driver.h says what it is):
//
//   gpu_driver checks  CPU_LIB CUDA_LIB TMP MODELS [--quick] [--only=NAME] [--verified-only] [--cpu]
//   gpu_driver figures CPU_LIB CUDA_LIB TMP MODELS [--cpu]
//   gpu_driver model   CASE TMP MODELS     prints the path of a case's model (writing it when generated)
//   gpu_driver write   SPEC FILE           writes a model file from a synth.c spec
//   gpu_driver desc    FILE                writes FILE's ls_model_desc bytes to stdout
//   gpu_driver devices CUDA_LIB            prints the CUDA devices the library can use (0 without)
//   gpu_driver decode  LIB TMP MODELS CASE LOOPS ROWS STEPS [exact|copy THRESHOLD]
//                                          one decode timing on LIB alone (unverified families
//                                          enabled; exiting by the gate when named), e.g. under
//                                          Nsight Compute
//
// CUDA_LIB is "-" where the CUDA library is not built. With a usable GPU
// the candidate is the CUDA library against the CPU library; without one
// (or with --cpu) the CPU library on its best SIMD path against its
// portable path, the CUDA library (if built) checked for what it reports
// and refuses on such a host. Unverified kernel families are enabled for
// the run (a validation run is what verifies them), unless
// --verified-only. --quick: the small synthetic models only, at few rows
// (compute-sanitizer's run). Records are JSON lines on stdout (report.c);
// exit 0 when no check failed, 1 when one did, 2 on bad usage or setup.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/loopserve_cuda.h"
#include "driver.h"

static int usage(void) {
    fprintf(stderr,
            "usage: gpu_driver checks CPU_LIB CUDA_LIB TMP MODELS [--quick] [--only=NAME] [--verified-only] [--cpu]\n"
            "       gpu_driver figures CPU_LIB CUDA_LIB TMP MODELS [--cpu]\n"
            "       gpu_driver model CASE TMP MODELS\n"
            "       gpu_driver write SPEC FILE\n"
            "       gpu_driver desc FILE\n"
            "       gpu_driver devices CUDA_LIB\n"
            "       gpu_driver decode LIB TMP MODELS CASE LOOPS ROWS STEPS [exact|copy THRESHOLD]\n");
    return 2;
}

/* The run's libraries and mode from CPU_LIB CUDA_LIB TMP MODELS and the flags. */
static int setup(run_ctx *ctx, ls_api *cuda, int argc, char **argv) {
    char err[512];
    int force_cpu = 0, verified_only = 0;
    memset(ctx, 0, sizeof *ctx);
    ctx->tmp = argv[2];
    ctx->models_dir = argv[3];
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) ctx->quick = 1;
        else if (strcmp(argv[i], "--cpu") == 0) force_cpu = 1;
        else if (strcmp(argv[i], "--verified-only") == 0) verified_only = 1;
        else if (strncmp(argv[i], "--only=", 7) == 0) ctx->only = argv[i] + 7;
        else return usage();
    }
    if (strcmp(argv[1], "-") != 0) {
        if (api_open(cuda, argv[1], LS_SIMD_AUTO, 0, err, sizeof err) != 0 || !cuda->cuda_kernels) {
            fprintf(stderr, "gpu_driver: %s\n", cuda->handle ? "not the CUDA library" : err);
            return 2;
        }
        ctx->cuda = cuda;
        cuda->cuda_kernels(verified_only ? 0 : LS_CUDA_KERNELS_ALL);
        ctx->gpu = !force_cpu && cuda->cuda_device_count() > 0;
    }
    if (api_open(&ctx->ref, argv[0], ctx->gpu ? LS_SIMD_AUTO : LS_SIMD_PORTABLE, 0, err, sizeof err) != 0) {
        fprintf(stderr, "gpu_driver: %s\n", err);
        return 2;
    }
    if (ctx->gpu) ctx->cand = *cuda;
    else if (api_open(&ctx->cand, argv[0], LS_SIMD_AUTO, 0, err, sizeof err) != 0) {
        fprintf(stderr, "gpu_driver: %s\n", err);
        return 2;
    }
    fprintf(stderr, "gpu_driver: %s against %s (%s)\n", ctx->cand.path, ctx->ref.path,
            ctx->gpu ? "on the GPU" : "no usable GPU: the CPU library's best path against its portable one");
    return 0;
}

static int cmd_model(int argc, char **argv) {
    if (argc != 3) return usage();
    const model_case *mc = case_named(argv[0]);
    if (!mc) {
        fprintf(stderr, "gpu_driver: no model case %s\n", argv[0]);
        return 2;
    }
    run_ctx ctx = {0};
    ctx.tmp = argv[1];
    ctx.models_dir = argv[2];
    char path[2048], why[512];
    if (!case_model_path(&ctx, mc, path, sizeof path, why, sizeof why)) {
        fprintf(stderr, "gpu_driver: %s\n", why);
        return 2;
    }
    printf("%s\n", path);
    return 0;
}

static int cmd_desc(int argc, char **argv) {
    if (argc != 1) return usage();
    ls_model_desc d;
    char err[512];
    if (model_file_desc(argv[0], &d, err, sizeof err) != 0) {
        fprintf(stderr, "gpu_driver: %s\n", err);
        return 2;
    }
    return fwrite(&d, sizeof d, 1, stdout) == 1 ? 0 : 2;
}

static int cmd_write(int argc, char **argv) {
    if (argc != 2) return usage();
    char err[512];
    if (synth_write(argv[0], argv[1], err, sizeof err) != 0) {
        fprintf(stderr, "gpu_driver: %s\n", err);
        return 2;
    }
    return 0;
}

static int cmd_devices(int argc, char **argv) {
    if (argc != 1) return usage();
    ls_api cuda;
    char err[512];
    if (api_open(&cuda, argv[0], LS_SIMD_AUTO, 0, err, sizeof err) != 0 || !cuda.cuda_device_count) {
        fprintf(stderr, "gpu_driver: %s\n", cuda.handle ? "not the CUDA library" : err);
        return 2;
    }
    printf("%d\n", cuda.cuda_device_count());
    return 0;
}

static int cmd_decode(int argc, char **argv) {
    if (argc != 7 && argc != 9) return usage();
    decode_plan d = {atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), 1, LS_EXIT_NONE, 0.0f};
    if (argc == 9) {
        d.exit_policy = strcmp(argv[7], "exact") == 0 ? LS_EXIT_EXACT : strcmp(argv[7], "copy") == 0 ? LS_EXIT_COPY : -1;
        d.exit_threshold = (float)atof(argv[8]);
        if (d.exit_policy < 0) return usage();
    }
    ls_api api;
    char err[512], path[2048];
    const model_case *mc = case_named(argv[3]);
    run_ctx ctx = {0};
    ctx.tmp = argv[1];
    ctx.models_dir = argv[2];
    if (!mc || api_open(&api, argv[0], LS_SIMD_AUTO, 0, err, sizeof err) != 0) {
        fprintf(stderr, "gpu_driver: %s\n", mc ? err : "no such model case");
        return 2;
    }
    if (api.cuda_kernels) api.cuda_kernels(LS_CUDA_KERNELS_ALL);
    ls_model *m = case_model_path(&ctx, mc, path, sizeof path, err, sizeof err) ? api_load(&api, path, err, sizeof err) : NULL;
    double mean_steps = NAN, tok_s = m ? decode_tok_s(&api, m, &d, &mean_steps, err, sizeof err) : -1.0;
    if (tok_s < 0) {
        fprintf(stderr, "gpu_driver: %s\n", err);
        return 2;
    }
    ls_model_info info;
    api.model_info_get(m, &info);
    const char *weights = info.quant == LS_QUANT_INT4 ? "int4" : info.quant == LS_QUANT_INT2 ? "int2" : "fp16";
    char exit[32];
    exit_name(exit, sizeof exit, d.exit_policy, d.exit_threshold);
    report_figure("loopserve", mc->name, weights, d.loops, d.rows, exit, tok_s, mean_steps);
    api.model_free(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *cmd = argv[1];
    argc -= 2;
    argv += 2;
    if (strcmp(cmd, "model") == 0) return cmd_model(argc, argv);
    if (strcmp(cmd, "desc") == 0) return cmd_desc(argc, argv);
    if (strcmp(cmd, "write") == 0) return cmd_write(argc, argv);
    if (strcmp(cmd, "devices") == 0) return cmd_devices(argc, argv);
    if (strcmp(cmd, "decode") == 0) return cmd_decode(argc, argv);
    if ((strcmp(cmd, "checks") != 0 && strcmp(cmd, "figures") != 0) || argc < 4) return usage();
    run_ctx ctx;
    ls_api cuda;
    int rc = setup(&ctx, &cuda, argc, argv);
    if (rc != 0) return rc;
    if (strcmp(cmd, "figures") == 0) {
        run_figures(&ctx);
        return 0;
    }
    run_library_checks(&ctx);
    run_cases(&ctx);
    return report_failures() > 0 ? 1 : 0;
}
