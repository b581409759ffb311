/* arena_test — the arena end to end on tiny fixtures: layouts of every architecture and two type
 * mixes checked byte for byte by two other processes, generic expert tensors, adoption after kill
 * -9, refusal of a model that cannot fit, two servers racing for a name, status/stop over the
 * control socket, registered workers keeping the segments, the heat profile, inspect and verify.
 * Servers are the real strata-arena binary ($STRATA_BUILD_DIR); helpers are this binary re-executed
 * with --map-check. Every test uses its own shm and runtime directories under test_tmpdir(). nng is
 * never opened in this process (only the exec'd binaries use it). */
#include "arena-server/arena_build.h"
#include "arena-server/arena_fingerprint.h"
#include "common/arena/arena_layout.h"
#include "common/arena/model.h"
#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/quant/qtype.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char g_dir[600]; /* this test's private directory */
static char g_shm[700]; /* its shm directory */
static char g_run[700]; /* its runtime directory */

static void fresh_dirs(const char *tag)
{
    snprintf(g_dir, sizeof g_dir, "%s/%s", test_tmpdir(), tag);
    snprintf(g_shm, sizeof g_shm, "%s/shm", g_dir);
    snprintf(g_run, sizeof g_run, "%s/run", g_dir);
    mkdir(g_dir, 0700);
    mkdir(g_shm, 0700);
    mkdir(g_run, 0700);
}

static const char *arena_bin(void)
{
    static char path[1024];
    const char *b = getenv("STRATA_BUILD_DIR");
    snprintf(path, sizeof path, "%s/strata-arena", b && *b ? b : ".");
    ck_assert_msg(access(path, X_OK) == 0, "%s is missing: build the strata-arena target", path);
    return path;
}

/* spawn runs argv with stdout and stderr to log (appended); returns the pid. */
static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid, double timeout_s)
{
    int st;
    for (double t = 0; t < timeout_s; t += 0.01) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    ck_abort_msg("pid %d did not exit within %.0f s", (int)pid, timeout_s);
    return -1;
}

static int run_wait(char *const argv[], const char *log)
{
    return wait_exit(spawn(argv, log), 60);
}

static bool log_has(const char *log, const char *needle)
{
    char *s = test_read_file(log, NULL);
    bool found = s && strstr(s, needle);
    free(s);
    return found;
}

/* wait_ready polls until arena name in g_shm opens (READY) and so does its state segment (the
 * server publishes it after the arena), within 30 s. */
