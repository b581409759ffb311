/* err — strata's error codes, one space for our own conditions, errno, nng and CUDA errors.
 *
 * Functions return int: 0 on success, a positive code otherwise. Our own codes are small integers;
 * an errno value e travels as STRATA_ESYSERR | e, an nng error as STRATA_ENNGERR | e, a CUDA error
 * as STRATA_ECUDAERR | e, so strata_strerror() explains any of them and codes can cross the wire.
 *
 * A detail message (what exactly was wrong, with the value) is kept per thread: strata_errf() sets it
 * and returns the code, so `return strata_errf(STRATA_EFORMAT, "tensor %s: ...", name);` reports both.
 * strata_errdetail() reads it back; it stays until the next strata_errf() on that thread.
 */
#ifndef STRATA_ERR_H
#define STRATA_ERR_H

#ifdef __cplusplus
extern "C" {
#endif

enum strata_err {
    STRATA_OK = 0,
    STRATA_EINVAL = 1,   /* an argument or option is invalid */
    STRATA_ENOMEM,       /* out of memory */
    STRATA_EIO,          /* read or write failed */
    STRATA_ENOENT,       /* no such file, key, tensor, request */
    STRATA_EFORMAT,      /* a file or message is malformed */
    STRATA_ETRUNC,       /* a file or message ends early */
    STRATA_EOVERFLOW,    /* a size or count overflows */
    STRATA_EUNSUPPORTED, /* valid but not supported (type, architecture, op) */
    STRATA_EEXIST,       /* already exists */
    STRATA_EBUSY,        /* busy: queue full, lock held */
    STRATA_ETIMEDOUT,    /* timed out */
    STRATA_ENOSPC,       /* not enough space (shm, RAM, VRAM, KV blocks) */
    STRATA_EPROTO,       /* protocol error: wrong version, wrong model */
    STRATA_ECLOSED,      /* object or connection closed */
    STRATA_ECANCELED,    /* operation canceled */
    STRATA_ELIMIT,       /* a configured limit was exceeded (context, body size, tokens) */
    STRATA_ESTATE,       /* wrong state for this operation */
    STRATA_EPERM,        /* permission denied */
    STRATA_EINTERNAL,    /* a broken invariant: a bug */
    STRATA_ENCODES_,     /* number of our own codes; not an error */
};

#define STRATA_ESYSERR  0x10000000 /* | errno */
#define STRATA_ENNGERR  0x20000000 /* | nng error */
#define STRATA_ECUDAERR 0x40000000 /* | cudaError_t */

/* strata_strerror returns a static description of code; never NULL. */
const char *strata_strerror(int code);

/* strata_errno wraps an errno value (0 is mapped to STRATA_EIO so a failure never reads as success). */
int strata_errno(int e);

/* strata_errf sets this thread's detail message (printf format) and returns code. */
int strata_errf(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* strata_errdetail returns this thread's last detail message, or "" when none. */
const char *strata_errdetail(void);

/* strata_errclear forgets this thread's detail message. */
void strata_errclear(void);

#ifdef __cplusplus
}
#endif
#endif
