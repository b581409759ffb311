/* shm_test — the shm interface's cases on the platform it is built for: POSIX in the test suite,
 * Windows when cross-built with mingw-w64 and run under Wine (scripts/wine-test). A plain runner
 * (no Check) so that it cross-builds. Other processes are this program again, started with
 * "child OP DIR SEGNAME": what a second process sees is what these cases are about.
 */
#include "common/arena/shm.h"
#include "common/base/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#include <windows.h>
#include <sddl.h>
#include <wchar.h>
#else
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
extern char **environ;
#endif

static int failures, checks;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, #cond);                             \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, " [%s]\n", strata_errdetail());                                        \
        }                                                                                          \
    } while (0)

/* Exit codes of a child, and what "died" means on each platform. */
enum { CHILD_OK = 0, CHILD_BAD = 1, CHILD_BUSY = 3, CHILD_DENIED = 4, CHILD_DIED = 100 };

/* run_child starts this program as "child op dir seg" and returns its exit code, or CHILD_DIED
 * when it was killed (a signal on POSIX, an exception such as an access violation on Windows). */
static int run_child(const char *op, const char *dir, const char *seg)
{
    const char *d = dir ? dir : "-";
#ifdef _WIN32
    char self[MAX_PATH], cmd[4096];
    GetModuleFileNameA(NULL, self, sizeof self);
    snprintf(cmd, sizeof cmd, "\"%s\" child %s \"%s\" %s", self, op, d, seg);
    STARTUPINFOA si = {.cb = sizeof si};
    PROCESS_INFORMATION pi;
    SetErrorMode(SEM_NOGPFAULTERRORBOX | SEM_FAILCRITICALERRORS);
    if (!CreateProcessA(NULL, cmd, NULL, NULL, FALSE, 0, NULL, NULL, &si, &pi)) return -1;
    WaitForSingleObject(pi.hProcess, INFINITE);
    DWORD code = 0;
    GetExitCodeProcess(pi.hProcess, &code);
    CloseHandle(pi.hThread);
    CloseHandle(pi.hProcess);
    return code >= 0xC0000000u ? CHILD_DIED : (int)code;
#else
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *argv[] = {self, "child", (char *)op, (char *)d, (char *)seg, NULL};
    pid_t pid;
    if (posix_spawn(&pid, self, NULL, NULL, argv, environ) != 0) return -1;
    int st;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFSIGNALED(st) ? CHILD_DIED : WEXITSTATUS(st);
#endif
}

static uint8_t pattern(uint64_t i)
{
    return (uint8_t)(i * 131u + 7u);
}

#define BIG ((5ull << 30) + 12288) /* past 4 GiB, not a multiple of it */

#ifdef _WIN32
static LONG WINAPI died(EXCEPTION_POINTERS *ep)
{
    ExitProcess(ep->ExceptionRecord->ExceptionCode);
}
#endif

/* child runs one case's second process. */
static int child(const char *op, const char *dir, const char *seg)
{
    struct shm_seg s;
    int rv;
    if (strcmp(op, "read") == 0) { /* open read-only, check the pattern */
        if ((rv = shm_open_seg(dir, seg, false, false, &s)) != 0) return CHILD_BAD;
        for (uint64_t i = 0; i < 65536 && i < s.size; i++)
            if (s.map[i] != pattern(i)) return CHILD_BAD;
        shm_close(&s);
        return CHILD_OK;
    }
    if (strcmp(op, "write") == 0) { /* a write to a read-only view must kill us */
        if ((rv = shm_open_seg(dir, seg, false, false, &s)) != 0) return CHILD_BAD;
#ifdef _WIN32
        SetUnhandledExceptionFilter(died); /* no debugger: exit with the exception's code */
#else
        signal(SIGSEGV, SIG_DFL); /* a sanitizer's handler would turn the fault into an exit */
        signal(SIGBUS, SIG_DFL);
#endif
        ((volatile uint8_t *)s.map)[1] = 1;
        return CHILD_OK; /* the write went through: the case fails */
    }
    if (strcmp(op, "openrw") == 0) { /* a writable open of a read-only segment */
        rv = shm_open_seg(dir, seg, true, false, &s);
        if (rv == STRATA_EPERM || rv == (STRATA_ESYSERR | 13)) return CHILD_DENIED;
        if (rv == 0) shm_close(&s);
        return rv == 0 ? CHILD_OK : CHILD_BAD;
    }
    if (strcmp(op, "big") == 0) { /* the far end of a segment past 4 GiB */
        if ((rv = shm_open_seg(dir, seg, false, false, &s)) != 0) return CHILD_BAD;
        bool ok = s.size >= BIG && s.map[BIG - 1] == 0xA5 && s.map[(4ull << 30) + 5] == 0x5A &&
                  s.map[0] == 0x11;
        shm_close(&s);
        return ok ? CHILD_OK : CHILD_BAD;
    }
    if (strcmp(op, "lock") == 0) { /* try the segment's lock without waiting */
        if ((rv = shm_open_seg(dir, seg, false, false, &s)) != 0) return CHILD_BAD;
        rv = shm_lock_seg(dir, seg, &s, true, false);
        shm_close(&s);
        return rv == STRATA_EBUSY ? CHILD_BUSY : rv == 0 ? CHILD_OK : CHILD_BAD;
    }
    return CHILD_BAD;
}

