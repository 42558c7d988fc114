// A kernel library opened with dlopen (RTLD_LOCAL: the CPU and the CUDA
// library define the same names and live side by side), its ABI as function
// pointers.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

#define SYM(field, name, required)                                                        \
    do {                                                                                  \
        *(void **)&api->field = dlsym(api->handle, name);                                 \
        if (required && !api->field) {                                                    \
            snprintf(err, err_len, "%s: missing symbol %s", path, name);                 \
            api_close(api);                                                               \
            return -1;                                                                    \
        }                                                                                 \
    } while (0)

int api_open(ls_api *api, const char *path, int32_t simd, int32_t threads, char *err, size_t err_len) {
    memset(api, 0, sizeof *api);
    api->path = path;
    api->simd = simd;
    api->threads = threads;
    api->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!api->handle) {
        snprintf(err, err_len, "cannot open %s: %s", path, dlerror());
        return -1;
    }
    SYM(abi_version, "ls_abi_version", 1);
    SYM(features, "ls_features", 1);
    SYM(status_str, "ls_status_str", 1);
    SYM(model_load, "ls_model_load", 1);
    SYM(model_free, "ls_model_free", 1);
    SYM(model_info_get, "ls_model_info_get", 1);
    SYM(model_device_memory, "ls_model_device_memory", 1);
    SYM(session_new, "ls_session_new", 1);
    SYM(session_free, "ls_session_free", 1);
    SYM(session_pos, "ls_session_pos", 1);
    SYM(session_rollback, "ls_session_rollback", 1);
    SYM(session_copy_prefix, "ls_session_copy_prefix", 1);
    SYM(session_forward, "ls_session_forward", 1);
    SYM(session_step, "ls_session_step", 1);
    SYM(session_last_steps, "ls_session_last_steps", 1);
    SYM(batch_step, "ls_batch_step", 1);
    SYM(sample, "ls_sample", 1);
    SYM(spec_cycle, "ls_spec_cycle", 1);
    SYM(cuda_device_count, "ls_cuda_device_count", 0);
    SYM(cuda_kernels, "ls_cuda_kernels", 0);
    SYM(cuda_kernels_verified, "ls_cuda_kernels_verified", 0);
    SYM(cuda_selftest, "ls_cuda_selftest", 0);
    if (api->abi_version() != LS_ABI_VERSION) {
        snprintf(err, err_len, "%s: ABI version %d, this driver is built for %d", path, api->abi_version(),
                 LS_ABI_VERSION);
        api_close(api);
        return -1;
    }
    return 0;
}

void api_close(ls_api *api) {
    /* never dlclose: the libraries are linked with -z nodelete (their exit
     * handlers outlive an unload), and the driver ends soon after */
    api->handle = NULL;
}

ls_model *api_load(const ls_api *api, const char *path, char *err, size_t err_len) {
    ls_model_desc desc;
    if (model_file_desc(path, &desc, err, err_len) != 0) return NULL;
    return api->model_load(path, &desc, api->threads, api->simd, err, (int32_t)err_len);
}

ls_session *api_session(const ls_api *api, ls_model *m, int32_t max_seq, int32_t loops, int32_t window) {
    ls_session_params p = {.max_seq = max_seq, .loops = loops, .cache_window = window, .kv_mode = LS_KV_FP16};
    char err[256];
    ls_session *s = api->session_new(m, &p, err, sizeof err);
    if (!s) fprintf(stderr, "%s: session (max_seq %d, loops %d, window %d): %s\n", api->path, max_seq, loops, window, err);
    return s;
}

void api_free_sessions(const ls_api *api, ls_session **s, int32_t n) {
    for (int32_t i = 0; s && i < n; i++)
        if (s[i]) api->session_free(s[i]);
    free(s);
}
