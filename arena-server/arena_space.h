/* arena_space — can this machine hold an arena, and will the system keep it?
 *
 * Before building, the arena's size is compared with the free space of the shm directory,
 * MemAvailable (a tmpfs lives in RAM) and the cgroup's memory.max (shmem pages are charged to the
 * cgroup that touches them), and the build is refused with a message that says how much is needed
 * and how to get it. systemd-logind's RemoveIPC (default yes) deletes a non-system user's POSIX shm
 * at logout: arena_space_removeipc() explains what to do. Reads /proc and /sys only; any thread.
 */
#ifndef STRATA_ARENA_SPACE_H
#define STRATA_ARENA_SPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct arena_space {
    uint64_t shm_free;      /* bytes an unprivileged writer may allocate in the shm directory */
    uint64_t mem_available; /* MemAvailable; UINT64_MAX when unknown */
    uint64_t cgroup_free; /* memory.max - memory.current of our cgroup; UINT64_MAX when unlimited */
    bool hugetlb;         /* the shm directory is a hugetlbfs (its pages are reserved apart) */
};

/* arena_space_read fills *out for shm_dir (NULL: /dev/shm). Errno codes when statfs fails. */
int arena_space_read(const char *shm_dir, struct arena_space *out);

/* arena_space_check returns 0 when need bytes fit, else STRATA_ENOSPC with a detail such as
 * "arena needs 17.3 GiB, /dev/shm has 8.0 GiB free: mount a larger tmpfs or pass --shm-dir". */
int arena_space_check(const char *shm_dir, uint64_t need, const struct arena_space *sp);

/* arena_space_removeipc writes into buf (empty when there is nothing to fear) a warning that
 * systemd will remove this user's segments in shm_dir at logout, and how to prevent it. */
void arena_space_removeipc(const char *shm_dir, char *buf, size_t n);

#endif
