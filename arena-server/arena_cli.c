#include "arena-server/arena_cli.h"
#include "arena-server/arena_build.h"
#include "arena-server/arena_ctl.h"
#include "arena-server/arena_fingerprint.h"
#include "common/arena/arena_layout.h"
#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define GiB(x) ((x) / 1073741824.0)

static int fail(const char *cmd, const char *what, int rv)
{
    const char *d = strata_errdetail();
    fprintf(stderr, "strata-arena %s: %s: %s%s%s\n", cmd, what, strata_strerror(rv),
            d[0] ? ": " : "", d);
    return 1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int arena_cli_parse_align(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (strcasecmp(end, "k") == 0)
        v <<= 10;
    else if (strcasecmp(end, "m") == 0)
        v <<= 20;
    else if (*end)
        v = 0;
    if (v < ARENA_ALIGN_SMALL || (v & (v - 1)) || v > (1ull << 30))
        return strata_errf(STRATA_EINVAL, "--align %s: use 4k, 2m or a power of two >= 4096", s);
    *out = v;
    return 0;
}

/* Options of the subcommands on one arena NAME: inspect and verify take SEG_LONGS, status and
 * stop CTL_LONGS (status knows --force only to refuse it). */
struct name_opts {
    const char *name, *shm_dir, *rdir;
    bool json, force;
};

static const struct option seg_longs[] = {{"shm-dir", required_argument, NULL, 'd'},
                                          {"json", no_argument, NULL, 'j'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};
static const struct option ctl_longs[] = {{"runtime-dir", required_argument, NULL, 'r'},
                                          {"force", no_argument, NULL, 'f'},
                                          {"help", no_argument, NULL, 'h'},
                                          {NULL, 0, NULL, 0}};

/* parse_name_opts fills o from the options in longs (--force only when take_force) and the one
 * operand NAME. Returns -1 to go on, else the exit status: 0 after --help, 2 after a usage error. */
static int parse_name_opts(int argc, char **argv, const struct option *longs, bool take_force,
                           const char *usage, struct name_opts *o)
{
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (c == 'd')
            o->shm_dir = optarg;
        else if (c == 'j')
            o->json = true;
        else if (c == 'r')
            o->rdir = optarg;
        else if (c == 'f' && take_force)
            o->force = true;
        else if (c == 'h') {
            printf("%s", usage);
            return 0;
        } else {
            fprintf(stderr, "%s", usage);
            return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "%s", usage);
        return 2;
    }
    o->name = argv[optind];
    return -1;
}

static json_t *inspect_json(const struct arena *a, const char *path)
{
    const struct arena_header *h = a->hdr;
    char hex[17], name[512];
    json_t *root = json_object(), *blobs = json_array(), *dense = json_array();
    arena_fingerprint_hex(h->fingerprint, hex);
    json_object_set_new(root, "path", json_string(path));
    json_object_set_new(root, "size", json_integer((json_int_t)h->total_bytes));
    json_object_set_new(root, "fingerprint", json_string(hex));
    json_object_set_new(root, "align", json_integer((json_int_t)h->align));
    json_object_set_new(root, "version", json_integer(h->version_major));
    json_object_set_new(root, "model", json_string(arena_str(a, h->model_path_off)));
    json_object_set_new(root, "n_layers", json_integer(h->n_layers));
    json_object_set_new(root, "n_expert", json_integer(h->n_expert));
    json_object_set_new(root, "expert_base", json_integer((json_int_t)h->expert_base));
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const struct arena_layer *L = arena_layer_get(a, l);
        for (uint32_t e = 0; L->n_parts && e < h->n_expert; e++) {
            uint64_t off = (uint64_t)(arena_blob_at(a, l, e) - (const uint8_t *)h);
            json_t *b = json_object(), *parts = json_array();
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)arena_blob_hash(a, l, e));
            json_object_set_new(b, "layer", json_integer(l));
            json_object_set_new(b, "expert", json_integer(e));
            json_object_set_new(b, "offset", json_integer((json_int_t)off));
            json_object_set_new(b, "stride", json_integer((json_int_t)L->stride));
            json_object_set_new(b, "bytes", json_integer((json_int_t)L->blob_bytes));
            json_object_set_new(b, "xxh3", json_string(hex));
            for (uint32_t p = 0; p < L->n_parts; p++) {
                const struct arena_part *P = &a->parts[L->part_first + p];
                json_t *pj = json_object();
                arena_part_name(a, P, e, name, sizeof name);
                json_object_set_new(pj, "tensor", json_string(name));
                json_object_set_new(pj, "offset", json_integer((json_int_t)(off + P->offset)));
                json_object_set_new(pj, "bytes", json_integer((json_int_t)P->bytes));
                json_object_set_new(pj, "type", json_string(qtype_name(P->type)));
                json_array_append_new(parts, pj);
            }
            json_object_set_new(b, "parts", parts);
            json_array_append_new(blobs, b);
        }
    }
    for (uint64_t i = 0; i < h->n_dense; i++) {
        const struct arena_tensor *t = &a->dense[i];
        json_t *d = json_object();
        json_object_set_new(d, "name", json_string(arena_str(a, t->name_off)));
        json_object_set_new(d, "offset", json_integer((json_int_t)t->offset));
        json_object_set_new(d, "bytes", json_integer((json_int_t)t->bytes));
        json_object_set_new(d, "type", json_string(qtype_name(t->type)));
        json_array_append_new(dense, d);
    }
    json_object_set_new(root, "blobs", blobs);
    json_object_set_new(root, "dense", dense);
    return root;
}

