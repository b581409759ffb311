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
 * This interface is the one seam between the arena and the operating system: shm.c holds what
 * every platform shares (names, sizes for people), shm_posix.c the POSIX calls, shm_win32.c the
 * Windows ones (named file mappings; docs/windows.md says how each call maps).
 * A struct shm_seg belongs to one thread at a time; the mapping itself may be read by any thread.
 */
#ifndef STRATA_SHM_H
#define STRATA_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHM_DEFAULT_DIR "/dev/shm"     /* POSIX; on Windows no directory means the paging file */
#define SHM_NAME_MAX    200            /* longest user-given arena name */
#define SHM_NONE        ((intptr_t)-1) /* a closed handle (also Windows' INVALID_HANDLE_VALUE) */

struct shm_seg {
    intptr_t h; /* POSIX: the file descriptor; Windows: the file-mapping handle. SHM_NONE: closed */
    intptr_t
        file; /* Windows: the backing file of a segment in a directory (SHM_NONE: paging file) */
    intptr_t link; /* Windows: the published name of a paging-file segment (see shm_publish) */
    intptr_t lock; /* Windows: the named mutex shm_lock_seg took for a paging-file segment */
    uint8_t *map;  /* whole segment, NULL when not mapped */
    uint64_t size; /* bytes mapped (the file size at open) */
    bool writable; /* mapped for writing */
};

#define SHM_SEG_INIT                                                                               \
    {                                                                                              \
        .h = SHM_NONE, .file = SHM_NONE, .link = SHM_NONE, .lock = SHM_NONE                        \
    }

static inline bool shm_is_open(const struct shm_seg *s)
{
    return s->h != SHM_NONE;
}

/* shm_uid is the number that keeps two users' names apart: the uid on POSIX, the last
 * sub-authority (RID) of the user's SID on Windows. */
unsigned shm_uid(void);

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

/* shm_close unmaps and closes (which drops any lock this segment held). Safe on a closed one. */
void shm_close(struct shm_seg *s);

/* shm_lock locks the whole of an open file h (a descriptor on POSIX, a HANDLE on Windows):
 * exclusive or shared; blocking only when wait (flock / LockFileEx). STRATA_EBUSY when another
 * open file holds a conflicting lock and !wait. */
int shm_lock(intptr_t h, bool exclusive, bool wait);

/* shm_lock_seg locks segment s, named segname in dir, until it is closed: shm_lock on its file;
 * on Windows a paging-file segment has no file, and a named mutex takes its place (exclusive
 * only: a shared request is STRATA_EUNSUPPORTED). */
int shm_lock_seg(const char *dir, const char *segname, struct shm_seg *s, bool exclusive,
                 bool wait);

/* shm_publish makes a built segment visible under its final name: its permissions become mode
 * (0400, 0440, 0600 or 0660: owner read or read-write, the group too when 0040 is set), then it
 * is renamed tmpname -> segname in dir, atomically: a reader sees the old name or the complete
 * new segment. On Windows a paging-file segment cannot be renamed: its final name is a small
 * link mapping naming it, made once the segment is complete (a segname already taken is
 * STRATA_EEXIST), and both live while this process keeps s open. */
int shm_publish(const char *dir, struct shm_seg *s, const char *tmpname, const char *segname,
                unsigned mode);

/* shm_remove unlinks segname in dir; a missing segment is not an error. Mappings stay valid.
 * A Windows paging-file segment has no name to remove: it ends with its last handle. */
int shm_remove(const char *dir, const char *segname);

/* shm_removed tells whether s no longer has a name (unlinked, or deleted pending its close). */
bool shm_removed(const struct shm_seg *s);

/* shm_size_str writes n bytes for a person: "%.1f GiB" from 1 GiB up, "%.1f MiB" below (a full
 * tmpfs must not read "has 0.0 GiB free"); returns buf. */
#define SHM_SIZE_STR 32
const char *shm_size_str(uint64_t n, char buf[SHM_SIZE_STR]);

/* shm_free_bytes sets *out to the bytes an unprivileged writer may still allocate in dir. */
int shm_free_bytes(const char *dir, uint64_t *out);

#endif
