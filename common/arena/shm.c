/* The platform-neutral part of the shm interface: names, paths, sizes for people. */
#include "common/arena/shm.h"
#include "common/base/err.h"

#include <stdio.h>
#include <string.h>

int shm_check_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > SHM_NAME_MAX)
        return strata_errf(STRATA_EINVAL, "arena name '%s' must have 1 to %d characters", name,
                           SHM_NAME_MAX);
    if (name[0] == '.')
        return strata_errf(STRATA_EINVAL, "arena name '%s' must not start with '.'", name);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return strata_errf(STRATA_EINVAL,
                               "arena name '%s' has '%c': use letters, digits, '.', '_' and '-'",
                               name, c);
    }
    return 0;
}

int shm_name(char *buf, size_t n, const char *name, const char *suffix)
{
    int rv = shm_check_name(name);
    if (rv != 0) return rv;
    int w = snprintf(buf, n, "strata-%u-%s%s", shm_uid(), name, suffix ? suffix : "");
    if (w < 0 || (size_t)w >= n) return strata_errf(STRATA_EOVERFLOW, "segment name too long");
    return 0;
}

int shm_path(char *buf, size_t n, const char *dir, const char *segname)
{
    int w = snprintf(buf, n, "%s/%s", (dir && *dir ? dir : SHM_DEFAULT_DIR), segname);
    if (w < 0 || (size_t)w >= n)
        return strata_errf(STRATA_EOVERFLOW, "path %s/%s too long",
                           (dir && *dir ? dir : SHM_DEFAULT_DIR), segname);
    return 0;
}

const char *shm_size_str(uint64_t n, char buf[SHM_SIZE_STR])
{
    if (n >= (1ull << 30))
        snprintf(buf, SHM_SIZE_STR, "%.1f GiB", n / 1073741824.0);
    else
        snprintf(buf, SHM_SIZE_STR, "%.1f MiB", n / 1048576.0);
    return buf;
}