static void wait_ready(const char *name, pid_t server, const char *log)
{
    for (int i = 0; i < 3000; i++) {
        struct arena *a = NULL;
        struct arena_state *sst = NULL;
        if (arena_open(g_shm, name, &a) == 0 && arena_state_open(g_shm, name, &sst) == 0) {
            arena_close(a);
            arena_state_close(sst);
            return;
        }
        arena_close(a);
        int st;
        if (waitpid(server, &st, WNOHANG) == server) {
            char *s = test_read_file(log, NULL);
            ck_abort_msg("server exited before the arena was ready:\n%s", s ? s : "");
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    ck_abort_msg("arena %s not ready after 30 s", name);
}

static ino_t seg_inode(const char *name, const char *suffix)
{
    char seg[300], path[1100];
    struct stat st;
    shm_name(seg, sizeof seg, name, suffix);
    snprintf(path, sizeof path, "%s/%s", g_shm, seg);
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

static void make_fixture(const char *arch, const char *type, bool old_layout, const char *path)
{
    struct fixture_opts o = {
        .arch = arch, .type = type, .old_layout = old_layout, .seed = 7, .threads = 2};
    int rv = fixture_write(&o, path);
    ck_assert_msg(rv == 0, "fixture %s/%s: %s: %s", arch, type ? type : "q4_k_m",
                  strata_strerror(rv), strata_errdetail());
}

/* ---- the checker, run in helper processes ------------------------------------------------------
 */

/* map_check maps arena name of shm_dir read-only and compares every blob and dense tensor with the
 * GGUF; checks blobs are page-aligned and disjoint. Returns 0 and prints a summary, or 1. */
static int map_check(const char *shm_dir, const char *name, const char *model)
{
    struct arena *a = NULL;
    struct gguf_file *f = NULL;
    char tn[512];
    if (arena_open(shm_dir, name, &a) != 0 || gguf_open(model, &f) != 0) {
        fprintf(stderr, "open: %s\n", strata_errdetail());
        return 1;
    }
    const struct arena_header *h = a->hdr;
    const uint8_t *prev_end = NULL, *base = (const uint8_t *)h;
    uint64_t blobs = 0, parts = 0;
    for (uint32_t l = 0; l < h->n_layers; l++) {
        const struct arena_layer *L = arena_layer_get(a, l);
        for (uint32_t e = 0; L->n_parts && e < h->n_expert; e++, blobs++) {
            const uint8_t *b = arena_blob_at(a, l, e);
            if (((uintptr_t)b & 4095) != 0 || (prev_end && b < prev_end) ||
                b + L->stride > base + h->total_bytes || (uint64_t)(b - base) < h->expert_base) {
                fprintf(stderr, "blob (%u,%u) misplaced\n", l, e);
                return 1;
            }
            prev_end = b + L->stride;
            for (uint32_t p = 0; p < L->n_parts; p++, parts++) {
                const struct arena_part *P = &a->parts[L->part_first + p];
                arena_part_name(a, P, e, tn, sizeof tn);
                const struct gguf_tensor *t = gguf_tensor_find(f, tn);
                uint64_t skip = (P->flags & ARENA_PART_PER_EXPERT) ? 0 : (uint64_t)e * P->bytes;
                if (!t || memcmp(b + P->offset, t->data + skip, P->bytes) != 0) {
                    fprintf(stderr, "blob (%u,%u) part %s differs\n", l, e, tn);
                    return 1;
                }
            }
            if (arena_build_hash_blob(a, l, e) != arena_blob_hash(a, l, e)) {
                fprintf(stderr, "blob (%u,%u) hash differs\n", l, e);
                return 1;
            }
        }
    }
    for (uint64_t i = 0; i < h->n_dense; i++) {
        const struct arena_tensor *d = &a->dense[i];
        const struct gguf_tensor *t = gguf_tensor_find(f, arena_str(a, d->name_off));
        if (!t || t->nbytes != d->bytes || memcmp(base + d->offset, t->data, d->bytes) != 0) {
            fprintf(stderr, "dense %s differs\n", arena_str(a, d->name_off));
            return 1;
        }
    }
    printf("map-check ok: %llu blobs, %llu parts, %llu dense\n", (unsigned long long)blobs,
           (unsigned long long)parts, (unsigned long long)h->n_dense);
    gguf_close(f);
    arena_close(a);
    return blobs > 0 ? 0 : 1;
}

/* build_in_process plans and builds model into g_shm as name (the server's steps, minus serving).
 */
static void build_in_process(const char *model, const char *name, uint64_t align)
{
    struct gguf_file *f = NULL;
    struct arena_layout *L = NULL;
    struct shm_seg s;
    struct arena_build_stats st;
    char seg[300], tmp[320];
    ck_assert_int_eq(gguf_open(model, &f), 0);
    int rv = arena_layout_plan(f, align, model, &L);
    ck_assert_msg(rv == 0, "plan: %s", strata_errdetail());
    shm_name(seg, sizeof seg, name, "");
    snprintf(tmp, sizeof tmp, "%s.tmp", seg);
    struct arena_build_opts o = {.threads = 2, .chunk_bytes = 64 << 10};
    rv = arena_build_create(L, f, g_shm, tmp, &o, &s, &st);
    ck_assert_msg(rv == 0, "build: %s", strata_errdetail());
    ck_assert_uint_eq(st.bytes_read, L->hdr.source_bytes); /* fixtures have no alignment gaps */
    atomic_store_explicit(&((struct arena_header *)s.map)->state, ARENA_READY,
                          memory_order_release);
    ck_assert_int_eq(shm_publish(g_shm, &s, tmp, seg, 0400), 0);
    shm_close(&s);
    arena_layout_fini(L);
    gguf_close(f);
}

/* check_by_two maps the arena from two helper processes at once. */
static void check_by_two(const char *name, const char *model)
{
    char self[1024], log[800];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = '\0';
    char *argv[] = {self, "--map-check", g_shm, (char *)name, (char *)model, NULL};
    snprintf(log, sizeof log, "%s/check-%s.log", g_dir, name);
    pid_t a = spawn(argv, log), b = spawn(argv, log);
    int ra = wait_exit(a, 60), rb = wait_exit(b, 60);
    char *s = test_read_file(log, NULL);
    ck_assert_msg(ra == 0 && rb == 0, "helpers exited %d, %d:\n%s", ra, rb, s ? s : "");
    free(s);
}

/* ---- tests -------------------------------------------------------------------------------------
 */

static const struct {
    const char *arch, *type;
    bool old;
} cases[] = {
    {"qwen3moe", NULL, false}, {"qwen3moe", "q8_0", false}, {"llama", NULL, false},
    {"llama", "q8_0", true},   {"llama", NULL, true},       {"olmoe", NULL, false},
    {"olmoe", "q8_0", false},  {"qwen2moe", NULL, false},   {"qwen2moe", "q8_0", false},
};

START_TEST(every_arch_mapped_by_two_processes)
{
    char tag[64], model[800], name[64];
    snprintf(tag, sizeof tag, "arch%d", _i);
    fresh_dirs(tag);
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    snprintf(name, sizeof name, "t%d", _i);
    make_fixture(cases[_i].arch, cases[_i].type, cases[_i].old, model);
    build_in_process(model, name, ARENA_ALIGN_SMALL);
    struct arena *a = NULL;
    ck_assert_int_eq(arena_open(g_shm, name, &a), 0);
    ck_assert_uint_gt(a->hdr->n_expert, 1);
    /* Old-layout files must come out as the same blobs, marked per-expert. */
    const struct arena_layer *L0 = arena_layer_get(a, 0);
    ck_assert_uint_ge(L0->n_parts, 3);
    ck_assert_uint_eq(!!(a->parts[L0->part_first].flags & ARENA_PART_PER_EXPERT), cases[_i].old);
    char pn[256];
    arena_part_name(a, &a->parts[L0->part_first], 1, pn, sizeof pn);
    ck_assert_str_eq(pn, cases[_i].old ? "blk.0.ffn_gate.1.weight" : "blk.0.ffn_gate_exps.weight");
    arena_part_name(a, &a->parts[L0->part_first + 2], 0, pn, sizeof pn);
    ck_assert_ptr_nonnull(strstr(pn, "ffn_down"));
    /* The stored metadata parses with the GGUF reader and lists every tensor. */
    struct gguf_file *meta = NULL, *f = NULL;
    ck_assert_int_eq(arena_meta(a, &meta), 0);
    ck_assert_int_eq(gguf_open(model, &f), 0);
    ck_assert_uint_eq(meta->n_tensors, f->n_tensors);
    ck_assert_uint_eq(meta->n_kv, f->n_kv);
    /* The model over the arena exposes each blob through arena_blob_at, in the layout the model
     * over the file computes, with the same bytes in every part. */
    struct model *ma = NULL, *mf = NULL;
    ck_assert_msg(model_load_arena(a, meta, &ma) == 0, "%s", strata_errdetail());
    ck_assert_msg(model_load(f, &mf) == 0, "%s", strata_errdetail());
    for (uint32_t l = 0; l < ma->hp.n_layer; l++) {
        const struct model_blob_layout *ba = &ma->layers[l].blob, *bf = &mf->layers[l].blob;
        ck_assert_uint_eq(ba->bytes, arena_layer_get(a, l)->blob_bytes);
        ck_assert_uint_eq(ba->bytes, bf->bytes);
        for (uint32_t e = 0; e < ma->hp.n_expert; e++) {
            ck_assert_ptr_eq(model_expert_blob(ma, l, e), arena_blob_at(a, l, e));
            ck_assert_ptr_null(model_expert_blob(mf, l, e));
            for (int part = 0; part < MODEL_PART_COUNT; part++) {
                ck_assert_uint_eq(ba->part_off[part], bf->part_off[part]);
                const struct model_mat *pm = &ma->layers[l].part[part];
                ck_assert_ptr_eq(model_expert_part(ma, l, e, part),
                                 model_expert_blob(ma, l, e) + ba->part_off[part]);
                ck_assert(memcmp(model_expert_part(ma, l, e, part),
                                 model_expert_part(mf, l, e, part),
                                 pm->row_bytes * pm->n_out) == 0);
            }
        }
    }
    model_fini(ma);
    model_fini(mf);
    gguf_close(meta);
    gguf_close(f);
    arena_close(a);
    check_by_two(name, model);
}
END_TEST

/* A hand-made model with a fused gate_up tensor, a bias and mixed types, as newer archs have. */
START_TEST(generic_expert_tensors)
{
    fresh_dirs("generic");
    char model[800];
    snprintf(model, sizeof model, "%s/generic.gguf", g_dir);
    struct gguf_writer *w = NULL;
    const uint64_t n_exp = 3, d = 64, ff = 32;
    ck_assert_int_eq(gguf_writer_open(model, 0, &w), 0);
    gguf_w_str(w, "general.architecture", "test");
    gguf_w_u32(w, "test.expert_count", (uint32_t)n_exp);
    struct {
        const char *name;
        uint32_t type, n_dims;
        uint64_t ne[3];
    } ts[] = {
        {"token_embd.weight", QT_F32, 2, {d, 8, 1}},
        {"blk.1.ffn_down_exps.bias", QT_F32, 2, {d, n_exp, 1}},
        {"blk.1.ffn_down_exps.weight", QT_F16, 3, {ff, d, n_exp}},
        {"blk.1.ffn_gate_up_exps.weight", QT_Q8_0, 3, {d, 2 * ff, n_exp}},
        {"blk.1.ffn_gate_inp.weight", QT_F32, 2, {d, n_exp, 1}},
    };
    size_t total = 0, nb[5];
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(gguf_w_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne), 0);
        uint64_t row;
        qtype_row_bytes(ts[i].type, ts[i].ne[0], &row);
        nb[i] = row * ts[i].ne[1] * ts[i].ne[2];
        total += nb[i];
    }
    ck_assert_int_eq(gguf_writer_begin(w), 0);
    for (int i = 0; i < 5; i++) {
        uint8_t *buf = malloc(nb[i]);
        for (size_t k = 0; k < nb[i]; k++)
            buf[k] = (uint8_t)(k * 7 + i * 31 + (k >> 8));
        if (ts[i].type == QT_Q8_0) /* keep fp16 scales finite: zero every block's scale */
            for (size_t k = 0; k < nb[i]; k += 34)
                buf[k] = buf[k + 1] = 0;
        ck_assert_int_eq(gguf_writer_data(w, buf, nb[i]), 0);
        free(buf);
    }
    ck_assert_int_eq(gguf_writer_finish(w), 0);
    (void)total;
    build_in_process(model, "gen", ARENA_ALIGN_SMALL);
    struct arena *a = NULL;
    ck_assert_int_eq(arena_open(g_shm, "gen", &a), 0);
    ck_assert_uint_eq(a->hdr->n_layers, 2);
    ck_assert_ptr_null(arena_blob_at(a, 0, 0)); /* layer 0 has no experts */
    ck_assert_ptr_null(arena_blob_at(a, 1, 3)); /* expert out of range */
    const struct arena_layer *L = arena_layer_get(a, 1);
    ck_assert_uint_eq(L->n_parts, 3);
    const char *want[] = {"blk.1.ffn_gate_up_exps.weight", "blk.1.ffn_down_exps.weight",
                          "blk.1.ffn_down_exps.bias"};
    for (uint32_t p = 0; p < 3; p++) {
        const struct arena_part *P = &a->parts[L->part_first + p];
        ck_assert_str_eq(arena_str(a, P->name_off), want[p]);
        ck_assert_uint_eq(P->offset % ARENA_PART_ALIGN, 0);
    }
    ck_assert_uint_eq(a->parts[L->part_first].type, QT_Q8_0);
    ck_assert_uint_eq(a->parts[L->part_first + 2].n_dims, 1);
    ck_assert_uint_eq(a->parts[L->part_first + 2].bytes, d * 4);
    ck_assert_uint_eq(a->hdr->n_dense, 2);
    ck_assert_ptr_nonnull(arena_dense_find(a, "blk.1.ffn_gate_inp.weight"));
    ck_assert_ptr_null(arena_dense_find(a, "blk.1.ffn_down_exps.bias"));
    /* 64 rows of 68-byte q8_0 (4352), 256-aligned, + 32x64 f16 (4096) + a 64-float bias */
    ck_assert_uint_eq(L->blob_bytes, 4352 + 4096 + 256);
    ck_assert_uint_eq(L->stride, 12288);
    arena_close(a);
    check_by_two("gen", model);
}
END_TEST

START_TEST(align_2m_pads_every_blob)
{
    fresh_dirs("align2m");
    char model[800];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    make_fixture("qwen3moe", NULL, false, model);
    build_in_process(model, "big", ARENA_ALIGN_HUGE);
    struct arena *a = NULL;
    ck_assert_int_eq(arena_open(g_shm, "big", &a), 0);
    ck_assert_uint_eq(a->hdr->align, ARENA_ALIGN_HUGE);
    ck_assert_uint_eq(a->hdr->expert_base % ARENA_ALIGN_HUGE, 0);
    for (uint32_t e = 0; e < a->hdr->n_expert; e++)
        ck_assert_uint_eq(
            (uint64_t)(arena_blob_at(a, 0, e) - (const uint8_t *)a->hdr) % ARENA_ALIGN_HUGE, 0);
    arena_close(a);
}
END_TEST

/* serve_argv fills argv for `strata-arena serve model --name name` in this test's directories. */
static void serve_argv(char **argv, const char *model, const char *name, const char *extra)
{
    static char prof[800];
    snprintf(prof, sizeof prof, "%s/heat.profile", g_dir);
    int i = 0;
    argv[i++] = (char *)arena_bin();
    argv[i++] = "serve";
    argv[i++] = (char *)model;
    argv[i++] = "--name";
    argv[i++] = (char *)name;
    argv[i++] = "--shm-dir";
    argv[i++] = g_shm;
    argv[i++] = "--runtime-dir";
    argv[i++] = g_run;
    argv[i++] = "--profile";
    argv[i++] = prof;
    if (extra) argv[i++] = (char *)extra;
    argv[i] = NULL;
}

START_TEST(kill9_then_adopt_without_reading)
{
    fresh_dirs("adopt");
    char model[800], log1[800], log2[800], *argv[16];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    snprintf(log1, sizeof log1, "%s/serve1.log", g_dir);
    snprintf(log2, sizeof log2, "%s/serve2.log", g_dir);
    make_fixture("qwen3moe", NULL, false, model);
    serve_argv(argv, model, "m", NULL);
    pid_t s1 = spawn(argv, log1);
    wait_ready("m", s1, log1);
    ino_t ino = seg_inode("m", "");
    ck_assert_uint_ne(ino, 0);
    kill(s1, SIGKILL);
    ck_assert_int_eq(wait_exit(s1, 10), 128 + SIGKILL);

    pid_t s2 = spawn(argv, log2);
    for (int i = 0; i < 1000 && !log_has(log2, "serving arena"); i++)
        usleep(10000);
    char *out = test_read_file(log2, NULL);
    ck_assert_msg(out && strstr(out, "adopted arena 'm'") && strstr(out, "no tensor data read"),
                  "no adoption:\n%s", out ? out : "");
    ck_assert_msg(!strstr(out, "built arena"), "rebuilt instead of adopting:\n%s", out);
    const char *at = strstr(out, " in ");
    printf("adoption log: %.*s\n", (int)(strchr(at, '\n') - at), at);
    free(out);
    ck_assert_uint_eq(seg_inode("m", ""), ino); /* the same segment: nothing was rebuilt */
    struct arena_state *st = NULL;
    ck_assert_int_eq(arena_state_open(g_shm, "m", &st), 0);
    ck_assert_uint_eq(atomic_load(&st->hdr->adoptions), 1);
    ck_assert_int_eq(atomic_load(&st->hdr->server_pid), s2);
    arena_state_close(st);
    kill(s2, SIGTERM);
    ck_assert_int_eq(wait_exit(s2, 20), 0);
    ck_assert_uint_eq(seg_inode("m", ""), 0); /* no workers: removed at exit */
    ck_assert_uint_eq(seg_inode("m", ".state"), 0);
    /* no worker ever added heat (as when every worker refuses a broken model): no profile file */
    char prof[800];
    snprintf(prof, sizeof prof, "%s/heat.profile", g_dir);
    ck_assert_msg(access(prof, F_OK) != 0, "%s was written with no heat in it", prof);
}
END_TEST

/* A model whose tensors declare 2 TiB (a sparse file) must be refused before any read. */
START_TEST(too_big_refused_before_reading)
{
    fresh_dirs("toobig");
    char model[800], log[800], *argv[16];
    snprintf(model, sizeof model, "%s/huge.gguf", g_dir);
    snprintf(log, sizeof log, "%s/serve.log", g_dir);
    FILE *fp = fopen(model, "wb");
    ck_assert_ptr_nonnull(fp);
    uint32_t u32;
    uint64_t u64;
#define W(v, n) fwrite(&(v), 1, n, fp)
    fwrite("GGUF", 1, 4, fp);
    u32 = 3, W(u32, 4);
    u64 = 1, W(u64, 8); /* tensors */
    u64 = 1, W(u64, 8); /* kv */
    u64 = 20, W(u64, 8);
    fwrite("general.architecture", 1, 20, fp);
    u32 = GGUF_STRING, W(u32, 4);
    u64 = 4, W(u64, 8);
    fwrite("test", 1, 4, fp);
    u64 = 17, W(u64, 8);
    fwrite("token_embd.weight", 1, 17, fp);
    u32 = 2, W(u32, 4);
    u64 = 1 << 20, W(u64, 8);
    u64 = 1 << 19, W(u64, 8); /* 2^39 f32 = 2 TiB */
    u32 = QT_F32, W(u32, 4);
    u64 = 0, W(u64, 8);
#undef W
    long hdr = ftell(fp);
    fclose(fp);
    long data = (hdr + 31) / 32 * 32;
    ck_assert_int_eq(truncate(model, data + (2ll << 40)), 0);
    serve_argv(argv, model, "huge", NULL);
    ck_assert_int_eq(run_wait(argv, log), 1);
    char *out = test_read_file(log, NULL);
    ck_assert_msg(out && strstr(out, "arena needs 2048.0 GiB") && strstr(out, "GiB free"),
                  "no helpful refusal:\n%s", out ? out : "");
    free(out);
    ck_assert_uint_eq(seg_inode("huge", ""), 0);
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "ls %s | grep -q tmp", g_shm);
    ck_assert_int_ne(system(tmp), 0); /* no temporary segment was created */
}
END_TEST

