/* testutil — helpers shared by the Check tests.
 *
 * Golden data made by other implementations (ggml's quant vectors, Jinja2's renderings, reference
 * tokenizations) is optional: tests that need it call test_data_path(), which returns NULL and
 * prints why when it is absent, so the test skips with a message instead of failing. It is looked
 * for in STRATA_SHARED_DATA, else in shared/data beside the checkout.
 */
#ifndef STRATA_TESTUTIL_H
#define STRATA_TESTUTIL_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* test_data_path returns "<data>/<rel>" in a static buffer if it exists, else NULL after printing
 * a SKIP line that says how to provide it. */
const char *test_data_path(const char *rel);

/* test_tmpdir returns a fresh directory for this process (created once), inside the binary's root
 * directory (below), so it goes when the binary exits. */
const char *test_tmpdir(void);

/* test_run runs suite s (CK_FORK as Check defaults) and returns the exit status for main.
 *
 * The first of test_run and test_tmpdir makes the binary's root directory
 * $TMPDIR/strata-test-XXXXXX and points TMPDIR, XDG_STATE_HOME, XDG_RUNTIME_DIR, XDG_CACHE_HOME,
 * XDG_CONFIG_HOME and XDG_DATA_HOME into it, so the tests and every process they start (heat
 * profiles, sockets, logs) write nowhere else. At exit the root is removed whole, files of a test
 * killed by its timeout included; when a test failed (or STRATA_TEST_KEEP is set) it is kept and
 * its path printed. */
int test_run(Suite *s);

/* test_run_threads is test_run without the fork per test, for a suite whose unchecked fixture
 * starts threads (a server in the test process). A child forked while one of those threads is half
 * way through building something holds that memory with no thread left to own it, which
 * LeakSanitizer reports at the child's exit, and a lock that thread held stays held in the child. */
int test_run_threads(Suite *s);

/* test_arena_build plans and builds the arena of GGUF file f (read from path) in dir (made 0700)
 * as segment name, published ready, and opens it into *a; a failure fails the test. */
struct gguf_file;
struct arena;
void test_arena_build(struct gguf_file *f, const char *path, const char *dir, const char *name,
                      struct arena **a);

/* test_slowdown is how much slower than an idle machine this run may be: STRATA_TEST_SLOWDOWN
 * (scripts/test.sh sets it, larger under sanitizers), at least 1, default 1. Tests that compare
 * times with a bound scale the bound (or the work they time against) by it; it never loosens what
 * a check means. */
double test_slowdown(void);

/* test_matrix_short: whether STRATA_TEST_MATRIX=short asks for a suite's representative cases
 * only (scripts/test.sh sets it for the sanitizer stage, where a suite's repeats of one code path
 * over more architectures cost minutes and find nothing new; scripts/check-full runs the whole
 * matrix under the sanitizers too). A suite that honours it prints which cases it left out. */
bool test_matrix_short(const char *suite, const char *left_out);

/* test_read_file reads a whole file into a malloc'd buffer (NUL-terminated); NULL on error. */
char *test_read_file(const char *path, size_t *len);

/* A seeded xorshift64 stream for deterministic test inputs (one state per test file; the state
 * must be nonzero). test_unif: uniform in [0, 1) with 53 bits; test_gauss: standard normal, Box-Muller
 * of two test_unif draws taken in order. */
struct test_rng {
    uint64_t s;
};
double test_unif(struct test_rng *r);
float test_gauss(struct test_rng *r);

/* test_free_ports finds n consecutive TCP ports free on 127.0.0.1 and returns the first (a failed
 * test when none is found). They are taken below the kernel's ephemeral range
 * (net.ipv4.ip_local_port_range), where no other test's outgoing connection can be handed one of
 * them between this check and the server's listen; the choice is spread by pid, so tests running
 * side by side try different ports. */
int test_free_ports(int n);

/* test_wait_exit waits up to `seconds` for child pid to exit: true, with its wait status in
 * *status. false when it is still running then: it is killed (SIGKILL) and reaped first. */
bool test_wait_exit(pid_t pid, double seconds, int *status);

/* test_other_uid is a uid (and gid of the same number) that no account uses: "another local user"
 * for the hardening tests, which never create accounts. */
unsigned test_other_uid(void);

/* test_as_other_user runs fn(ctx) in a forked child that switched to test_other_uid() with
 * setresgid, setgroups and setresuid, and returns fn's return (0: it did what it meant to). It needs
 * root (CI runs as root): otherwise it prints "SKIP <what>: ..." and returns -1 without forking. */
int test_as_other_user(const char *what, int (*fn)(void *ctx), void *ctx);

#endif
