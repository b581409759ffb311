/* gpus — the GPUs a serve uses. */
#include "launcher/gpus.h"

#include "common/base/err.h"
#include "gpu-worker/backend.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>

int gpus_count(void)
{
    glob_t g;
    if (glob("/proc/driver/nvidia/gpus/*", 0, NULL, &g) != 0) return 0;
    int n = (int)g.gl_pathc;
    globfree(&g);
    return n;
}

bool gpus_have_cuda(void)
{
    for (const char *const *b = backend_names(); *b; b++)
        if (strcmp(*b, "cuda") == 0) return true;
    return false;
}

int gpus_plan(const char *list, bool cpu, bool have_cuda, int n_gpus, int *gpus, int *n)
{
    *n = 0;
    if (cpu && list)
        return strata_errf(STRATA_EINVAL, "--cpu and --gpus %s: give one of them", list);
    if (cpu) return 0;
    if (!list || strcmp(list, "all") == 0) {
        if (!have_cuda || n_gpus == 0) {
            if (list)
                return strata_errf(STRATA_EINVAL, "--gpus all: %s: pass --cpu, or leave --gpus out",
                                   have_cuda ? "the NVIDIA driver lists no GPU on this machine"
                                             : "this strata was built without CUDA (no CUDA "
                                               "toolkit, or -DSTRATA_CUDA=OFF)");
            return 0; /* the default: the CPU when there is nothing else */
        }
        for (*n = 0; *n < n_gpus && *n < GPUS_MAX; (*n)++)
            gpus[*n] = *n;
        return 0;
    }
    if (!have_cuda)
        return strata_errf(STRATA_EINVAL,
                           "--gpus %s: this strata was built without CUDA (no CUDA toolkit, or "
                           "-DSTRATA_CUDA=OFF): rebuild with the CUDA toolkit installed, or "
                           "serve on the CPU (--cpu)",
                           list);
    for (const char *p = list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= GPUS_MAX || (*end && *end != ','))
            return strata_errf(STRATA_EINVAL,
                               "--gpus %s: expected GPU indices separated by commas, e.g. 0,1",
                               list);
        if (n_gpus == 0)
            return strata_errf(STRATA_EINVAL,
                               "--gpus %s: the NVIDIA driver lists no GPU on this machine: "
                               "serve on the CPU (--cpu)",
                               list);
        if (v >= n_gpus)
            return strata_errf(STRATA_EINVAL,
                               "--gpus %s: there is no GPU %ld: the NVIDIA driver lists %d on "
                               "this machine (0..%d; nvidia-smi -L names them)",
                               list, v, n_gpus, n_gpus - 1);
        for (int k = 0; k < *n; k++)
            if (gpus[k] == (int)v)
                return strata_errf(STRATA_EINVAL, "--gpus %s: GPU %ld is named twice", list, v);
        gpus[(*n)++] = (int)v;
        p = *end ? end + 1 : end;
        if (*end && !*p) return strata_errf(STRATA_EINVAL, "--gpus %s: a trailing comma", list);
    }
    return 0;
}