/* shm_entries counts the files in g_shm. */
static int shm_entries(void)
{
    DIR *d = opendir(g_shm);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* The shm directory filling up during a build (the k-th block allocation fails, for every k: the
 * tables' in the main thread, the readers', the sweep's) is refused with the helpful message and
 * leaves no segment; without the failure every byte of the segment is allocated (a reader touching
 * a hole of a full tmpfs would get SIGBUS). */
START_TEST(enospc_during_build_refused_cleanly)
{
    fresh_dirs("enospc");
    char model[800];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    make_fixture("qwen3moe", "f32", false, model);
    struct gguf_file *f = NULL;
    struct arena_layout *L = NULL;
    ck_assert_int_eq(gguf_open(model, &f), 0);
    ck_assert_int_eq(arena_layout_plan(f, ARENA_ALIGN_SMALL, model, &L), 0);
    uint64_t blocks = (L->hdr.total_bytes + (2u << 20) - 1) / (2u << 20);
    ck_assert_uint_ge(blocks, 4);
    for (uint64_t k = 1; k <= blocks + 1; k++) {
        struct shm_seg s;
        struct arena_build_stats st;
        struct arena_build_opts o = {.threads = 3, .chunk_bytes = 256 << 10, .fail_reserve = k};
        int rv = arena_build_create(L, f, g_shm, "strata-test-enospc.tmp", &o, &s, &st);
        if (k > blocks) { /* no allocation failed */
            ck_assert_msg(rv == 0, "build: %s", strata_errdetail());
            struct stat sb;
            ck_assert_int_eq(fstat((int)s.h, &sb), 0);
            ck_assert_uint_ge((uint64_t)sb.st_blocks * 512, L->hdr.total_bytes);
            ck_assert_uint_eq(st.bytes_read, L->hdr.source_bytes);
            shm_close(&s);
            ck_assert_int_eq(shm_remove(g_shm, "strata-test-enospc.tmp"), 0);
            break;
        }
        ck_assert_msg(rv == STRATA_ENOSPC, "k=%llu: %s: %s", (unsigned long long)k,
                      strata_strerror(rv), strata_errdetail());
        const char *d = strata_errdetail();
        ck_assert_msg(strstr(d, "arena needs ") && strstr(d, "iB free") && strstr(d, "--shm-dir") &&
                          (k == 1 || strstr(d, "were allocated")),
                      "k=%llu: %s", (unsigned long long)k, d);
        /* a fixture's few MiB are told in MiB, not as "needs 0.0 GiB" */
        ck_assert_msg(strstr(d, " MiB, ") && !strstr(d, "needs 0.0 GiB"), "k=%llu: %s",
                      (unsigned long long)k, d);
        ck_assert(!shm_is_open(&s));
        ck_assert_ptr_null(s.map);
        ck_assert_int_eq(shm_entries(), 0);
    }
    ck_assert_int_eq(shm_entries(), 0);
    arena_layout_fini(L);
    gguf_close(f);
}
END_TEST

START_TEST(two_servers_one_wins)
{
    fresh_dirs("race");
    char model[800], log1[800], log2[800], *argv[16];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    snprintf(log1, sizeof log1, "%s/a.log", g_dir);
    snprintf(log2, sizeof log2, "%s/b.log", g_dir);
    make_fixture("olmoe", NULL, false, model);
    serve_argv(argv, model, "race", NULL);
    pid_t a = spawn(argv, log1), b = spawn(argv, log2);
    int st, loser_rv = -1;
    pid_t loser = 0, winner = 0;
    for (int i = 0; i < 3000 && !loser; i++) {
        if (waitpid(a, &st, WNOHANG) == a)
            loser = a, winner = b;
        else if (waitpid(b, &st, WNOHANG) == b)
            loser = b, winner = a;
        else
            usleep(10000);
    }
    ck_assert_msg(loser != 0, "neither server gave up");
    loser_rv = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    ck_assert_int_eq(loser_rv, 1);
    ck_assert_msg(log_has(loser == a ? log1 : log2, "is already served by pid"),
                  "the loser did not say why");
    wait_ready("race", winner, winner == a ? log1 : log2);
    check_by_two("race", model);
    kill(winner, SIGTERM);
    ck_assert_int_eq(wait_exit(winner, 20), 0);
}
END_TEST

START_TEST(control_socket_workers_and_profile)
{
    fresh_dirs("ctl");
    char model[800], log[800], out[800], prof[800], *argv[16];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    snprintf(log, sizeof log, "%s/serve.log", g_dir);
    snprintf(out, sizeof out, "%s/client.log", g_dir);
    snprintf(prof, sizeof prof, "%s/heat.profile", g_dir);
    make_fixture("qwen2moe", NULL, false, model);
    serve_argv(argv, model, "c", NULL);
    pid_t s = spawn(argv, log);
    wait_ready("c", s, log);

    /* This process registers as a worker and adds heat, as a worker would. */
    struct arena_state *st = NULL;
    int slot = -1;
    ck_assert_int_eq(arena_state_open(g_shm, "c", &st), 0);
    ck_assert_int_eq(arena_worker_register(st, 0, "ipc:///tmp/w0", 1 << 30, 64, &slot), 0);
    arena_heat_add(st, 1, 2, 40);
    arena_heat_add(st, 0, 0, 2);

    char *status[] = {(char *)arena_bin(), "status", "c", "--runtime-dir", g_run, NULL};
    for (int i = 0; i < 200 && run_wait(status, out) != 0; i++)
        usleep(20000);
    char *text = test_read_file(out, NULL);
    ck_assert_msg(text && strstr(text, "fingerprint") && strstr(text, "ipc:///tmp/w0") &&
                      strstr(text, "heat_total     42"),
                  "status output:\n%s", text ? text : "");
    free(text);

    /* A live registered worker keeps the segments through a plain stop. */
    char *stop[] = {(char *)arena_bin(), "stop", "c", "--runtime-dir", g_run, NULL};
    ck_assert_int_eq(run_wait(stop, out), 0);
    ck_assert_int_eq(wait_exit(s, 20), 0);
    ck_assert_msg(log_has(log, "still map arena 'c'"), "no warning about the worker");
    ck_assert_uint_ne(seg_inode("c", ""), 0);
    ck_assert_msg(access(prof, R_OK) == 0, "no heat profile at %s", prof);

    /* The next server adopts it; the worker leaves; stop removes everything. */
    s = spawn(argv, log);
    for (int i = 0; i < 1000 && !log_has(log, "adopted arena 'c'"); i++)
        usleep(10000);
    ck_assert_msg(log_has(log, "adopted arena 'c'"), "second server did not adopt");
    ck_assert_uint_eq(atomic_load(&st->heat[1 * st->hdr->n_expert + 2]), 40);
    arena_worker_unregister(st, slot);
    arena_state_close(st);
    for (int i = 0; i < 200 && run_wait(stop, out) != 0; i++)
        usleep(20000);
    ck_assert_int_eq(wait_exit(s, 20), 0);
    ck_assert_uint_eq(seg_inode("c", ""), 0);

    /* A fresh build loads the profile saved at exit. */
    s = spawn(argv, log);
    wait_ready("c", s, log);
    for (int i = 0; i < 500 && !log_has(log, "heat profile"); i++)
        usleep(10000);
    ck_assert_int_eq(arena_state_open(g_shm, "c", &st), 0);
    ck_assert_uint_eq(atomic_load(&st->heat[1 * st->hdr->n_expert + 2]), 40);
    ck_assert_uint_eq(atomic_load(&st->hdr->heat_total), 42);
    arena_state_close(st);
    kill(s, SIGTERM);
    ck_assert_int_eq(wait_exit(s, 20), 0);
}
END_TEST

START_TEST(inspect_json_and_verify)
{
    fresh_dirs("inspect");
    char model[800], log[800], out[800];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    snprintf(log, sizeof log, "%s/serve.log", g_dir);
    snprintf(out, sizeof out, "%s/inspect.json", g_dir);
    make_fixture("llama", NULL, true, model);
    build_in_process(model, "i", ARENA_ALIGN_SMALL);

    char *inspect[] = {(char *)arena_bin(), "inspect", "i", "--shm-dir", g_shm, "--json", NULL};
    ck_assert_int_eq(run_wait(inspect, out), 0);
    json_error_t jerr;
    json_t *j = json_load_file(out, 0, &jerr);
    ck_assert_msg(j, "inspect --json is not JSON: %s", jerr.text);
    struct arena *a = NULL;
    ck_assert_int_eq(arena_open(g_shm, "i", &a), 0);
    json_t *blobs = json_object_get(j, "blobs");
    ck_assert_uint_eq(json_array_size(blobs), (uint64_t)a->hdr->n_layers * a->hdr->n_expert);
    ck_assert_uint_eq(json_integer_value(json_object_get(j, "align")), 4096);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "dense")), a->hdr->n_dense);
    size_t i;
    json_t *b;
    json_array_foreach(blobs, i, b)
    {
        uint32_t l = (uint32_t)json_integer_value(json_object_get(b, "layer"));
        uint32_t e = (uint32_t)json_integer_value(json_object_get(b, "expert"));
        uint64_t off = (uint64_t)json_integer_value(json_object_get(b, "offset"));
        ck_assert_uint_eq(off % 4096, 0);
        ck_assert_ptr_eq(arena_blob_at(a, l, e), (const uint8_t *)a->hdr + off);
        json_t *p0 = json_array_get(json_object_get(b, "parts"), 0);
        char want[64];
        snprintf(want, sizeof want, "blk.%u.ffn_gate.%u.weight", l, e);
        ck_assert_str_eq(json_string_value(json_object_get(p0, "tensor")), want);
    }
    json_decref(j);
    arena_close(a);

    char *verify[] = {(char *)arena_bin(), "verify", "i", "--shm-dir", g_shm, NULL};
    ck_assert_int_eq(run_wait(verify, log), 0);
    ck_assert_msg(log_has(log, "matches"), "verify did not report a match");
}
END_TEST

