/* arena_profile — the heat profile on disk: routed-token counts per (layer, expert).
 *
 * Kept at $XDG_STATE_HOME/strata/<fingerprint>.profile (~/.local/state without XDG_STATE_HOME) or
 * at a path given with --profile, so a restarted arena (and through it every worker) knows which
 * experts are hot. The file is versioned and checksummed: magic "STRAHEAT", version, n_layers,
 * n_expert, fingerprint, the counts, then XXH3_64bits of everything before. It is written to a
 * temporary file and renamed, so a crash never leaves half a profile. Called by the arena-server's
 * main thread only.
 */
#ifndef STRATA_ARENA_PROFILE_H
#define STRATA_ARENA_PROFILE_H

#include "common/arena/arena.h"

#include <stddef.h>
#include <stdint.h>

#define ARENA_PROFILE_VERSION 1

/* arena_profile_path writes the default profile path for fingerprint fp into buf and creates its
 * directory. STRATA_EOVERFLOW, or errno codes when the directory cannot be made. */
int arena_profile_path(uint64_t fp, char *buf, size_t n);

/* arena_profile_save writes st's heat counters to path (atomically, via rename). */
int arena_profile_save(const char *path, const struct arena_state *st);

/* arena_profile_load adds the counts stored at path to st's heat counters. STRATA_ENOENT when there
 * is no profile; STRATA_EFORMAT for a bad checksum, version or a shape other than st's (the detail
 * says which); the counters are untouched on any error. A profile of another fingerprint but the
 * same shape is loaded (the model file was copied or touched) and *other_fp tells so. */
int arena_profile_load(const char *path, struct arena_state *st, bool *other_fp);

#endif
