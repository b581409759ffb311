/* The POSIX side of the shm interface: segments are files of a tmpfs (or any directory). */
#include "common/arena/shm.h"
#include "common/base/err.h"
#include "common/base/own.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

unsigned shm_uid(void)
{
    return (unsigned)getuid();
}

static const char *dir_or_default(const char *dir)
{
    return dir && *dir ? dir : SHM_DEFAULT_DIR;
}

static int map_fd(int fd, uint64_t size, bool writable, struct shm_seg *out)
{
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    void *m = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return strata_errf(strata_errno(errno), "mmap of %llu bytes: %s", (unsigned long long)size,
                           strerror(errno));
    *out = (struct shm_seg)SHM_SEG_INIT;
    out->h = fd;
    out->map = m;
    out->size = size;
    out->writable = writable;
    return 0;
}

int shm_free_bytes(const char *dir, uint64_t *out)
{
    struct statvfs sv;
    if (statvfs(dir_or_default(dir), &sv) != 0)
        return strata_errf(strata_errno(errno), "statvfs %s: %s", dir_or_default(dir),
                           strerror(errno));
    *out = (uint64_t)sv.f_bavail * sv.f_frsize;
    return 0;
}

/* create_file creates segname in dir exclusively (mode 0600); path receives its path. */
static int create_file(const char *dir, const char *segname, char *path, size_t n, int *fd)
{
    int rv;
    if ((rv = shm_path(path, n, dir, segname)) != 0) return rv;
    return own_open(path, O_RDWR | O_CREAT | O_EXCL, 0600, false, fd);
}

/* no_space says that dir cannot hold a segment of size bytes, of which allocated are in place. */
static int no_space(const char *dir, uint64_t size, uint64_t allocated)
{
    uint64_t avail = 0;
    char need[SHM_SIZE_STR], have[SHM_SIZE_STR], done[SHM_SIZE_STR];
    shm_free_bytes(dir, &avail);
    if (allocated == 0)
        return strata_errf(
            STRATA_ENOSPC, "arena needs %s, %s has %s free: mount a larger tmpfs or pass --shm-dir",
            shm_size_str(size, need), dir_or_default(dir), shm_size_str(avail, have));
    return strata_errf(STRATA_ENOSPC,
                       "arena needs %s, %s has %s free after %s of it were allocated (something "
                       "else filled %s during the build): free space there, mount a larger tmpfs "
                       "or pass --shm-dir",
                       shm_size_str(size, need), dir_or_default(dir), shm_size_str(avail, have),
                       shm_size_str(allocated, done), dir_or_default(dir));
}

int shm_create(const char *dir, const char *segname, uint64_t size, struct shm_seg *out)
{
    *out = (struct shm_seg)SHM_SEG_INIT;
    char path[4096];
    int rv, fd = -1;
    if ((rv = create_file(dir, segname, path, sizeof path, &fd)) != 0) return rv;
    rv = posix_fallocate(fd, 0, (off_t)size);
    if (rv == EOPNOTSUPP || rv == EINVAL) {
        /* Some file systems have no fallocate; ftruncate is then the only way to size the file and
         * the free-space check done before building is what protects against SIGBUS. */
        rv = ftruncate(fd, (off_t)size) == 0 ? 0 : errno;
    }
    if (rv == ENOSPC || rv == EFBIG) {
        rv = no_space(dir, size, 0);
        goto fail;
    }
    if (rv != 0) {
        rv = strata_errf(strata_errno(rv), "allocate %llu bytes for %s: %s",
                         (unsigned long long)size, path, strerror(rv));
        goto fail;
    }
    if ((rv = map_fd(fd, size, true, out)) != 0) goto fail;
    return 0;
fail:
    close(fd);
    unlink(path);
    return rv;
}

int shm_create_sparse(const char *dir, const char *segname, uint64_t size, struct shm_seg *out)
{
    *out = (struct shm_seg)SHM_SEG_INIT;
    char path[4096];
    int rv, fd = -1;
    if ((rv = create_file(dir, segname, path, sizeof path, &fd)) != 0) return rv;
    if (ftruncate(fd, (off_t)size) != 0) {
        rv = errno == EFBIG ? no_space(dir, size, 0)
                            : strata_errf(strata_errno(errno), "size %s to %llu bytes: %s", path,
                                          (unsigned long long)size, strerror(errno));
        goto fail;
    }
    if ((rv = map_fd(fd, size, true, out)) != 0) goto fail;
    return 0;
fail:
    close(fd);
    unlink(path);
    return rv;
}