START_TEST(check_refuses_bad_images)
{
    uint8_t *img = calloc(1, 8192);
    struct arena_header *h = (struct arena_header *)img;
    ck_assert_int_eq(arena_check(img, 8192), STRATA_EFORMAT);
    memcpy(h->magic, ARENA_MAGIC, 8);
    h->version_major = ARENA_VERSION_MAJOR + 1;
    ck_assert_int_eq(arena_check(img, 8192), STRATA_EPROTO);
    h->version_major = ARENA_VERSION_MAJOR;
    atomic_store(&h->state, ARENA_BUILDING);
    ck_assert_int_eq(arena_check(img, 8192), STRATA_ESTATE);
    atomic_store(&h->state, ARENA_READY);
    h->total_bytes = 8192;
    h->align = 4096;
    h->strings_off = 4096;
    h->strings_bytes = 1;
    ck_assert_int_eq(arena_check(img, 8192), 0);
    h->n_layers = 1;
    h->n_expert = 2;
    h->layers_off = 4104;
    h->hashes_off = 4160;
    struct arena_layer *L = (struct arena_layer *)(img + h->layers_off);
    L->n_parts = 1;
    L->blob_bytes = 100;
    L->stride = 4096;
    h->n_parts = 1;
    h->parts_off = 4200;
    h->expert_base = 4096;
    h->expert_bytes = 4096; /* two blobs of 4096 do not fit */
    ck_assert_int_eq(arena_check(img, 8192), STRATA_EFORMAT);
    free(img);
}
END_TEST

