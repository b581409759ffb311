/* msg_fuzz — the msgpack envelope on arbitrary bytes: the pre-check, the decoder, and every
 * accessor on every key of the decoded map (and of maps nested in it), so a hostile frame can reach
 * each check. Nothing may crash, read out of bounds or leak; the pre-check and the decoder must
 * agree. */
#include "common/ipc/msg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void probe(struct msg *m, const msgpack_object *map, int depth);

/* probe_key runs every accessor on one key of map. */
static void probe_key(struct msg *m, const msgpack_object *map, const char *key, int depth)
{
    const char *s;
    size_t len;
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    const void *p;
    const msgpack_object *o;
    const int32_t *t32;
    const int64_t *t64;
    uint32_t n;
    msg_get_str(m, map, key, 1 << 20, &s, &len);
    msg_get_i64(m, map, key, INT64_MIN, INT64_MAX, &i);
    msg_get_i64(m, map, key, 0, 100, &i);
    msg_get_u64(m, map, key, UINT64_MAX, &u);
    msg_get_f64(m, map, key, -1e300, 1e300, &d);
    msg_get_bool(m, map, key, &b);
    msg_get_bin(m, map, key, 1 << 20, &p, &len);
    msg_get_i32s(m, map, key, 1 << 16, INT32_MIN, INT32_MAX, &t32, &n);
    msg_get_i64s(m, map, key, 1 << 16, INT64_MIN, INT64_MAX, &t64, &n);
    if (msg_get_map(m, map, key, &o) == 0) probe(m, o, depth + 1);
    if (msg_get_arr(m, map, key, UINT32_MAX, &o, &n) == 0)
        for (uint32_t k = 0; k < n; k++)
            probe(m, &o[k], depth + 1);
}

static void probe(struct msg *m, const msgpack_object *map, int depth)
{
    static const char *const fixed[] = {"v", "op", "ok", "error", "code", "message", "absent"};
    if (depth > MSG_MAX_DEPTH) abort(); /* the pre-check bounds nesting */
    for (size_t k = 0; k < sizeof fixed / sizeof *fixed; k++)
        probe_key(m, map, fixed[k], depth);
    if (map->type != MSGPACK_OBJECT_MAP) return;
    for (uint32_t k = 0; k < map->via.map.size; k++) {
        const msgpack_object *key = &map->via.map.ptr[k].key;
        if (key->type != MSGPACK_OBJECT_STR || key->via.str.size > 64) continue;
        char name[65];
        memcpy(name, key->via.str.ptr, key->via.str.size);
        name[key->via.str.size] = '\0';
        probe_key(m, map, name, depth);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* a private copy, so reading one byte past the input is caught by ASan and not hidden by the
     * caller's larger buffer */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    int pre = msg_precheck(copy, size, MSG_MAX_DEPTH);
    struct msg m;
    int rv = msg_decode(copy, size, &m);
    if (pre != 0 && rv == 0) abort(); /* decode must never accept what the pre-check refused */
    if (rv == 0) {
        probe(&m, &m.root, 1);
        msg_reply_status(&m);
    }
    msg_free(&m);
    free(copy);
    return 0;
}
