/* kv_vram_cuda — the CUDA backend's K/V storage grown on demand: for each of n_regions regions
 * (a layer's K, then its V) a virtual range for every block the bookkeeping can hand out is
 * reserved at start, and physical VRAM is mapped into every region alike, in whole allocation
 * granules, as block ids are first used (kv_blocks_used_ever). Addresses never move, so the
 * attention reads region r at base + r * stride whatever has been mapped since. This lets K/V and
 * the hybrid's expert slots share one VRAM budget: K/V starts at one granule a region and takes
 * slots back when a request or a long context needs more (backend_cuda.c decides; this holds the
 * mappings). The driver's virtual memory calls (cuMemAddressReserve, cuMemCreate, cuMemMap,
 * cuMemSetAccess) are reached through cudaGetDriverEntryPointByVersion: nothing links libcuda.
 * Threads: the decode thread only.
 */
#ifndef STRATA_KV_VRAM_CUDA_H
#define STRATA_KV_VRAM_CUDA_H

#include <stdint.h>

struct kv_vram;

/* kv_vram_open reserves n_regions ranges of max_blocks blocks of block_bytes on device dev and
 * maps init_blocks of each. STRATA_EUNSUPPORTED when the device or driver has no virtual memory
 * management (the caller then allocates the whole pool), STRATA_ENOSPC, CUDA errors. */
int kv_vram_open(int dev, uint32_t n_regions, uint64_t block_bytes, uint32_t max_blocks,
                 uint32_t init_blocks, struct kv_vram **out);
void kv_vram_close(struct kv_vram *k);

uint8_t *kv_vram_base(const struct kv_vram *k);
uint64_t kv_vram_stride(const struct kv_vram *k);  /* bytes from one region to the next */
uint32_t kv_vram_blocks(const struct kv_vram *k);  /* blocks every region has mapped */
uint64_t kv_vram_bytes(const struct kv_vram *k);   /* VRAM mapped, all regions */
uint64_t kv_vram_granule(const struct kv_vram *k); /* the driver's allocation granule */

/* kv_vram_grow_bytes: the VRAM mapping `blocks` blocks a region would add (0: already mapped). */
uint64_t kv_vram_grow_bytes(const struct kv_vram *k, uint32_t blocks);

/* kv_vram_grow maps every region up to at least `blocks` blocks (whole granules, at most
 * max_blocks). STRATA_ENOSPC when the device has not the memory (nothing changed). */
int kv_vram_grow(struct kv_vram *k, uint32_t blocks);

#endif
