/* K/V storage mapped on demand (kv_vram_cuda.h). */
#include "gpu-worker/kv_vram_cuda.h"
#include "common/base/err.h"
#include "gpu-worker/hybrid_plan.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>

/* the driver's calls, found at open */
struct vmm {
    CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*free_va)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                            CUmemAllocationGranularity_flags);
    CUresult (*attr)(int *, CUdevice_attribute, CUdevice);
};

struct kv_vram {
    struct vmm f;
    int dev;
    uint32_t n_regions, max_blocks;
    uint64_t block_bytes, granule, stride;
    CUdeviceptr base;
    uint32_t granules; /* mapped per region */
    CUmemGenericAllocationHandle *handles;
    CUdeviceptr *at; /* (n_handles) where each is mapped */
    uint64_t *bytes; /* (n_handles) how much */
    uint32_t n_handles, cap_handles;
    CUmemAllocationProp prop;
};

static int sym(const char *name, void **fn)
{
    enum cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !*fn) {
        cudaGetLastError();
        return strata_errf(STRATA_EUNSUPPORTED, "CUDA: the driver has no %s", name);
    }
    return 0;
}

static int cu(CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS) return 0;
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return strata_errf(STRATA_ENOSPC, "CUDA: %s: out of VRAM", what);
    return strata_errf(STRATA_ECUDAERR | (int)r, "CUDA: %s: driver error %d", what, (int)r);
}

int kv_vram_open(int dev, uint32_t n_regions, uint64_t block_bytes, uint32_t max_blocks,
                 uint32_t init_blocks, struct kv_vram **out)
{
    struct kv_vram *k = calloc(1, sizeof *k);
    if (!k) return strata_errf(STRATA_ENOMEM, "out of memory for the K/V mappings");
    k->dev = dev, k->n_regions = n_regions, k->max_blocks = max_blocks;
    k->block_bytes = block_bytes;
    int rv, on = 0;
    if ((rv = sym("cuMemAddressReserve", (void **)&k->f.reserve)) ||
        (rv = sym("cuMemAddressFree", (void **)&k->f.free_va)) ||
        (rv = sym("cuMemCreate", (void **)&k->f.create)) ||
        (rv = sym("cuMemRelease", (void **)&k->f.release)) ||
        (rv = sym("cuMemMap", (void **)&k->f.map)) ||
        (rv = sym("cuMemUnmap", (void **)&k->f.unmap)) ||
        (rv = sym("cuMemSetAccess", (void **)&k->f.access)) ||
        (rv = sym("cuMemGetAllocationGranularity", (void **)&k->f.granularity)) ||
        (rv = sym("cuDeviceGetAttribute", (void **)&k->f.attr)))
        goto fail;
    if (k->f.attr(&on, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
            CUDA_SUCCESS ||
        !on) {
        rv = strata_errf(STRATA_EUNSUPPORTED, "CUDA: device %d has no virtual memory management",
                         dev);
        goto fail;
    }
    k->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    k->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    k->prop.location.id = dev;
    size_t g = 0;
    if ((rv = cu(k->f.granularity(&g, &k->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")))
        goto fail;
    k->granule = g;
    k->stride = hyb_kv_granules(block_bytes, g, max_blocks) * g;
    if ((rv = cu(k->f.reserve(&k->base, k->stride * n_regions, g, 0, 0), "K/V address range"))) {
        k->base = 0;
        goto fail;
    }
    if ((rv = kv_vram_grow(k, init_blocks ? init_blocks : 1))) goto fail;
    *out = k;
    return 0;
fail:
    kv_vram_close(k);
    return rv;
}

void kv_vram_close(struct kv_vram *k)
{
    if (!k) return;
    if (k->base) {
        for (uint32_t i = 0; i < k->n_handles; i++) {
            k->f.unmap(k->at[i], k->bytes[i]);
            k->f.release(k->handles[i]);
        }
        k->f.free_va(k->base, k->stride * k->n_regions);
    }
    free(k->handles);
    free(k->at);
    free(k->bytes);
    free(k);
}

uint8_t *kv_vram_base(const struct kv_vram *k)
{
    return (uint8_t *)(uintptr_t)k->base;
}

uint64_t kv_vram_stride(const struct kv_vram *k)
{
    return k->stride;
}

uint32_t kv_vram_blocks(const struct kv_vram *k)
{
    const uint64_t b = (uint64_t)k->granules * k->granule / k->block_bytes;
    return b < k->max_blocks ? (uint32_t)b : k->max_blocks;
}

uint64_t kv_vram_bytes(const struct kv_vram *k)
{
    return (uint64_t)k->granules * k->granule * k->n_regions;
}

uint64_t kv_vram_granule(const struct kv_vram *k)
{
    return k->granule;
}

uint64_t kv_vram_grow_bytes(const struct kv_vram *k, uint32_t blocks)
{
    if (blocks > k->max_blocks) blocks = k->max_blocks;
    const uint64_t g = hyb_kv_granules(k->block_bytes, k->granule, blocks);
    return g > k->granules ? (g - k->granules) * k->granule * k->n_regions : 0;
}

int kv_vram_grow(struct kv_vram *k, uint32_t blocks)
{
    if (blocks > k->max_blocks) blocks = k->max_blocks;
    const uint32_t want = (uint32_t)hyb_kv_granules(k->block_bytes, k->granule, blocks);
    if (want <= k->granules) return 0;
    const uint64_t dg = (uint64_t)(want - k->granules) * k->granule;
    if (k->n_handles + k->n_regions > k->cap_handles) {
        const uint32_t cap = 2 * (k->n_handles + k->n_regions);
        CUmemGenericAllocationHandle *h = realloc(k->handles, cap * sizeof *h);
        if (h) k->handles = h;
        CUdeviceptr *a = h ? realloc(k->at, cap * sizeof *a) : NULL;
        if (a) k->at = a;
        uint64_t *b = a ? realloc(k->bytes, cap * sizeof *b) : NULL;
        if (b) k->bytes = b;
        if (!b) return strata_errf(STRATA_ENOMEM, "out of memory for the K/V mappings");
        k->cap_handles = cap;
    }
    /* an allocation per region (cuMemMap maps a handle from its offset 0 only) */
    const CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, k->dev},
                                 CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    int rv = 0;
    uint32_t r = 0;
    for (; r < k->n_regions; r++) {
        const CUdeviceptr at = k->base + r * k->stride + (uint64_t)k->granules * k->granule;
        CUmemGenericAllocationHandle hd;
        if ((rv = cu(k->f.create(&hd, dg, &k->prop, 0), "K/V growth"))) break;
        if ((rv = cu(k->f.map(at, dg, 0, hd, 0), "K/V map"))) {
            k->f.release(hd);
            break;
        }
        if ((rv = cu(k->f.access(at, dg, &acc, 1), "K/V access"))) {
            k->f.unmap(at, dg);
            k->f.release(hd);
            break;
        }
        k->handles[k->n_handles + r] = hd;
        k->at[k->n_handles + r] = at;
        k->bytes[k->n_handles + r] = dg;
    }
    if (rv) {
        for (uint32_t i = 0; i < r; i++) {
            k->f.unmap(k->base + i * k->stride + (uint64_t)k->granules * k->granule, dg);
            k->f.release(k->handles[k->n_handles + i]);
        }
        return rv;
    }
    k->n_handles += k->n_regions;
    k->granules = want;
    return 0;
}
