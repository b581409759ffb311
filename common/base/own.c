#include "common/base/own.h"
#include "common/base/err.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* account writes "uid N (name)" or "uid N (no account)" to buf. */
static const char *account(uid_t uid, char *buf, size_t n)
{
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res)
        snprintf(buf, n, "uid %u (%s)", (unsigned)uid, res->pw_name);
    else
        snprintf(buf, n, "uid %u (no account)", (unsigned)uid);
    return buf;
}

int own_check(int fd, const char *path, bool group_write)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return strata_errf(strata_errno(errno), "fstat %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return strata_errf(STRATA_EPERM,
                           "%s is not a regular file (mode %06o): something else made it; remove "
                           "it or pick another name or directory",
                           path, (unsigned)st.st_mode);
    char who[128], me[128];
    if (st.st_uid != geteuid())
        return strata_errf(STRATA_EPERM,
                           "%s is owned by %s, not by %s that runs this: another user made it, "
                           "and using it would let them change what is served; remove it (as "
                           "root or that user) or pick another --name or directory",
                           path, account(st.st_uid, who, sizeof who),
                           account(geteuid(), me, sizeof me));
    mode_t bad = S_IWOTH | (group_write ? 0 : S_IWGRP);
    if (st.st_mode & bad)
        return strata_errf(STRATA_EPERM,
                           "%s has mode %03o: %s may write it; strata makes it %s, so something "
                           "changed it: remove it and start again",
                           path, (unsigned)(st.st_mode & 0777),
                           st.st_mode & S_IWOTH ? "every user" : "its group",
                           group_write ? "0660 at most" : "0600 or stricter");
    return 0;
}

int own_open(const char *path, int flags, mode_t mode, bool group_write, int *fd)
{
    /* O_NONBLOCK until the check: a FIFO planted under the name would block a plain open */
    *fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);
    if (*fd < 0) {
        int e = errno;
        struct stat st;
        if (e == ELOOP || (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)))
            return strata_errf(STRATA_EPERM,
                               "%s is a symbolic link: strata never follows one where other "
                               "users can write; remove it and start again",
                               path);
        if (e == EACCES && lstat(path, &st) == 0 && st.st_uid != geteuid()) {
            /* fs.protected_regular refuses O_CREAT on another user's file in a sticky directory */
            char who[128];
            return strata_errf(STRATA_EPERM,
                               "%s is owned by %s: another user made it; remove it (as root or "
                               "that user) or pick another --name or directory",
                               path, account(st.st_uid, who, sizeof who));
        }
        if (e == ENOENT) return strata_errf(STRATA_ENOENT, "no file %s", path);
        if (e == EEXIST) return strata_errf(STRATA_EEXIST, "%s exists", path);
        return strata_errf(strata_errno(e), "open %s: %s", path, strerror(e));
    }
    int rv = own_check(*fd, path, group_write);
    if (rv == 0 && !(flags & O_NONBLOCK) && fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK))
        rv = strata_errf(strata_errno(errno), "fcntl %s: %s", path, strerror(errno));
    if (rv != 0) {
        close(*fd);
        *fd = -1;
    }
    return rv;
}

int own_read_key(const char *path, char *buf, size_t cap)
{
    int fd, rv;
    struct stat st;
    if ((rv = own_open(path, O_RDONLY, 0, false, &fd)) != 0) return rv;
    if (fstat(fd, &st) == 0 && (st.st_mode & (S_IRGRP | S_IROTH))) {
        close(fd);
        return strata_errf(STRATA_EPERM,
                           "key file %s has mode %03o: other users can read the key; run `chmod "
                           "600 %s`",
                           path, (unsigned)(st.st_mode & 0777), path);
    }
    ssize_t n = read(fd, buf, cap);
    int e = errno;
    close(fd);
    if (n < 0) return strata_errf(strata_errno(e), "read key file %s: %s", path, strerror(e));
    size_t len = 0;
    while (len < (size_t)n && buf[len] != '\n' && buf[len] != '\r')
        len++;
    if (len == (size_t)n && len == cap)
        return strata_errf(STRATA_ELIMIT, "key file %s: the key is longer than %zu bytes", path,
                           cap - 1);
    buf[len] = '\0';
    if (len == 0) return strata_errf(STRATA_EFORMAT, "key file %s: its first line is empty", path);
    return 0;
}
