/* own — files the project opens in directories other users can write (/dev/shm, a shared
 * --shm-dir, /tmp, a log or runtime directory): opened without following a symlink and refused
 * unless the serving user owns them.
 *
 * A sticky shared directory lets any local user create a name before we do, or plant a symlink
 * under it that makes us truncate its target. So every such open is O_NOFOLLOW, creation is
 * O_EXCL where the name is ours alone, and a file we did not create is accepted only after an
 * fstat of the open descriptor (not a stat of the path, which could be swapped) shows a regular
 * file owned by our effective uid that nobody else may write (the group may, where the caller
 * allows it: the state segment under --group). Pure functions, any thread.
 */
#ifndef STRATA_OWN_H
#define STRATA_OWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* own_check accepts fd (an open file, named path in messages) when it is a regular file owned by
 * geteuid() whose mode grants write to nobody else, group write excepted when group_write.
 * STRATA_EPERM otherwise, the detail naming the file, its owner (uid and account) or mode, and
 * what to do; errno codes when fstat fails. */
int own_check(int fd, const char *path, bool group_write);

/* own_open opens path with flags | O_NOFOLLOW | O_CLOEXEC (mode for O_CREAT) and own_checks it;
 * *fd is the descriptor on success and -1 otherwise. A symlink at path is STRATA_EPERM (detail:
 * the link and what to do), a missing file without O_CREAT STRATA_ENOENT; the file is closed on a
 * refusal. Never blocks on what it opens: a FIFO planted under the name is opened O_NONBLOCK and
 * refused (the flag is cleared again on an accepted file unless flags asked for it). */
int own_open(const char *path, int flags, mode_t mode, bool group_write, int *fd);

/* own_read_key reads a secret (an API key) from path into buf[cap]: its first line, without the
 * line end. The file must pass own_open and be readable by nobody else (a key that other users
 * can read is no secret): STRATA_EPERM naming the mode and the chmod that fixes it; STRATA_EFORMAT
 * when the line is empty, STRATA_ELIMIT when it does not fit buf. */
int own_read_key(const char *path, char *buf, size_t cap);

#endif
