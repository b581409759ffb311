/* arena_fingerprint — the identity of an arena: which model files, which layout, which alignment.
 *
 * The fingerprint hashes (XXH3_64bits) the layout version, the blob alignment and, for every GGUF
 * split, its size, mtime and inode, plus the bytes of the first split's header, KV pairs and tensor
 * infos. It is cheap to recompute (no tensor data is read), so a restarted arena-server compares it
 * with the stored one to decide whether to adopt an existing arena. Pure; any thread.
 */
#ifndef STRATA_ARENA_FINGERPRINT_H
#define STRATA_ARENA_FINGERPRINT_H

#include <stdint.h>

struct gguf_file;

/* arena_fingerprint returns the fingerprint of model f laid out with blob alignment align. */
uint64_t arena_fingerprint(const struct gguf_file *f, uint64_t align);

/* arena_fingerprint_hex writes fp as 16 lowercase hex digits and a NUL into buf. */
void arena_fingerprint_hex(uint64_t fp, char buf[17]);

#endif
