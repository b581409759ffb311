#include "arena-server/arena_space.h"
#include "common/base/err.h"
#include "common/arena/shm.h"

#include <dirent.h>
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#define HUGETLBFS_MAGIC_ 0x958458f6 /* linux/magic.h, not in glibc's headers */
#define GiB(x)           ((x) / 1073741824.0)

static uint64_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t v = UINT64_MAX;
    if (!f) return v;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            v = kb * 1024;
            break;
        }
    }
    fclose(f);
    return v;
}

/* read_u64_file reads one number; "max" and failures give UINT64_MAX. */
static uint64_t read_u64_file(const char *path)
{
    FILE *f = fopen(path, "r");
    unsigned long long v;
    if (!f) return UINT64_MAX;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    return ok ? v : UINT64_MAX;
}

/* cgroup_free walks from our cgroup (v2) up to the root and keeps the tightest memory.max. */
static uint64_t cgroup_free(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[4096], path[4400];
    uint64_t best = UINT64_MAX;
    if (!f) return best;
    char *rel = NULL;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "0::", 3) == 0) {
            rel = line + 3;
            rel[strcspn(rel, "\n")] = '\0';
            break;
        }
    fclose(f);
    if (!rel) return best;
    for (;;) {
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", rel);
        uint64_t max = read_u64_file(path);
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.current", rel);
        uint64_t cur = read_u64_file(path);
        if (max != UINT64_MAX) {
            uint64_t left = cur != UINT64_MAX && cur < max ? max - cur
                            : cur == UINT64_MAX            ? max
                                                           : 0;
            if (left < best) best = left;
        }
        char *slash = strrchr(rel, '/');
        if (!slash || slash == rel) break;
        *slash = '\0';
    }
    return best;
}

int arena_space_read(const char *shm_dir, struct arena_space *out)
{
    const char *dir = shm_dir && *shm_dir ? shm_dir : SHM_DEFAULT_DIR;
    struct statfs sf;
    if (statfs(dir, &sf) != 0)
        return strata_errf(strata_errno(errno), "statfs %s: %s", dir, strerror(errno));
    out->hugetlb = (unsigned long)sf.f_type == HUGETLBFS_MAGIC_;
    out->shm_free = (uint64_t)sf.f_bavail * (uint64_t)sf.f_bsize;
    out->mem_available = meminfo_available();
    out->cgroup_free = cgroup_free();
    return 0;
}

int arena_space_check(const char *shm_dir, uint64_t need, const struct arena_space *sp)
{
    const char *dir = shm_dir && *shm_dir ? shm_dir : SHM_DEFAULT_DIR;
    char n[SHM_SIZE_STR], h[SHM_SIZE_STR];
    if (need > sp->shm_free)
        return strata_errf(STRATA_ENOSPC,
                           "arena needs %s, %s has %s free: mount a larger tmpfs "
                           "(mount -o remount,size=%.0fG %s) or pass --shm-dir",
                           shm_size_str(need, n), dir, shm_size_str(sp->shm_free, h),
                           GiB(need) + 1.0, dir);
    if (sp->hugetlb) return 0; /* huge pages are reserved apart from MemAvailable and cgroups */
    if (need > sp->mem_available)
        return strata_errf(STRATA_ENOSPC,
                           "arena needs %s, MemAvailable is %s: stop other programs using memory "
                           "or use a machine with more RAM",
                           shm_size_str(need, n), shm_size_str(sp->mem_available, h));
    if (need > sp->cgroup_free)
        return strata_errf(STRATA_ENOSPC,
                           "arena needs %s, this process's cgroup memory.max leaves %s: raise it "
                           "(systemd: MemoryMax=, docker: --memory) or run outside the cgroup",
                           shm_size_str(need, n), shm_size_str(sp->cgroup_free, h));
    return 0;
}

/* removeipc_setting scans a logind.conf file for RemoveIPC=; leaves *v alone if absent. */
static void removeipc_setting(const char *path, bool *v)
{
    FILE *f = fopen(path, "r");
    char line[512];
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        char *p = line + strspn(line, " \t");
        if (strncmp(p, "RemoveIPC=", 10) != 0) continue;
        p += 10;
        *v = !(strncmp(p, "no", 2) == 0 || strncmp(p, "false", 5) == 0 || p[0] == '0' ||
               strncmp(p, "off", 3) == 0);
    }
    fclose(f);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void arena_space_removeipc(const char *shm_dir, char *buf, size_t n)
{
    buf[0] = '\0';
    /* RemoveIPC only touches /dev/shm and SysV IPC, only under systemd, only for non-system users
     * (uid >= 1000 on Debian), and not while the user lingers. */
    const char *dir = shm_dir && *shm_dir ? shm_dir : SHM_DEFAULT_DIR;
    struct stat a, b;
    if (stat(dir, &a) != 0 || stat(SHM_DEFAULT_DIR, &b) != 0 || a.st_dev != b.st_dev) return;
    if (access("/run/systemd/system", F_OK) != 0 || getuid() < 1000) return;
    struct passwd *pw = getpwuid(getuid());
    char linger[512];
    if (pw) {
        snprintf(linger, sizeof linger, "/var/lib/systemd/linger/%s", pw->pw_name);
        if (access(linger, F_OK) == 0) return;
    }
    bool remove = true;
    removeipc_setting("/etc/systemd/logind.conf", &remove);
    DIR *d = opendir("/etc/systemd/logind.conf.d");
    if (d) {
        char *names[256];
        size_t k = 0;
        struct dirent *e;
        while ((e = readdir(d)) && k < 256) {
            size_t len = strlen(e->d_name);
            if (len > 5 && strcmp(e->d_name + len - 5, ".conf") == 0)
                names[k++] = strdup(e->d_name);
        }
        closedir(d);
        qsort(names, k, sizeof *names, cmp_str);
        for (size_t i = 0; i < k; i++) {
            char path[600];
            if (names[i]) {
                snprintf(path, sizeof path, "/etc/systemd/logind.conf.d/%s", names[i]);
                removeipc_setting(path, &remove);
            }
            free(names[i]);
        }
    }
    if (!remove) return;
    snprintf(buf, n,
             "systemd-logind has RemoveIPC=yes: the arena in %s will be deleted when user %s "
             "logs out. Run `loginctl enable-linger %s`, run strata as a system user, or set "
             "RemoveIPC=no in /etc/systemd/logind.conf",
             dir, pw ? pw->pw_name : "?", pw ? pw->pw_name : "$USER");
}