int shm_reserve(const char *dir, const struct shm_seg *s, uint64_t off, uint64_t len)
{
    /* fallocate(2) rather than posix_fallocate: where the file system has no fallocate, glibc
     * emulates it by writing a byte per block, which could overwrite data another thread has
     * just written to a neighbouring range. */
    while (fallocate((int)s->h, 0, (off_t)off, (off_t)len) != 0) {
        if (errno == EINTR) continue;
        if (errno == EOPNOTSUPP) return 0;
        if (errno == ENOSPC || errno == EFBIG) {
            struct stat st;
            uint64_t have = fstat((int)s->h, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
            return no_space(dir, s->size, have);
        }
        return strata_errf(
            strata_errno(errno), "allocate %llu bytes at offset %llu of a segment in %s: %s",
            (unsigned long long)len, (unsigned long long)off, dir_or_default(dir), strerror(errno));
    }
    return 0;
}

int shm_open_seg(const char *dir, const char *segname, bool writable, bool group_write,
                 struct shm_seg *out)
{
    *out = (struct shm_seg)SHM_SEG_INIT;
    char path[4096];
    int rv, fd;
    if ((rv = shm_path(path, sizeof path, dir, segname)) != 0) return rv;
    if ((rv = own_open(path, writable ? O_RDWR : O_RDONLY, 0, group_write, &fd)) != 0) {
        if (rv == STRATA_ENOENT) return strata_errf(STRATA_ENOENT, "no segment %s", path);
        return rv;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rv = strata_errf(strata_errno(errno), "fstat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (st.st_size <= 0) {
        rv = strata_errf(STRATA_EFORMAT, "segment %s is empty", path);
        goto fail;
    }
    if ((rv = map_fd(fd, (uint64_t)st.st_size, writable, out)) != 0) goto fail;
    return 0;
fail:
    close(fd);
    return rv;
}

void shm_close(struct shm_seg *s)
{
    if (s->map) munmap(s->map, s->size);
    if (s->h != SHM_NONE) close((int)s->h);
    *s = (struct shm_seg)SHM_SEG_INIT;
}

int shm_lock(intptr_t h, bool exclusive, bool wait)
{
    int op = (exclusive ? LOCK_EX : LOCK_SH) | (wait ? 0 : LOCK_NB);
    while (flock((int)h, op) != 0) {
        if (errno == EINTR) continue;
        if (errno == EWOULDBLOCK) return STRATA_EBUSY;
        return strata_errf(strata_errno(errno), "flock: %s", strerror(errno));
    }
    return 0;
}

int shm_lock_seg(const char *dir, const char *segname, struct shm_seg *s, bool exclusive, bool wait)
{
    (void)dir;
    (void)segname;
    return shm_lock(s->h, exclusive, wait);
}

bool shm_removed(const struct shm_seg *s)
{
    struct stat st;
    return s->h != SHM_NONE && fstat((int)s->h, &st) == 0 && st.st_nlink == 0;
}

int shm_publish(const char *dir, struct shm_seg *s, const char *tmpname, const char *segname,
                unsigned mode)
{
    char from[4096], to[4096];
    int rv;
    if ((rv = shm_path(from, sizeof from, dir, tmpname)) != 0) return rv;
    if ((rv = shm_path(to, sizeof to, dir, segname)) != 0) return rv;
    if (fchmod((int)s->h, (mode_t)mode) != 0)
        return strata_errf(strata_errno(errno), "chmod %s: %s", from, strerror(errno));
    if (rename(from, to) != 0)
        return strata_errf(strata_errno(errno), "rename %s to %s: %s", from, to, strerror(errno));
    return 0;
}

int shm_remove(const char *dir, const char *segname)
{
    char path[4096];
    int rv;
    if ((rv = shm_path(path, sizeof path, dir, segname)) != 0) return rv;
    if (unlink(path) != 0 && errno != ENOENT)
        return strata_errf(strata_errno(errno), "remove %s: %s", path, strerror(errno));
    return 0;
}