static void inspect_text(const struct arena *a, const char *path)
{
    const struct arena_header *h = a->hdr;
    char hex[17], name[512];
    arena_fingerprint_hex(h->fingerprint, hex);
    printf("segment      %s (%.2f GiB)\nmodel        %s\nfingerprint  %s\nalign        %llu "
           "bytes\nlayout       %u.%u\ndense        %llu tensors, %.2f GiB\nexperts      %u layers "
           "x %u, %.2f GiB\n",
           path, GiB(h->total_bytes), arena_str(a, h->model_path_off), hex,
           (unsigned long long)h->align, h->version_major, h->version_minor,
           (unsigned long long)h->n_dense, GiB(h->dense_bytes), h->n_layers, h->n_expert,
           GiB(h->expert_bytes));
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const struct arena_layer *L = arena_layer_get(a, l);
        if (!L->n_parts) continue;
        printf("layer %-4u blob %llu bytes, stride %llu:", l, (unsigned long long)L->blob_bytes,
               (unsigned long long)L->stride);
        for (uint32_t p = 0; p < L->n_parts; p++) {
            const struct arena_part *P = &a->parts[L->part_first + p];
            arena_part_name(a, P, 0, name, sizeof name);
            printf(" %s@%llu(%s)", name, (unsigned long long)P->offset, qtype_name(P->type));
        }
        printf("\n");
    }
}

int arena_cli_inspect(int argc, char **argv)
{
    static const char usage[] =
        "usage: strata-arena inspect NAME [--shm-dir DIR] [--json]\n"
        "Reads the arena segment directly (no server needed) and prints its layout; --json lists\n"
        "every blob with its parts and every dense tensor, offsets from the segment's start.\n";
    struct name_opts o = {0};
    int st = parse_name_opts(argc, argv, seg_longs, false, usage, &o);
    if (st >= 0) return st;
    struct arena *a = NULL;
    char seg[300], path[4096];
    int rv = arena_open(o.shm_dir, o.name, &a);
    if (rv != 0) return fail("inspect", o.name, rv);
    shm_name(seg, sizeof seg, o.name, "");
    shm_path(path, sizeof path, o.shm_dir, seg);
    if (o.json) {
        json_t *j = inspect_json(a, path);
        json_dumpf(j, stdout, JSON_COMPACT);
        putchar('\n');
        json_decref(j);
    } else {
        inspect_text(a, path);
    }
    arena_close(a);
    return 0;
}

/* verify_blob compares blob (l, e) part by part with the GGUF and checks the padding between parts
 * is zero and the stored hash is right. Returns the number of problems it printed. */
static int verify_blob(const struct arena *a, const struct gguf_file *f, uint32_t l, uint32_t e)
{
    const struct arena_layer *L = arena_layer_get(a, l);
    const uint8_t *b = arena_blob_at(a, l, e);
    char name[512];
    int bad = 0;
    uint64_t end = 0;
    for (uint32_t p = 0; p < L->n_parts; p++) {
        const struct arena_part *P = &a->parts[L->part_first + p];
        arena_part_name(a, P, e, name, sizeof name);
        const struct gguf_tensor *t = gguf_tensor_find(f, name);
        for (uint64_t i = end; i < P->offset; i++)
            if (b[i]) {
                printf("blob (%u, %u): padding before %s is not zero\n", l, e, name);
                bad++;
                break;
            }
        end = P->offset + P->bytes;
        uint64_t skip = (P->flags & ARENA_PART_PER_EXPERT) ? 0 : (uint64_t)e * P->bytes;
        if (!t || t->type != P->type || t->nbytes < skip + P->bytes) {
            printf("blob (%u, %u): tensor %s is missing from the model or changed shape\n", l, e,
                   name);
            bad++;
        } else if (memcmp(b + P->offset, t->data + skip, P->bytes) != 0) {
            printf("blob (%u, %u): part %s differs from the model file\n", l, e, name);
            bad++;
        }
    }
    if (arena_build_hash_blob(a, l, e) != arena_blob_hash(a, l, e)) {
        printf("blob (%u, %u): xxHash differs from the stored one\n", l, e);
        bad++;
    }
    return bad;
}

