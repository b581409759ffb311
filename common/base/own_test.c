/* own_test — files in shared directories: another local user (a child switched to an unused uid;
 * needs root, as CI runs) plants a file, a symlink or a FIFO under our name, and own_open refuses
 * each without blocking, naming the file and its owner, and leaves the symlink's target
 * untouched. */
#include "common/base/own.h"
#include "common/base/err.h"
#include "tests/testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_shared[600]; /* a sticky directory every user may write, as /dev/shm is */

static void shared_dir(const char *tag)
{
    chmod(test_tmpdir(), 0711); /* the other user must reach g_shared */
    snprintf(g_shared, sizeof g_shared, "%s/%s", test_tmpdir(), tag);
    ck_assert_int_eq(mkdir(g_shared, 0700), 0);
    ck_assert_int_eq(chmod(g_shared, 01777), 0);
}

static int plant_file(void *ctx)
{
    int fd = open(ctx, O_WRONLY | O_CREAT | O_EXCL, 0644);
    return fd >= 0 && write(fd, "planted", 7) == 7 && close(fd) == 0 ? 0 : 1;
}

struct link_to {
    const char *target, *link;
};

static int plant_link(void *ctx)
{
    const struct link_to *l = ctx;
    return symlink(l->target, l->link) == 0 ? 0 : 1;
}

START_TEST(file_of_another_user_refused)
{
    shared_dir("file");
    char path[700], want[64];
    snprintf(path, sizeof path, "%s/strata-0-m.lock", g_shared);
    int rv = test_as_other_user("file_of_another_user_refused", plant_file, path);
    if (rv < 0) return;
    ck_assert_int_eq(rv, 0);
    int fd = 99;
    rv = own_open(path, O_RDWR | O_CREAT, 0600, false, &fd);
    ck_assert_int_eq(rv, STRATA_EPERM);
    ck_assert_int_eq(fd, -1);
    snprintf(want, sizeof want, "is owned by uid %u (no account)", test_other_uid());
    ck_assert_msg(strstr(strata_errdetail(), path) && strstr(strata_errdetail(), want),
                  "detail: %s", strata_errdetail());
    /* group write is no excuse for a file that is not ours */
    ck_assert_int_eq(own_open(path, O_RDONLY, 0, true, &fd), STRATA_EPERM);
}
END_TEST

START_TEST(symlink_not_followed)
{
    shared_dir("link");
    char target[700], link[700];
    snprintf(target, sizeof target, "%s/precious", test_tmpdir());
    snprintf(link, sizeof link, "%s/strata-0-m.lock", g_shared);
    FILE *f = fopen(target, "w");
    ck_assert_ptr_nonnull(f);
    fputs("keep me", f);
    fclose(f);
    struct link_to l = {target, link};
    int rv = test_as_other_user("symlink_not_followed", plant_link, &l);
    if (rv < 0) return;
    ck_assert_int_eq(rv, 0);
    int fd;
    ck_assert_int_eq(own_open(link, O_RDWR | O_CREAT, 0600, false, &fd), STRATA_EPERM);
    ck_assert_msg(strstr(strata_errdetail(), "symbolic link"), "%s", strata_errdetail());
    ck_assert_int_eq(own_open(link, O_RDWR | O_CREAT | O_EXCL, 0600, false, &fd), STRATA_EPERM);
    ck_assert_msg(strstr(strata_errdetail(), "symbolic link"), "%s", strata_errdetail());
    char *kept = test_read_file(target, NULL);
    ck_assert_str_eq(kept, "keep me");
    free(kept);
}
END_TEST

static int plant_fifo(void *ctx)
{
    return mkfifo(ctx, 0666) == 0 ? 0 : 1;
}

/* A FIFO under our name would block a plain open for read: refused at once instead. */
START_TEST(fifo_refused_without_blocking)
{
    shared_dir("fifo");
    char path[700];
    snprintf(path, sizeof path, "%s/strata-0-m", g_shared);
    int rv = test_as_other_user("fifo_refused_without_blocking", plant_fifo, path);
    if (rv < 0) return;
    ck_assert_int_eq(rv, 0);
    int fd;
    ck_assert_int_eq(own_open(path, O_RDONLY, 0, false, &fd), STRATA_EPERM);
    ck_assert_msg(strstr(strata_errdetail(), "not a regular file"), "%s", strata_errdetail());
}
END_TEST

START_TEST(ours_checked_for_mode)
{
    char path[700];
    snprintf(path, sizeof path, "%s/mode", test_tmpdir());
    int fd;
    ck_assert_int_eq(own_open(path, O_RDWR | O_CREAT | O_EXCL, 0600, false, &fd), 0);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(chmod(path, 0660), 0);
    ck_assert_int_eq(own_open(path, O_RDONLY, 0, false, &fd), STRATA_EPERM);
    ck_assert_msg(strstr(strata_errdetail(), "mode 660") && strstr(strata_errdetail(), "its group"),
                  "%s", strata_errdetail());
    ck_assert_int_eq(own_open(path, O_RDONLY, 0, true, &fd), 0); /* --group's state segment */
    close(fd);
    ck_assert_int_eq(chmod(path, 0602), 0);
    ck_assert_int_eq(own_open(path, O_RDONLY, 0, true, &fd), STRATA_EPERM);
    ck_assert_msg(strstr(strata_errdetail(), "every user"), "%s", strata_errdetail());
    ck_assert_int_eq(own_open(path, O_RDWR | O_CREAT | O_EXCL, 0600, false, &fd), STRATA_EEXIST);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(own_open(path, O_RDONLY, 0, false, &fd), STRATA_ENOENT);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("own");
    TCase *tc = tcase_create("own");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, file_of_another_user_refused);
    tcase_add_test(tc, symlink_not_followed);
    tcase_add_test(tc, fifo_refused_without_blocking);
    tcase_add_test(tc, ours_checked_for_mode);
    suite_add_tcase(s, tc);
    return test_run(s);
}