static unsigned long self_id(void)
{
#ifdef _WIN32
    return (unsigned long)GetCurrentProcessId();
#else
    return (unsigned long)getpid();
#endif
}

static bool under_wine(void)
{
#ifdef _WIN32
    return GetProcAddress(GetModuleHandleA("ntdll.dll"), "wine_get_version") != NULL;
#else
    return false;
#endif
}

/* dir_is_unix_checked: whether a file's permissions there are left to Unix, which lets root
 * write a 0400 file (POSIX as root), or to nobody (Wine does not check a file's DACL itself). A
 * paging-file section is checked by Windows (or Wine's server) whoever we are. */
static bool dir_is_unix_checked(const char *dir)
{
#ifdef _WIN32
    return dir && under_wine();
#else
    (void)dir;
    return geteuid() == 0;
#endif
}

/* cases runs every case in dir (NULL: the platform's default, the paging file on Windows). */
static void cases(const char *dir)
{
    char tmp[128], seg[128], big[128], bigtmp[128];
    unsigned long id = self_id();
    snprintf(tmp, sizeof tmp, "strata-%u-shmtest-%lu.tmp", shm_uid(), id);
    snprintf(seg, sizeof seg, "strata-%u-shmtest-%lu", shm_uid(), id);
    snprintf(big, sizeof big, "strata-%u-shmtest-big-%lu", shm_uid(), id);
    snprintf(bigtmp, sizeof bigtmp, "strata-%u-shmtest-big-%lu.tmp", shm_uid(), id);
    printf("-- segments in %s\n", dir ? dir : "the default place");

    /* create, fill, publish read-only; open from a second process */
    struct shm_seg s, t, r;
    const uint64_t size = 256 << 10;
    int rv = shm_create(dir, tmp, size, &s);
    CHECK(rv == 0, "create: %s", strata_strerror(rv));
    if (rv != 0) return;
    CHECK(s.size == size && s.writable && shm_is_open(&s), "created segment");
    for (uint64_t i = 0; i < size; i++)
        s.map[i] = pattern(i);
    rv = shm_create(dir, tmp, size, &t);
    CHECK(rv == STRATA_EEXIST, "a second create of one name: %s", strata_strerror(rv));
    CHECK(!shm_is_open(&t), "a refused create leaves nothing open");
    rv = shm_open_seg(dir, seg, false, false, &t);
    CHECK(rv == STRATA_ENOENT, "open before publish: %s", strata_strerror(rv));
    rv = shm_publish(dir, &s, tmp, seg, 0400);
    CHECK(rv == 0, "publish: %s", strata_strerror(rv));
    CHECK(run_child("read", dir, seg) == CHILD_OK, "a second process reads what was published");
    rv = shm_open_seg(dir, seg, false, false, &r);
    CHECK(rv == 0 && r.size >= size && !r.writable && memcmp(r.map, s.map, size) == 0,
          "open read-only here: %s, size %llu", strata_strerror(rv), (unsigned long long)r.size);

    /* a write through a read-only view is refused by the hardware: the writer dies */
    CHECK(run_child("write", dir, seg) == CHILD_DIED, "a write to a read-only view");
    /* a read-only segment refuses a writable open */
    int c = run_child("openrw", dir, seg);
    if (!dir_is_unix_checked(dir))
        CHECK(c == CHILD_DENIED, "a writable open of a 0400 segment: child said %d", c);
    else
        printf("   (a Unix-checked file, root's or Wine's: a writable open of a 0400 file is "
               "allowed (%s), case not "
               "asserted)\n",
               c == CHILD_DENIED ? "refused even so" : "it was");

    /* the lock: a second holder is refused while the first holds it, then gets it */
    rv = shm_lock_seg(dir, seg, &r, true, false);
    CHECK(rv == 0, "lock: %s", strata_strerror(rv));
    CHECK(run_child("lock", dir, seg) == CHILD_BUSY, "a second process's lock is refused");
    shm_close(&r);
    CHECK(run_child("lock", dir, seg) == CHILD_OK, "the lock is free once its holder closed");

    /* removal: the name goes (a file), mappings stay valid */
    CHECK(!shm_removed(&s), "a published segment has its name");
    rv = shm_remove(dir, seg);
    CHECK(rv == 0, "remove: %s", strata_strerror(rv));
    CHECK(s.map[size - 1] == pattern(size - 1), "the mapping outlives the name");
    if (dir && !under_wine())
        CHECK(shm_removed(&s), "a removed file-backed segment knows it");
    else if (dir)
        printf("   (Wine reports no pending deletion: shm_removed not asserted)\n");
    rv = shm_remove(dir, seg);
    CHECK(rv == 0, "removing a missing segment: %s", strata_strerror(rv));
    shm_close(&s);
    CHECK(!shm_is_open(&s) && !s.map, "closed");

    /* past 4 GiB: sparse, only the touched ranges reserved */
    rv = shm_create_sparse(dir, bigtmp, BIG, &s);
    CHECK(rv == 0, "create %llu bytes sparse: %s", (unsigned long long)BIG, strata_strerror(rv));
    if (rv == 0) {
        CHECK(shm_reserve(dir, &s, 0, 4096) == 0, "reserve the start");
        CHECK(shm_reserve(dir, &s, (4ull << 30), 8192) == 0, "reserve past 4 GiB");
        CHECK(shm_reserve(dir, &s, BIG - 100, 100) == 0, "reserve the end");
        s.map[0] = 0x11;
        s.map[(4ull << 30) + 5] = 0x5A;
        s.map[BIG - 1] = 0xA5;
        rv = shm_publish(dir, &s, bigtmp, big, 0600);
        CHECK(rv == 0, "publish big: %s", strata_strerror(rv));
        CHECK(run_child("big", dir, big) == CHILD_OK, "a second process reads past 4 GiB");
        shm_remove(dir, big);
        shm_close(&s);
    }

    /* no room: a clear error naming the need and what to do, nothing left behind */
    rv = shm_create(dir, tmp, 1ull << 50, &s);
    CHECK(rv == STRATA_ENOSPC && strstr(strata_errdetail(), "arena needs") &&
              strstr(strata_errdetail(), "--shm-dir"),
          "a segment of 1 PiB: %s", strata_strerror(rv));
    rv = shm_open_seg(dir, tmp, false, false, &t);
    CHECK(rv == STRATA_ENOENT, "a failed create leaves no segment: %s", strata_strerror(rv));
    uint64_t free_bytes = 0;
    CHECK(shm_free_bytes(dir, &free_bytes) == 0 && free_bytes > 0, "free bytes");
}

