/* msg — the msgpack envelope every socket of strata speaks: building, checking and reading
 * messages.
 *
 * A request is a map {"v": version, "op": "<name>", ...fields}; a reply is {"v": version, "ok":
 * true,
 * ...fields} or {"v": version, "ok": false, "error": {"code": <strata code>, "message": "<text>"}}.
 * Unknown keys are ignored so either side may add fields without a version bump.
 *
 * Bytes from a socket are untrusted. msg_decode() first runs msg_precheck(), a walk over the raw
 * bytes that allocates nothing and rejects any count larger than the bytes left, nesting deeper
 * than the limit, truncation, trailing bytes and a top level that is not a map, because msgpack's
 * unpacker allocates from declared counts. Only then is the message unpacked into a zone. The typed
 * accessors (msg_get_*) then check each field's type and range and fail with STRATA_EPROTO and a
 * detail naming the key, so a handler can answer the error as it comes.
 *
 * A builder or a decoded msg belongs to one thread at a time; nothing here has global state.
 * Decoded strings are NUL-terminated copies in the msg's zone; bin fields point into the buffer
 * that was decoded, which must outlive the msg unless the msg owns it (msg.owned).
 */
#ifndef STRATA_MSG_H
#define STRATA_MSG_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MSG_VERSION     1 /* the protocol version this build writes */
#define MSG_VERSION_MIN 1 /* the oldest version this build reads */
#define MSG_MAX_DEPTH                                                                              \
    16 /* nesting limit msg_decode() applies (a map inside the top map is depth 2) */
#define MSG_MAX_BYTES (16u << 20) /* default transport cap (NNG_OPT_RECVMAXSZ) for every socket */

/* The builder: a msgpack_packer over a growing buffer. Pack calls never fail on their own: the
 * first allocation failure is remembered and reported by msg_finish(), so a message is built
 * without an error check per field. The top-level map's entry count is patched in by msg_finish()
 * (it counts msg_key() calls), so callers never count their top-level fields; nested maps and
 * arrays take an explicit count (msg_pack_map, msg_pack_array) and their keys are packed with
 * msg_pack_str. */
struct msg_builder {
    msgpack_sbuffer buf; /* the bytes so far (malloc'd) */
    msgpack_packer pk;   /* packs into buf; usable directly for anything the helpers lack */
    uint32_t n_top;      /* top-level entries so far */
    int err;             /* first failure, 0 if none */
};

/* msg_begin_request starts b as a request for op: {"v": MSG_VERSION, "op": op, ...}. b needs no
 * init before and msg_finish() or msg_builder_fini() after. */
void msg_begin_request(struct msg_builder *b, const char *op);

/* msg_begin_reply starts b as a success reply: {"v": MSG_VERSION, "ok": true, ...}. */
void msg_begin_reply(struct msg_builder *b);

/* msg_key packs a top-level key (and counts it); the value follows with one msg_pack_* call or a
 * nested map/array. */
void msg_key(struct msg_builder *b, const char *key);

void msg_pack_str(struct msg_builder *b, const char *s);              /* NUL-terminated */
void msg_pack_strn(struct msg_builder *b, const char *s, size_t len); /* may hold NULs */
void msg_pack_i64(struct msg_builder *b, int64_t v);
void msg_pack_u64(struct msg_builder *b, uint64_t v);
void msg_pack_f64(struct msg_builder *b, double v);
void msg_pack_bool(struct msg_builder *b, bool v);
void msg_pack_nil(struct msg_builder *b);
void msg_pack_bin(struct msg_builder *b, const void *p, size_t len);
void msg_pack_map(struct msg_builder *b, uint32_t n_entries); /* then n_entries key, value pairs */
void msg_pack_array(struct msg_builder *b, uint32_t n_items); /* then n_items values */
void msg_pack_i32s(struct msg_builder *b, const int32_t *v, uint32_t n); /* an array of ints */
void msg_pack_i64s(struct msg_builder *b, const int64_t *v, uint32_t n);

/* msg_finish completes b and hands its bytes to the caller (*buf is malloc'd: free() it). b is
 * released either way. Returns 0, STRATA_ENOMEM, or STRATA_EINVAL for a builder already
 * finished. */
int msg_finish(struct msg_builder *b, void **buf, size_t *len);

/* msg_builder_fini releases b without producing a message (on an error path). Safe after
 * msg_finish() and on a zeroed builder. */
void msg_builder_fini(struct msg_builder *b);

/* msg_error_reply builds a complete error reply {"v", "ok": false, "error": {"code", "message"}}
 * into *buf (malloc'd). message may be NULL or "" (strata_strerror(code) is sent then). Returns 0
 * or STRATA_ENOMEM. */
int msg_error_reply(int code, const char *message, void **buf, size_t *len);

