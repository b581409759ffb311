/* gpus — which GPUs `strata serve` puts a worker on: --gpus LIST, --cpu, or by default every GPU
 * the NVIDIA driver lists when this build has the CUDA backend. The decision is a pure function of
 * the options and what the machine has (gpus_plan), so it is tested without a GPU. The driver is
 * asked through /proc (gpus_count), never through CUDA: the launcher forks its children after, and
 * CUDA does not survive a fork. A worker is pinned to its GPU with CUDA_VISIBLE_DEVICES (in PCI
 * bus order, the driver's), so inside it the GPU is device 0.
 */
#ifndef STRATA_GPUS_H
#define STRATA_GPUS_H

#include <stdbool.h>

#define GPUS_MAX 16

/* gpus_count: the GPUs the NVIDIA kernel driver lists (/proc/driver/nvidia/gpus/), 0 without one.
 */
int gpus_count(void);

/* gpus_have_cuda: this build's worker has the CUDA backend. */
bool gpus_have_cuda(void);

/* gpus_plan decides: list is --gpus (NULL: not given, "all": every GPU), cpu is --cpu. On 0, *n
 * is the number of GPU workers (0: the CPU backend) and gpus[0..n) their GPU indices. Errors
 * (STRATA_EINVAL with a message that says what to do): --gpus and --cpu together, a list that is
 * not comma-separated indices or names one twice, --gpus in a build without CUDA, a GPU index the
 * machine does not have (n_gpus of them). */
int gpus_plan(const char *list, bool cpu, bool have_cuda, int n_gpus, int *gpus, int *n);

#endif
