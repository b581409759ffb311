#include "arena-server/arena_profile.h"
#include "arena-server/arena_fingerprint.h"
#include "common/base/err.h"
#include "common/base/own.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define PROFILE_MAGIC "STRAHEAT"

struct profile_head {
    char magic[8];
    uint32_t version;
    uint32_t n_layers;
    uint32_t n_expert;
    uint32_t reserved;
    uint64_t fingerprint;
};

/* mkdir_p creates every missing directory of path (mode 0700). */
static int mkdir_p(char *path)
{
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        int rv = mkdir(path, 0700);
        int e = errno;
        *p = c;
        if (rv != 0 && e != EEXIST)
            return strata_errf(strata_errno(e), "mkdir %s: %s", path, strerror(e));
        if (c == '\0') return 0;
    }
}

int arena_profile_path(uint64_t fp, char *buf, size_t n)
{
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char dir[4096], hex[17];
    int w;
    if (xdg && *xdg)
        w = snprintf(dir, sizeof dir, "%s/strata", xdg);
    else
        w = snprintf(dir, sizeof dir, "%s/.local/state/strata", home && *home ? home : "/tmp");
    if (w < 0 || (size_t)w >= sizeof dir)
        return strata_errf(STRATA_EOVERFLOW, "state dir too long");
    int rv = mkdir_p(dir);
    if (rv != 0) return rv;
    arena_fingerprint_hex(fp, hex);
    w = snprintf(buf, n, "%s/%s.profile", dir, hex);
    if (w < 0 || (size_t)w >= n) return strata_errf(STRATA_EOVERFLOW, "profile path too long");
    return 0;
}

int arena_profile_save(const char *path, const struct arena_state *st)
{
    const struct arena_state_header *h = st->hdr;
    uint64_t n = (uint64_t)h->n_layers * h->n_expert;
    size_t bytes = sizeof(struct profile_head) + n * 8 + 8;
    uint8_t *buf = malloc(bytes);
    char tmp[4200];
    int rv = 0, fd = -1;
    if (!buf) return STRATA_ENOMEM;
    struct profile_head ph = {.version = ARENA_PROFILE_VERSION,
                              .n_layers = h->n_layers,
                              .n_expert = h->n_expert,
                              .fingerprint = h->fingerprint};
    memcpy(ph.magic, PROFILE_MAGIC, 8);
    memcpy(buf, &ph, sizeof ph);
    uint64_t *counts = (uint64_t *)(buf + sizeof ph);
    for (uint64_t i = 0; i < n; i++)
        counts[i] = atomic_load_explicit(&st->heat[i], memory_order_relaxed);
    uint64_t sum = XXH3_64bits(buf, bytes - 8);
    memcpy(buf + bytes - 8, &sum, 8);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* Exclusive and not through a symlink: --profile may name a shared directory. A .tmp left by
     * a save that died is ours to replace (unlink removes a planted symlink, not its target). */
    rv = own_open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600, false, &fd);
    if (rv == STRATA_EEXIST && unlink(tmp) == 0)
        rv = own_open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600, false, &fd);
    if (rv != 0) {
        rv = strata_errf(rv, "write heat profile %s: %s", tmp, strata_errdetail());
        goto out;
    }
    if (write(fd, buf, bytes) != (ssize_t)bytes || fsync(fd) != 0) {
        rv = strata_errf(strata_errno(errno), "write heat profile %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        rv = strata_errf(strata_errno(errno), "rename %s: %s", tmp, strerror(errno));
        goto out;
    }
    atomic_fetch_add(&st->hdr->profile_saves, 1);
out:
    if (fd >= 0) close(fd);
    if (rv != 0) unlink(tmp);
    free(buf);
    return rv;
}

int arena_profile_load(const char *path, struct arena_state *st, bool *other_fp)
{
    const struct arena_state_header *h = st->hdr;
    uint64_t n = (uint64_t)h->n_layers * h->n_expert;
    size_t want = sizeof(struct profile_head) + n * 8 + 8;
    int rv = 0;
    int fd;
    if ((rv = own_open(path, O_RDONLY, 0, false, &fd)) != 0) return rv;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return STRATA_ENOMEM;
    }
    uint8_t *buf = malloc(want + 1);
    if (!buf) {
        fclose(f);
        return STRATA_ENOMEM;
    }
    size_t got = fread(buf, 1, want + 1, f);
    fclose(f);
    struct profile_head ph;
    uint64_t sum;
    if (got < sizeof ph) {
        rv = strata_errf(STRATA_EFORMAT, "heat profile %s is truncated", path);
        goto out;
    }
    memcpy(&ph, buf, sizeof ph);
    if (memcmp(ph.magic, PROFILE_MAGIC, 8) != 0 || ph.version != ARENA_PROFILE_VERSION) {
        rv = strata_errf(STRATA_EFORMAT, "%s is not a version %d heat profile", path,
                         ARENA_PROFILE_VERSION);
        goto out;
    }
    if (ph.n_layers != h->n_layers || ph.n_expert != h->n_expert || got != want) {
        rv = strata_errf(STRATA_EFORMAT,
                         "heat profile %s is for %u layers x %u experts, the arena has %u x %u",
                         path, ph.n_layers, ph.n_expert, h->n_layers, h->n_expert);
        goto out;
    }
    memcpy(&sum, buf + want - 8, 8);
    if (XXH3_64bits(buf, want - 8) != sum) {
        rv = strata_errf(STRATA_EFORMAT, "heat profile %s fails its checksum", path);
        goto out;
    }
    const uint64_t *counts = (const uint64_t *)(buf + sizeof ph);
    for (uint64_t i = 0; i < n; i++)
        if (counts[i])
            arena_heat_add(st, (uint32_t)(i / h->n_expert), (uint32_t)(i % h->n_expert), counts[i]);
    *other_fp = ph.fingerprint != h->fingerprint;
out:
    free(buf);
    return rv;
}
