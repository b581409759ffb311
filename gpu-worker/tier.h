/* tier — the adaptive tier's counting and picking (DESIGN 3.3), backend-neutral: which experts to
 * move into the cache between windows. Copy-in only: the arena holds every expert, so a move is
 * one copy into a slot and never a copy back.
 *
 * Counts: routed entries per (layer, expert) per window: a decode step counts each token's pairs;
 * a prompt chunk counts each of its experts once, so a long prompt does not swamp the counts.
 * Every `every` windows a round decays the counts (x decay), then picks up to `swaps` moves: a
 * non-resident expert with count >= min_count takes a free slot, or replaces the least-used
 * resident of its own layer if its count leads that one's by >= lead. Candidates are taken
 * hottest first (ties by layer, then expert id), each victim used once a round. Deterministic:
 * the same counts and table give the same moves.
 * Threads: the decode thread only.
 */
#ifndef STRATA_TIER_H
#define STRATA_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "gpu-worker/cache.h"

struct tier_opts {
    uint32_t every; /* windows between rounds; 0: a static cache (no rounds) */
    uint32_t swaps; /* most moves a round */
    float decay;    /* counts are multiplied by this each round */
    float min_count;
    float lead;
    bool async; /* --adapt-async 1: a round's copies run while windows do (the backend's part) */
};

#define TIER_OPTS_DEFAULT {4, 96, 0.7f, 2.0f, 1.5f, false}

/* One move: (layer, expert) into slot, evicting victim (CACHE_NONE: the slot was free). */
struct tier_move {
    uint32_t layer, expert, slot;
    int32_t victim; /* l * n_expert + e of the expert evicted, or CACHE_NONE */
};

struct tier;

int tier_init(uint32_t n_layer, uint32_t n_expert, const struct tier_opts *o, struct tier **out);
void tier_fini(struct tier *t);

/* tier_count adds n routed entries of (layer, expert) to this window's counts. */
void tier_count(struct tier *t, uint32_t layer, uint32_t expert, float n);

/* tier_window ends a window; returns true when a round is due (every `every` windows). */
bool tier_window(struct tier *t);

/* tier_round decays the counts and picks up to max moves against c's working table, filling
 * moves; returns their count. Does not change c. It is tier_decay then tier_pick. */
uint32_t tier_round(struct tier *t, const struct cache *c, struct tier_move *moves, uint32_t max);

/* tier_decay decays the counts and takes the snapshot tier_pick reads, on the decode thread;
 * tier_pick may then run on another thread while windows go on counting (it reads only the
 * snapshot and c's working table, which must not change until it returns). */
void tier_decay(struct tier *t);
uint32_t tier_pick(struct tier *t, const struct cache *c, struct tier_move *moves, uint32_t max);

/* tier_snapshot: the counts as of the last decay (n_layer * n_expert), for the arena's decayed
 * profile. Valid until the next tier_decay. */
const float *tier_snapshot(const struct tier *t);

/* tier_counts: the live counts (n_layer * n_expert), decayed and added to since; decode thread,
 * e.g. to pick the least-used slot a KV grow takes (cache_lend). */
const float *tier_counts(const struct tier *t);

/* tier_count_of: the decayed count of (layer, expert), for tests and status. */
float tier_count_of(const struct tier *t, uint32_t layer, uint32_t expert);

#endif
