/* hybrid_plan — the CUDA hybrid's host-side decisions, pure C and tested without a GPU: how many
 * VRAM slots the expert cache gets, how a layer's routed pairs split into hits (the GPU, from
 * slots), PCIe pairs (the GPU, from registered host memory) and misses (the CPU twin, from the
 * arena), and which blobs the background registration takes next.
 *
 * The split: the pairs are grouped once (moe_group over every expert, each expert's pairs in token
 * order, uncapped), then each group goes to one side by the published slot table: hits are cut
 * into runs of at most the GPU's max_pairs, misses stay whole (the CPU reads an expert once for
 * all its pairs). Each side gets its own contiguous pair index array (cpu_moe_ffn and cu_moe_ffn
 * both read a side's pairs back to back). Whatever the split, every pair's output row is computed
 * by the same arithmetic (the bit-exact contract): the split decides only where.
 * Threads: none (pure functions; hyb_pinset is one thread's, or its caller's lock's).
 */
#ifndef STRATA_HYBRID_PLAN_H
#define STRATA_HYBRID_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu-worker/cache.h"
#include "kernels/ref/moe.h"

/* What the VRAM plan knows before the slots are allocated. */
struct hyb_budget {
    uint64_t vram_free;   /* cudaMemGetInfo's free bytes before any allocation of ours */
    uint64_t reserve;     /* --vram-reserve-mib in bytes */
    uint64_t fixed;       /* weights + KV + scratch + the hybrid's own buffers and tables */
    uint64_t slot_bytes;  /* one slot (the largest blob, rounded) */
    uint32_t n_total;     /* every (layer, expert) */
    uint32_t chunk_slots; /* slots one VRAM allocation holds (the pool grows and shrinks by it) */
};

/* hyb_auto_slots: the slots that fit in vram_free - reserve - fixed, counting the allocation
 * rounding of whole chunks (each chunk's bytes rounded up to 2 MiB, cudaMalloc's granularity),
 * capped at n_total; 0 when fixed alone does not fit. */
uint32_t hyb_auto_slots(const struct hyb_budget *b);

/* hyb_plan_slots resolves --expert-cache (auto, N, bytes) against the budget: auto gives
 * hyb_auto_slots; N and bytes are taken as asked (capped at n_total) — the caller refuses an ask
 * above what fits, naming both. */
uint32_t hyb_plan_slots(const struct cache_spec *spec, const struct hyb_budget *b);

/* hyb_shrink_to: after allocating, the VRAM left (vram_free_now) must still cover the reserve: the
 * slot count to keep (n_slots less the whole chunks that cover the shortfall). */
uint32_t hyb_shrink_to(uint32_t n_slots, uint64_t vram_free_now, const struct hyb_budget *b);

/* hyb_chunk_bytes: VRAM one allocation of `slots` slots takes (rounded to 2 MiB). */
uint64_t hyb_chunk_bytes(uint64_t slot_bytes, uint32_t slots);

/* ---- one VRAM budget for K/V and the slots --------------------------------------------------
 * K/V is mapped on demand (kv_vram_cuda.h) in granules of each region; when it must grow and the
 * budget is full, the slot pool gives back whole chunks from its tail (each allocated whole). */

/* hyb_kv_granules: granules of `granule` bytes that `blocks` blocks of block_bytes take. */
uint64_t hyb_kv_granules(uint64_t block_bytes, uint64_t granule, uint32_t blocks);

/* hyb_kv_take: K/V must grow by `grow` bytes; the backend holds `held` bytes now (everything: K/V,
 * slots, weights, scratch) of `budget`, the slot pool n_slots in chunks of chunk_slots slots of
 * slot_bytes, each chunk allocated whole. Returns the slot count to keep: n_slots when the
 * budget has room, else n_slots less the fewest whole tail chunks that make room; *shortfall is
 * the bytes still missing with every slot given back (0 when the growth fits). */
uint32_t hyb_kv_take(uint64_t budget, uint64_t held, uint64_t grow, uint32_t n_slots,
                     uint64_t slot_bytes, uint32_t chunk_slots, uint64_t *shortfall);

/* hyb_slots_within: the most slots (a whole-chunk pool) that fit in `room` bytes, capped at cap. */
uint32_t hyb_slots_within(uint64_t room, uint64_t slot_bytes, uint32_t chunk_slots, uint32_t cap);