/* ---- another local user ------------------------------------------------------------------------
 * A child switched to an unused uid (tests/testutil.h; root only, as CI runs) plays the user who
 * shares /dev/shm with us. */

/* shared_shm makes g_shm a directory every user may write (mode) and the model readable by all. */
static void shared_shm(mode_t mode, const char *model)
{
    ck_assert_int_eq(chmod(test_tmpdir(), 0711), 0);
    ck_assert_int_eq(chmod(g_dir, 0711), 0);
    ck_assert_int_eq(chmod(g_shm, mode), 0);
    if (model) ck_assert_int_eq(chmod(model, 0644), 0);
}

struct plant {
    const char *model;
    char seg[300]; /* the victim's segment name: strata-<victim uid>-<name> */
};

/* plant_arena (as the other user) builds a READY arena of model with the fingerprint a server of
 * it expects, all from facts anyone can read, and publishes it under the victim's name. */
static int plant_arena(void *ctx)
{
    const struct plant *p = ctx;
    struct gguf_file *f = NULL;
    struct arena_layout *L = NULL;
    struct shm_seg s = SHM_SEG_INIT;
    struct arena_build_stats st;
    char tmp[320];
    snprintf(tmp, sizeof tmp, "%s.planting", p->seg);
    struct arena_build_opts o = {.threads = 1};
    if (gguf_open(p->model, &f) != 0 ||
        arena_layout_plan(f, ARENA_ALIGN_SMALL, p->model, &L) != 0 ||
        arena_build_create(L, f, g_shm, tmp, &o, &s, &st) != 0) {
        fprintf(stderr, "plant: %s\n", strata_errdetail());
        return 1;
    }
    struct arena_header *h = (struct arena_header *)s.map;
    h->fingerprint = arena_fingerprint(f, ARENA_ALIGN_SMALL);
    atomic_store_explicit(&h->state, ARENA_READY, memory_order_release);
    int rv = shm_publish(g_shm, &s, tmp, p->seg, 0444);
    shm_close(&s);
    arena_layout_fini(L);
    gguf_close(f);
    return rv == 0 ? 0 : 1;
}

