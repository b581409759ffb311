#include "launcher/cmd.h"
#include "common/err.h"

#include <stdio.h>

int strata_cmd_fail(const char *name, const char *what, int rv)
{
    const char *d = strata_errdetail();
    if (d[0])
        fprintf(stderr, "strata %s: %s: %s: %s\n", name, what, strata_strerror(rv), d);
    else
        fprintf(stderr, "strata %s: %s: %s\n", name, what, strata_strerror(rv));
    return 1;
}
