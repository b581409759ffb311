#include "launcher/cmd.h"
#include "common/base/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int strata_cmd_fail(const char *name, const char *what, int rv)
{
    const char *d = strata_errdetail();
    if (d[0])
        fprintf(stderr, "strata %s: %s: %s: %s\n", name, what, strata_strerror(rv), d);
    else
        fprintf(stderr, "strata %s: %s: %s\n", name, what, strata_strerror(rv));
    return 1;
}

int strata_cmd_parse_u32(const char *s, const char *opt, uint32_t min, uint32_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v < min || v > UINT32_MAX || s[0] == '-')
        return strata_errf(STRATA_EINVAL, "%s '%s': expected an integer >= %u", opt, s, min);
    *out = (uint32_t)v;
    return 0;
}