/* A segment planted under our name by another user is neither adopted nor removed: the server
 * and every reader (the worker's and the frontend's arena_open) refuse it, naming file and owner.
 */
START_TEST(planted_segment_refused)
{
    fresh_dirs("planted");
    char model[800], log[800], want[64], *argv[16];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    snprintf(log, sizeof log, "%s/serve.log", g_dir);
    make_fixture("qwen3moe", "q8_0", false, model);
    shared_shm(01777, model);
    struct plant p = {.model = model};
    shm_name(p.seg, sizeof p.seg, "m", "");
    int rv = test_as_other_user("planted_segment_refused", plant_arena, &p);
    if (rv < 0) return;
    ck_assert_int_eq(rv, 0);
    serve_argv(argv, model, "m", NULL);
    pid_t srv = spawn(argv, log);
    int code = wait_exit(srv, 60);
    if (code < 0) kill(srv, SIGKILL), wait_exit(srv, 10);
    char *out = test_read_file(log, NULL);
    snprintf(want, sizeof want, "is owned by uid %u (no account)", test_other_uid());
    ck_assert_msg(code == 1 && out && strstr(out, want) && strstr(out, p.seg) &&
                      !strstr(out, "adopted arena"),
                  "exit %d, the planted arena was not refused:\n%s", code, out ? out : "");
    free(out);
    ck_assert_uint_ne(seg_inode("m", ""), 0); /* still there: not ours to remove */
    struct arena *a = NULL;
    ck_assert_int_eq(arena_open(g_shm, "m", &a), STRATA_EPERM);
    ck_assert_msg(strstr(strata_errdetail(), want), "%s", strata_errdetail());
}
END_TEST

