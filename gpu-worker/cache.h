/* cache — the expert cache's residency: which (layer, expert) lives in which slot of the fast tier
 * (VRAM slots on a GPU, a host pool in the CPU backend's slot mode), backend-neutral.
 *
 * Slots are all the size of the largest blob (slot_bytes); a slot holds exactly one expert's blob,
 * blob_bytes[l] of it meaningful. Two tables map (layer, expert) -> slot or -1 (on the host tier):
 * the working table, which the tier edits between windows, and the published one, which a window
 * reads. cache_publish copies working to published, so a window reads one consistent table and an
 * expert turns resident for the windows after its copy landed, never during one.
 * Filled at start hottest-first (cache_fill_order): global rank by heat, ties by expert id, then
 * layer, so without heat the slots spread evenly over the layers.
 * Threads: the decode thread only (the copy engine never touches the tables).
 */
#ifndef STRATA_CACHE_H
#define STRATA_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#define CACHE_NONE (-1)
#define CACHE_LENT (-2) /* owner of a slot whose memory is lent to the KV cache (one budget) */

/* --expert-cache as given: auto, a slot count, or a byte budget. */
struct cache_spec {
    enum { CACHE_AUTO = 0, CACHE_SLOTS, CACHE_BYTES } kind;
    uint64_t value; /* slots or bytes */
};

/* cache_spec_parse reads "auto", "N" (slots) or "XGiB" / "XMiB" (a budget). STRATA_EINVAL names
 * the accepted forms. */
int cache_spec_parse(const char *s, struct cache_spec *out);

/* cache_spec_slots resolves spec to a slot count: auto gives auto_slots (the backend's free
 * budget: 0 on the CPU backend), a budget gives budget / slot_bytes; capped at n_total. */
uint32_t cache_spec_slots(const struct cache_spec *spec, uint64_t slot_bytes, uint32_t auto_slots,
                          uint32_t n_total);

struct cache {
    uint32_t n_layer, n_expert, n_slots;
    uint64_t slot_bytes;
    int32_t *work;  /* (n_layer * n_expert) the tier's table */
    int32_t *pub;   /* (n_layer * n_expert) what windows read */
    int32_t *owner; /* (n_slots) l * n_expert + e, CACHE_NONE (free) or CACHE_LENT */
    uint32_t n_lent;
};

/* cache_init: an empty cache (every expert on the host tier, every slot free). STRATA_ENOMEM. */
int cache_init(uint32_t n_layer, uint32_t n_expert, uint32_t n_slots, uint64_t slot_bytes,
               struct cache **out);
void cache_fini(struct cache *c);

/* cache_slot: the published slot of (l, e), or CACHE_NONE. What a window reads. */
static inline int32_t cache_slot(const struct cache *c, uint32_t l, uint32_t e)
{
    return c->pub[(uint64_t)l * c->n_expert + e];
}

/* cache_evict frees slot s in the working table (its expert goes back to the host tier). */
void cache_evict(struct cache *c, uint32_t s);

/* cache_assign gives free slot s to (l, e) in the working table. */
void cache_assign(struct cache *c, uint32_t s, uint32_t l, uint32_t e);

/* cache_free_slot: a free slot of the working table, or CACHE_NONE. O(slots): fine below a few
 * thousand slots, called a few times a round. */
int32_t cache_free_slot(const struct cache *c);

/* cache_resize changes the slot count to n_slots: slots at or past it are evicted (working table),
 * new ones start free. STRATA_ENOMEM leaves c as it was; STRATA_EBUSY, too, when a slot at or
 * past n_slots is lent (move its memory first: cache_lend below n_slots, then cache_unlend). */
int cache_resize(struct cache *c, uint32_t n_slots);

/* One budget (DESIGN 3.1): the slots' memory is shared with the KV cache, which grows by taking a
 * slot's memory (a segment) and gives it back on a resize. The order, for whoever owns the slots
 * (backend-neutral; the caller does the memory): land every copy in flight (the tier's fence),
 * cache_lend (the slot leaves the working table), cache_publish (no window reads it any more),
 * and only then write KV into the slot's memory. A lent slot is never free, never picked by the
 * tier (tier_pick skips slots that are not free) and never resident.
 * cache_lend picks the slot to lend among those below `below`: a free one (lowest first), else
 * the resident with the lowest counts[l * n_expert + e] (counts NULL: all equal; ties: the
 * highest slot), evicts it and marks it lent. CACHE_NONE when every slot below is lent.
 * cache_unlend: lent slot s is a free slot again. Its memory still holds KV rows, which no window
 * reads: a slot is read only once a copy has landed in it. */
int32_t cache_lend(struct cache *c, const float *counts, uint32_t below);
void cache_unlend(struct cache *c, uint32_t s);

/* cache_publish makes the working table the one windows read. */
void cache_publish(struct cache *c);

/* cache_resident: experts the published table holds. */
uint32_t cache_resident(const struct cache *c);

/* cache_fill_order writes every (layer, expert) as l * n_expert + e into order, hottest first:
 * heat (n_layer * n_expert, NULL: all equal) descending, ties by expert id, then layer.
 * STRATA_ENOMEM. */
int cache_fill_order(uint32_t n_layer, uint32_t n_expert, const uint64_t *heat, uint32_t *order);

#endif