/* another_owner: a segment name that another owner took first is refused by name. Windows: a
 * section owned by the Administrators group and open to everyone, made here by hand. */
static void another_owner(void)
{
#ifdef _WIN32
    char seg[128], sddl[] = "O:BAD:(A;;GA;;;WD)";
    wchar_t w[160];
    snprintf(seg, sizeof seg, "strata-%u-shmtest-other-%lu", shm_uid(), self_id());
    swprintf(w, 160, L"Local\\%hs", seg);
    PSECURITY_DESCRIPTOR sd = NULL;
    ConvertStringSecurityDescriptorToSecurityDescriptorA(sddl, SDDL_REVISION_1, &sd, NULL);
    SECURITY_ATTRIBUTES sa = {.nLength = sizeof sa, .lpSecurityDescriptor = sd};
    HANDLE m = CreateFileMappingW(INVALID_HANDLE_VALUE, &sa, PAGE_READWRITE, 0, 65536, w);
    LocalFree(sd);
    if (!m) {
        printf("   (cannot make a section owned by another owner here: case not run)\n");
        return;
    }
    struct shm_seg s;
    int rv = shm_open_seg(NULL, seg, false, false, &s);
    CHECK(rv == STRATA_EPERM && strstr(strata_errdetail(), "not to this user"),
          "a segment of another owner: %s", strata_strerror(rv));
    if (rv == 0) shm_close(&s);
    CloseHandle(m);
#endif
}

static void names(void)
{
    char b[256];
    CHECK(shm_name(b, sizeof b, "demo", ".state") == 0, "name");
    char want[64];
    snprintf(want, sizeof want, "strata-%u-demo.state", shm_uid());
    CHECK(strcmp(b, want) == 0, "name is %s", b);
    CHECK(shm_name(b, sizeof b, "../x", "") == STRATA_EINVAL, "a name with '/'");
    CHECK(shm_name(b, sizeof b, ".x", "") == STRATA_EINVAL, "a name starting with '.'");
    CHECK(shm_name(b, 8, "demo", "") == STRATA_EOVERFLOW, "a short buffer");
}

/* make_dir makes a fresh directory under the system's temporary directory. */
static int make_dir(char *out, size_t n)
{
#ifdef _WIN32
    char base[MAX_PATH];
    if (!GetTempPathA(sizeof base, base)) return -1;
    snprintf(out, n, "%sstrata-test-shm-%lu-%llu", base, self_id(),
             (unsigned long long)GetTickCount64());
    return CreateDirectoryA(out, NULL) ? 0 : -1;
#else
    const char *t = getenv("TMPDIR");
    snprintf(out, n, "%s/strata-test-shm-XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(out) ? 0 : -1;
#endif
}

static void remove_dir(const char *d)
{
#ifdef _WIN32
    RemoveDirectoryA(d);
#else
    rmdir(d);
#endif
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "child") == 0)
        return child(argv[2], strcmp(argv[3], "-") == 0 ? NULL : argv[3], argv[4]);
    setvbuf(stdout, NULL, _IONBF, 0);
    names();
    char dir[512];
    if (make_dir(dir, sizeof dir) != 0) {
        fprintf(stderr, "cannot make a temporary directory\n");
        return 1;
    }
    cases(dir);
    remove_dir(dir);
#ifdef _WIN32
    cases(NULL); /* the paging file */
#endif
    another_owner();
    printf("shm_test: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