struct link_to {
    const char *target;
    char link[1100];
};

static int plant_link(void *ctx)
{
    const struct link_to *l = ctx;
    return symlink(l->target, l->link) == 0 ? 0 : 1;
}

/* A symlink planted at the lock file's name (in a shared --shm-dir) is refused, and the file it
 * points to is not truncated; the same for a planted state segment. */
START_TEST(planted_lock_symlink_refused)
{
    fresh_dirs("lock-link");
    char model[800], log[800], precious[800], seg[300], *argv[16];
    snprintf(model, sizeof model, "%s/model.gguf", g_dir);
    snprintf(log, sizeof log, "%s/serve.log", g_dir);
    snprintf(precious, sizeof precious, "%s/precious", g_dir);
    make_fixture("qwen3moe", "q8_0", false, model);
    FILE *fp = fopen(precious, "w");
    ck_assert_ptr_nonnull(fp);
    fputs("keep me", fp);
    fclose(fp);
    /* not sticky: fs.protected_symlinks would otherwise stop the follow on some hosts and hide
     * the bug */
    shared_shm(0777, model);
    struct link_to l = {.target = precious};
    shm_name(seg, sizeof seg, "m", ".lock");
    snprintf(l.link, sizeof l.link, "%s/%s", g_shm, seg);
    int rv = test_as_other_user("planted_lock_symlink_refused", plant_link, &l);
    if (rv < 0) return;
    ck_assert_int_eq(rv, 0);
    serve_argv(argv, model, "m", NULL);
    pid_t srv = spawn(argv, log);
    int code = wait_exit(srv, 60);
    if (code < 0) kill(srv, SIGKILL), wait_exit(srv, 10);
    char *out = test_read_file(log, NULL), *kept = test_read_file(precious, NULL);
    ck_assert_msg(code == 1 && out && strstr(out, "is a symbolic link") && strstr(out, l.link),
                  "exit %d, the planted lock was not refused:\n%s", code, out ? out : "");
    ck_assert_str_eq(kept, "keep me");
    free(out);
    free(kept);
}
END_TEST

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--map-check") == 0)
        return map_check(argv[2], argv[3], argv[4]);
    Suite *s = suite_create("arena");
    TCase *tc = tcase_create("layout");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, every_arch_mapped_by_two_processes, 0,
                        (int)(sizeof cases / sizeof cases[0]));
    tcase_add_test(tc, generic_expert_tensors);
    tcase_add_test(tc, align_2m_pads_every_blob);
    tcase_add_test(tc, check_refuses_bad_images);
    tcase_add_test(tc, enospc_during_build_refused_cleanly);
    suite_add_tcase(s, tc);
    TCase *srv = tcase_create("server");
    tcase_set_timeout(srv, 120);
    tcase_add_test(srv, kill9_then_adopt_without_reading);
    tcase_add_test(srv, too_big_refused_before_reading);
    tcase_add_test(srv, two_servers_one_wins);
    tcase_add_test(srv, control_socket_workers_and_profile);
    tcase_add_test(srv, inspect_json_and_verify);
    suite_add_tcase(s, srv);
    TCase *own = tcase_create("other_user");
    tcase_set_timeout(own, 180);
    tcase_add_test(own, planted_segment_refused);
    tcase_add_test(own, planted_lock_symlink_refused);
    suite_add_tcase(s, own);
    return test_run(s);
}