/* msg_precheck walks the msgpack bytes buf[0..len) without allocating and returns 0 if they are one
 * map with every count within the bytes left and nesting at most max_depth (the top map is depth
 * 1); otherwise STRATA_ETRUNC (input ends early, or a count exceeds the bytes left), STRATA_EFORMAT
 * (not a map at the top, trailing bytes, a reserved byte 0xc1) or STRATA_ELIMIT (too deep), with a
 * detail giving the offset. Never reads outside buf. */
int msg_precheck(const void *buf, size_t len, int max_depth);

/* A decoded message. The fields below the root are filled by msg_decode() from the envelope. */
struct msg {
    msgpack_object root;     /* the top-level map */
    int64_t v;               /* protocol version, MSG_VERSION_MIN..MSG_VERSION */
    const char *op;          /* a request's op (NUL-terminated, in the zone); NULL for a reply */
    bool ok;                 /* a reply's "ok"; false for a request */
    int err_code;            /* a failed reply's error code (never 0: a bogus 0 reads as EPROTO) */
    const char *err_message; /* a failed reply's message (in the zone), "" when none was sent */
    void *owned;       /* the decoded buffer if this msg owns it (freed by msg_free), or NULL */
    msgpack_zone zone; /* where the unpacked objects and string copies live */
    bool live;         /* zone is initialized */
};

/* msg_decode prechecks (MSG_MAX_DEPTH), unpacks and reads the envelope of buf[0..len) into *m: "v"
 * must be an integer in MSG_VERSION_MIN..MSG_VERSION, and the map must carry either "op" (a string:
 * a request) or "ok" (a bool: a reply; when false, "error" must be a map with an integer "code" and
 * an optional string "message"). m references buf (bin fields point into it) unless the caller then
 * sets m->owned = buf to hand it over. Returns 0, a precheck error, STRATA_ENOMEM or STRATA_EPROTO;
 * on failure *m holds nothing (msg_free is harmless). */
int msg_decode(const void *buf, size_t len, struct msg *m);

/* msg_free releases m's zone and owned buffer. Safe on a zeroed msg and twice. */
void msg_free(struct msg *m);

/* msg_reply_status returns 0 for a success reply, or the remote error code of a failed one with the
 * remote message as this thread's detail (strata_errdetail), and STRATA_EPROTO for a request. */
int msg_reply_status(const struct msg *m);

/* Typed accessors: look key up in map (NULL means m->root) and check its type and range. They
 * return 0 and set the outputs, STRATA_ENOENT if the key is absent (outputs untouched, so a default
 * set beforehand survives: treat ENOENT as "use the default" for an optional field, as an error for
 * a required one), or STRATA_EPROTO when map is not a map or the value has the wrong type or is out
 * of range, with a detail such as "field 'max_tokens': expected an integer in [0, 65536], got
 * string". Lookup is a linear scan: fine for the few dozen keys of a message. If a key appears
 * twice, the first wins. */
int msg_get_str(struct msg *m, const msgpack_object *map, const char *key, size_t max_len,
                const char **s, size_t *len); /* NUL-terminated copy in m's zone; len may be NULL */
int msg_get_i64(struct msg *m, const msgpack_object *map, const char *key, int64_t min, int64_t max,
                int64_t *out);
int msg_get_u64(struct msg *m, const msgpack_object *map, const char *key, uint64_t max,
                uint64_t *out);
/* msg_get_f64 accepts a float or an integer; NaN is refused, so is anything outside [min, max]. */
int msg_get_f64(struct msg *m, const msgpack_object *map, const char *key, double min, double max,
                double *out);
int msg_get_bool(struct msg *m, const msgpack_object *map, const char *key, bool *out);
int msg_get_bin(struct msg *m, const msgpack_object *map, const char *key, size_t max_len,
                const void **p, size_t *len); /* points into the decoded buffer */
/* msg_get_map gives a nested map, to pass as map to the accessors. */
int msg_get_map(struct msg *m, const msgpack_object *map, const char *key,
                const msgpack_object **out);
/* msg_get_arr gives an array of at most max_n items of any type (e.g. maps, to read each with the
 * accessors). */
int msg_get_arr(struct msg *m, const msgpack_object *map, const char *key, uint32_t max_n,
                const msgpack_object **items, uint32_t *n);
/* msg_get_i32s / msg_get_i64s read an array of at most max_n integers, each in [min, max], into an
 * array allocated in m's zone (*out is NULL when n is 0). */
int msg_get_i32s(struct msg *m, const msgpack_object *map, const char *key, uint32_t max_n,
                 int32_t min, int32_t max, const int32_t **out, uint32_t *n);
int msg_get_i64s(struct msg *m, const msgpack_object *map, const char *key, uint32_t max_n,
                 int64_t min, int64_t max, const int64_t **out, uint32_t *n);

#endif
