/* shm — the narrow shared-memory interface strata uses: name, create, open, map, lock, publish.
 *
 * A segment is a file in a shared-memory directory (/dev/shm, or any tmpfs or hugetlbfs given by
 * path with --shm-dir); on Linux that is exactly what shm_open() does, and taking a directory lets
 * one code path serve both. Names are `strata-<uid>-<name>[suffix]`, so two users never collide.
 * Creation preallocates every byte (posix_fallocate) because an ftruncate past the free space of a
 * tmpfs succeeds and then SIGBUSes on first touch; a large segment may instead be created sparse
 * and allocated range by range (shm_reserve) just before each range is written, so that the
 * allocation overlaps the writing. Readers open O_RDONLY and map PROT_READ.
 * Every open refuses a symlink and, after opening, a file that is not ours (common/base/own.h):
 * another local user can create any name in /dev/shm, including ours, before we do.
 * Everything platform-specific lives here so that a Windows file-mapping shim could replace it.
 * A struct shm_seg belongs to one thread at a time; the mapping itself may be read by any thread.
 */
#ifndef STRATA_SHM_H
#define STRATA_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SHM_DEFAULT_DIR "/dev/shm"
#define SHM_NAME_MAX    200 /* longest user-given arena name */

struct shm_seg {
    int fd;        /* -1 when closed */
    uint8_t *map;  /* whole segment, NULL when not mapped */
    uint64_t size; /* bytes mapped (the file size at open) */
    bool writable; /* mapped PROT_READ|PROT_WRITE */
};

/* shm_check_name accepts a user-given arena name: 1..SHM_NAME_MAX characters of [A-Za-z0-9._-],
 * not starting with '.'. STRATA_EINVAL (detail says why) otherwise. */
int shm_check_name(const char *name);

/* shm_name writes "strata-<uid>-<name><suffix>" (suffix may be "") to buf. STRATA_EINVAL for a bad
 * name, STRATA_EOVERFLOW when buf is too small. */
int shm_name(char *buf, size_t n, const char *name, const char *suffix);

/* shm_path writes "<dir>/<segname>" (dir NULL: SHM_DEFAULT_DIR). STRATA_EOVERFLOW when too long. */
int shm_path(char *buf, size_t n, const char *dir, const char *segname);

/* shm_create creates segname in dir exclusively (mode 0600, O_NOFOLLOW), preallocates size bytes
 * and maps them read-write. STRATA_EEXIST when it exists, STRATA_EPERM when a symlink is there;
 * STRATA_ENOSPC when the directory cannot hold size bytes (detail: how much is needed and free, and
 * what to do); errno codes otherwise. Nothing is left behind on failure. */
int shm_create(const char *dir, const char *segname, uint64_t size, struct shm_seg *out);

/* shm_create_sparse is shm_create without the preallocation: the file has its size but no pages.
 * The caller must shm_reserve every byte before touching it (a touch of an unreserved page of a
 * full tmpfs is a SIGBUS) and before publishing (readers may touch any page). Nothing is left
 * behind on failure. */
int shm_create_sparse(const char *dir, const char *segname, uint64_t size, struct shm_seg *out);

/* shm_reserve allocates bytes [off, off + len) of s, a segment of dir made by shm_create_sparse.
 * Ranges may overlap; any thread may call it, also while others write reserved ranges. Returns
 * STRATA_ENOSPC when dir cannot hold them (detail: the segment's size, how much of it was
 * allocated, what dir has free, what to do); errno codes otherwise. On a file system without
 * fallocate it does nothing: the free-space check made before building is then the only guard. */
int shm_reserve(const char *dir, const struct shm_seg *s, uint64_t off, uint64_t len);

/* shm_open_seg opens and maps an existing segment, read-only unless writable. The segment must be a
 * regular file (not a symlink) owned by our effective uid that nobody else may write, the group
 * excepted when group_write: STRATA_EPERM otherwise, the detail naming the file and its owner.
 * STRATA_ENOENT when it does not exist, STRATA_EFORMAT when it is empty. */
int shm_open_seg(const char *dir, const char *segname, bool writable, bool group_write,
                 struct shm_seg *out);

/* shm_close unmaps and closes (which drops any flock this fd held). Safe on a closed segment. */
void shm_close(struct shm_seg *s);

/* shm_lock takes flock on fd: exclusive or shared; blocking only when wait. STRATA_EBUSY when
 * another open file holds a conflicting lock and !wait. */
int shm_lock(int fd, bool exclusive, bool wait);

/* shm_publish makes a built segment visible under its final name: fchmod(mode), then rename
 * tmpname -> segname in dir (atomic: a reader sees the old name or the complete new segment). */
int shm_publish(const char *dir, struct shm_seg *s, const char *tmpname, const char *segname,
                mode_t mode);

/* shm_remove unlinks segname in dir; a missing segment is not an error. Mappings stay valid. */
int shm_remove(const char *dir, const char *segname);

/* shm_size_str writes n bytes for a person: "%.1f GiB" from 1 GiB up, "%.1f MiB" below (a full
 * tmpfs must not read "has 0.0 GiB free"); returns buf. */
#define SHM_SIZE_STR 32
const char *shm_size_str(uint64_t n, char buf[SHM_SIZE_STR]);

/* shm_free_bytes sets *out to the bytes an unprivileged writer may still allocate in dir. */
int shm_free_bytes(const char *dir, uint64_t *out);

#endif
