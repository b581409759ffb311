#include "common/base/err.h"

#include <errno.h>
#if __has_include(<nng/nng.h>)
#include <nng/nng.h>
#define HAVE_NNG 1
#endif
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const messages[STRATA_ENCODES_] = {
    [STRATA_OK] = "success",
    [STRATA_EINVAL] = "invalid argument",
    [STRATA_ENOMEM] = "out of memory",
    [STRATA_EIO] = "input/output error",
    [STRATA_ENOENT] = "not found",
    [STRATA_EFORMAT] = "malformed data",
    [STRATA_ETRUNC] = "data truncated",
    [STRATA_EOVERFLOW] = "size overflow",
    [STRATA_EUNSUPPORTED] = "not supported",
    [STRATA_EEXIST] = "already exists",
    [STRATA_EBUSY] = "busy",
    [STRATA_ETIMEDOUT] = "timed out",
    [STRATA_ENOSPC] = "not enough space",
    [STRATA_EPROTO] = "protocol error",
    [STRATA_ECLOSED] = "closed",
    [STRATA_ECANCELED] = "canceled",
    [STRATA_ELIMIT] = "limit exceeded",
    [STRATA_ESTATE] = "wrong state",
    [STRATA_EPERM] = "permission denied",
    [STRATA_EINTERNAL] = "internal error",
};

static _Thread_local char detail[1024];

const char *strata_strerror(int code)
{
    static _Thread_local char buf[64];
    if (code >= 0 && code < STRATA_ENCODES_) return messages[code];
    if (code & STRATA_ESYSERR) return strerror(code & ~STRATA_ESYSERR);
    if (code & STRATA_ENNGERR) {
#ifdef HAVE_NNG
        return nng_strerror(code & ~STRATA_ENNGERR);
#else /* a build of the shm shim alone (scripts/wine-test) has no nng */
        snprintf(buf, sizeof buf, "nng error %d", code & ~STRATA_ENNGERR);
        return buf;
#endif
    }
    if (code & STRATA_ECUDAERR) {
        snprintf(buf, sizeof buf, "CUDA error %d", code & ~STRATA_ECUDAERR);
        return buf;
    }
    snprintf(buf, sizeof buf, "unknown error %d", code);
    return buf;
}

int strata_errno(int e)
{
    return e > 0 ? (STRATA_ESYSERR | e) : STRATA_EIO;
}

int strata_errf(int code, const char *fmt, ...)
{
    /* through a copy: callers wrap the previous detail (strata_errf(rv, "x: %s",
     * strata_errdetail())), and vsnprintf into the buffer it reads from garbles it */
    char buf[sizeof detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    memcpy(detail, buf, sizeof detail);
    return code;
}

const char *strata_errdetail(void)
{
    return detail;
}

void strata_errclear(void)
{
    detail[0] = '\0';
}