int arena_cli_verify(int argc, char **argv)
{
    static const char usage[] =
        "usage: strata-arena verify NAME [--shm-dir DIR]\n"
        "Re-reads the model file the arena was built from and checks every byte of every dense\n"
        "tensor and expert blob, and every blob's xxHash.\n";
    struct name_opts o = {0};
    int st = parse_name_opts(argc, argv, seg_longs, false, usage, &o);
    if (st >= 0) return st;
    struct arena *a = NULL;
    struct gguf_file *f = NULL;
    int rv = arena_open(o.shm_dir, o.name, &a);
    if (rv != 0) return fail("verify", o.name, rv);
    const struct arena_header *h = a->hdr;
    const char *model = arena_str(a, h->model_path_off);
    if ((rv = gguf_open(model, &f)) != 0) {
        arena_close(a);
        return fail("verify", model, rv);
    }
    double t0 = now_s();
    int bad = 0;
    uint64_t n_expert_tensors = 0, blobs = 0;
    if (arena_fingerprint(f, h->align) != h->fingerprint)
        printf("note: %s changed (size, mtime, inode or header) since the arena was built; "
               "checking the bytes anyway\n",
               model);
    for (uint64_t i = 0; i < h->n_dense; i++) {
        const struct arena_tensor *d = &a->dense[i];
        const char *name = arena_str(a, d->name_off);
        const struct gguf_tensor *t = gguf_tensor_find(f, name);
        if (!t || t->nbytes != d->bytes || t->type != d->type) {
            printf("dense tensor %s is missing from the model or changed shape\n", name);
            bad++;
        } else if (memcmp((const uint8_t *)h + d->offset, t->data, d->bytes) != 0) {
            printf("dense tensor %s differs from the model file\n", name);
            bad++;
        }
    }
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const struct arena_layer *L = arena_layer_get(a, l);
        if (!L->n_parts) continue;
        for (uint32_t p = 0; p < L->n_parts; p++)
            n_expert_tensors +=
                (a->parts[L->part_first + p].flags & ARENA_PART_PER_EXPERT) ? h->n_expert : 1;
        for (uint32_t e = 0; e < h->n_expert && bad < 20; e++, blobs++)
            bad += verify_blob(a, f, l, e);
    }
    if (h->n_dense + n_expert_tensors != f->n_tensors) {
        printf("the model has %llu tensors, the arena holds %llu\n",
               (unsigned long long)f->n_tensors,
               (unsigned long long)(h->n_dense + n_expert_tensors));
        bad++;
    }
    double dt = now_s() - t0;
    if (bad == 0)
        printf("arena '%s' matches %s: %llu dense tensors and %llu blobs (%.2f GiB) in %.2f s\n",
               o.name, model, (unsigned long long)h->n_dense, (unsigned long long)blobs,
               GiB(h->source_bytes), dt);
    else
        printf("arena '%s' does NOT match %s: %d problem(s)%s\n", o.name, model, bad,
               bad >= 20 ? " (stopped at 20)" : "");
    gguf_close(f);
    arena_close(a);
    return bad ? 1 : 0;
}

/* pid_running: kill(pid, 0) succeeds on a zombie too, which a stopped server is until its parent
 * reaps it; /proc tells the two apart. */
static bool pid_running(pid_t pid)
{
    char path[64], buf[256];
    if (kill(pid, 0) != 0) return false;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

int arena_cli_status(int argc, char **argv)
{
    static const char usage[] = "usage: strata-arena status NAME [--runtime-dir DIR]\n"
                                "Asks the arena-server of NAME for its status.\n";
    struct name_opts o = {0};
    int st = parse_name_opts(argc, argv, ctl_longs, false, usage, &o);
    if (st >= 0) return st;
    struct msg reply = {0};
    int rv = arena_ctl_request(o.rdir, o.name, "status", false, 5000, &reply);
    if (rv != 0) return fail("status", o.name, rv);
    const msgpack_object_map *m = &reply.root.via.map;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) continue;
        if (k->via.str.size == 1 || (k->via.str.size == 2 && memcmp(k->via.str.ptr, "ok", 2) == 0))
            continue; /* the envelope's "v" and "ok" */
        printf("%-14.*s ", (int)k->via.str.size, k->via.str.ptr);
        msgpack_object_print(stdout, m->ptr[i].val);
        printf("\n");
    }
    msg_free(&reply);
    return 0;
}

int arena_cli_stop(int argc, char **argv)
{
    static const char usage[] =
        "usage: strata-arena stop NAME [--runtime-dir DIR] [--force]\n"
        "Asks the arena-server of NAME to shut down and waits for it to exit. Its segments stay\n"
        "while registered workers map them, unless --force.\n";
    struct name_opts o = {0};
    int st = parse_name_opts(argc, argv, ctl_longs, true, usage, &o);
    if (st >= 0) return st;
    struct msg reply = {0};
    int rv = arena_ctl_request(o.rdir, o.name, "shutdown", o.force, 5000, &reply);
    if (rv != 0) return fail("stop", o.name, rv);
    uint64_t pid = 0;
    msg_get_u64(&reply, NULL, "pid", INT32_MAX, &pid);
    msg_free(&reply);
    double t0 = now_s();
    while (pid && pid_running((pid_t)pid) && now_s() - t0 < 30) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    if (pid && pid_running((pid_t)pid)) {
        fprintf(stderr, "strata-arena stop: server pid %llu still runs after 30 s\n",
                (unsigned long long)pid);
        return 1;
    }
    printf("arena-server of '%s' (pid %llu) stopped\n", o.name, (unsigned long long)pid);
    return 0;
}