/* One layer's split. Arrays of n_tok * k entries (groups: at most n_tok * k each side). */
struct hyb_split {
    struct moe_group *hit_groups, *pcie_groups, *miss_groups;
    int32_t *hit_idx, *pcie_idx, *miss_idx; /* each side's pairs, contiguous from 0 */
    int n_hit, n_pcie, n_miss;              /* groups on each side */
    uint32_t hit_pairs, pcie_pairs, miss_pairs;
};

/* hyb_pcie_rule: which missed experts the GPU computes over PCIe. Decode windows (prompt false):
 * the first ceil(frac * misses) missed experts, most pairs first, ties by lower id. Prompt chunks:
 * every missed expert with at least threshold pairs (0: none), most pairs first when max_experts
 * caps them. frac 0 and threshold 0: none. */
struct hyb_pcie_rule {
    float frac;
    uint32_t threshold;
    uint32_t max_experts; /* at most this many experts a layer (staging slots); 0: no cap */
};

/* hyb_split_layer groups ids[n_tok * k] (the router's picks, ids < n_expert) once with moe_group
 * into scratch (groups, pair_idx: n_tok * k each), then fills out: experts whose slot_of[e] (the
 * published table's row of this layer) is not CACHE_NONE are hits, cut at max_pairs; the missed
 * experts that rule picks (host_ok[e] != 0 only: their bytes are reachable by the GPU; NULL: none
 * are) go to pcie, cut at max_pairs; the rest are misses, whole. Returns the total group count of
 * the full grouping. */
int hyb_split_layer(const int32_t *ids, int64_t n_tok, int k, uint32_t n_expert,
                    const int32_t *slot_of, const uint8_t *host_ok,
                    const struct hyb_pcie_rule *rule, bool prompt, uint32_t max_pairs,
                    struct moe_group *groups, int32_t *pair_idx, struct hyb_split *out);

/* hyb_gather_index: the device gather that merges the sides' output rows into one array for the
 * combine: rows[p] = p for a pair computed on the GPU (its row of the GPU's output), n_pairs + i
 * for the i-th miss pair in miss order (its row of the uploaded miss block). n_pairs = n_tok * k.
 */
void hyb_gather_index(const struct hyb_split *s, uint32_t n_pairs, int32_t *rows);

/* ---- a copy's landing --------------------------------------------------------------------------
 */

/* hyb_land records the outcome of a copy of (layer, expert) into slot in the working table: a good
 * copy gives the slot to the expert; a failed or refused one leaves the expert on the host tier
 * and the slot free — also when the start's fill took the slot for it when posting (so no later
 * publication shows a poisoned slot as resident). Returns ok. */
bool hyb_land(struct cache *c, uint32_t slot, uint32_t layer, uint32_t expert, bool ok);

/* ---- registration: the set of host blobs the GPU may read or copy from directly ------------ */

/* --pin: none (every copy through a pinned bounce buffer), need (blobs registered as they are
 * first wanted, by a background thread), whole (the whole expert region at start, in the
 * background). */
enum hyb_pin { HYB_PIN_NEED = 0, HYB_PIN_WHOLE, HYB_PIN_NONE };

int hyb_pin_parse(const char *s, enum hyb_pin *out);
const char *hyb_pin_name(enum hyb_pin p);

/* The registered set: one state per blob (layer * n_expert + expert), growing only: a blob goes
 * none -> queued -> registered (or failed, never retried); nothing leaves it while serving.
 * hyb_pinset_want queues a blob (once); hyb_pinset_next hands the registering thread the oldest
 * queued blob; hyb_pinset_done records the outcome. */
enum { HYB_PIN_ABSENT = 0, HYB_PIN_QUEUED, HYB_PIN_REGISTERED, HYB_PIN_FAILED };

struct hyb_pinset {
    uint32_t n;      /* blobs */
    uint8_t *state;  /* (n) HYB_PIN_* */
    uint32_t *queue; /* (n) ring of queued blob ids: each is queued at most once, so n holds it */
    uint32_t head, tail; /* queue[head..tail) pending (counts, not wrapped: tail <= n) */
    uint32_t registered, failed;
};

int hyb_pinset_init(uint32_t n, struct hyb_pinset *out);
void hyb_pinset_fini(struct hyb_pinset *s);
/* returns true when the blob was newly queued */
bool hyb_pinset_want(struct hyb_pinset *s, uint32_t blob);
/* returns false when nothing is queued */
bool hyb_pinset_next(struct hyb_pinset *s, uint32_t *blob);
void hyb_pinset_done(struct hyb_pinset *s, uint32_t blob, bool ok);
static inline bool hyb_pinset_has(const struct hyb_pinset *s, uint32_t blob)
{
    return s->state[blob] == HYB_PIN_REGISTERED;
}

#endif
