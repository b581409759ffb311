#include "common/base/log.h"
#include "common/base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const names[] = {"error", "warn", "info", "debug", "trace"};
static int level = -1; /* -1: not yet read from STRATA_LOG */
static char tag[32] = "strata";

int strata_log_parse_level(const char *name, enum strata_log_level *out)
{
    for (int i = 0; i <= STRATA_LOG_TRACE; i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (enum strata_log_level)i;
            return 0;
        }
    }
    return strata_errf(STRATA_EINVAL, "unknown log level '%s' (use error, warn, info, debug, trace)",
                       name);
}

void strata_log_set_level(enum strata_log_level l)
{
    level = (int)l;
}

enum strata_log_level strata_log_level(void)
{
    if (level < 0) {
        enum strata_log_level l = STRATA_LOG_INFO;
        const char *env = getenv("STRATA_LOG");
        if (env && *env) strata_log_parse_level(env, &l);
        level = (int)l;
    }
    return (enum strata_log_level)level;
}

void strata_log_set_tag(const char *t)
{
    snprintf(tag, sizeof tag, "%s", t);
}

void strata_log(enum strata_log_level l, const char *fmt, ...)
{
    if ((int)l > (int)strata_log_level()) return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    localtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %s %s: %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, tag, names[l], msg);
}
