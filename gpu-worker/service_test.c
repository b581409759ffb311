/* service_test — strata-worker at the protocol level: the service and worker run inside the test
 * (nng only inside tests), clients speak through common/ipc/wclient.h or raw ipc calls. A tiny qwen3moe
 * fixture is written once before the tests fork; each test uses its own runtime directory. */
#include "arena-server/arena_serve.h"
#include "common/arena/arena.h"
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/ipc/ipc.h"
#include "common/ipc/msg.h"
#include "common/ipc/wclient.h"
#include "gpu-worker/service.h"
#include "gpu-worker/worker.h"
#include "tests/testutil.h"
#include "tools/fixture.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#define N_CTX      256
#define N_STREAMS  16
#define GEN_TOKENS 24

static char g_model[600];

/* rundir makes a fresh runtime directory for a test. */
static const char *rundir(const char *tag)
{
    static char dir[700];
    snprintf(dir, sizeof dir, "%s/run-%s", test_tmpdir(), tag);
    mkdir(dir, 0700);
    return dir;
}

static struct worker *start_with(const char *run, int orphan_s, const struct backend_opts *bo)
{
    struct worker_config c = {.model = g_model,
                              .runtime_dir = run,
                              .ctx = N_CTX,
                              .max_seqs = N_STREAMS,
                              .orphan_timeout_s = orphan_s,
                              .watchdog_ms = -1,
                              .backend = *bo};
    struct worker *w;
    int rv = worker_init(&c, &w);
    ck_assert_msg(rv == 0, "worker_init: %s: %s", strata_strerror(rv), strata_errdetail());
    return w;
}

static struct worker *start(const char *run, int orphan_s)
{
    const struct backend_opts none = {0};
    return start_with(run, orphan_s, &none);
}

static struct wclient *client(const char *url)
{
    struct wclient_opts o = {.timeout_ms = 3000, .poll_wait_ms = 1000, .resume_wait_ms = 15000};
    struct wclient *c;
    ck_assert_int_eq(wclient_open(url, &o, &c), 0);
    return c;
}

/* prompt_of fills a prompt that differs per k. */
static void prompt_of(int k, int32_t *p, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = (int32_t)((k * 131 + i * 17 + 5) % 200 + 1);
}

static void req_of(struct wclient_req *r, const char *id, const int32_t *prompt, uint32_t n,
                   uint32_t max_tokens)
{
    memset(r, 0, sizeof *r);
    r->id = id;
    r->prompt = prompt;
    r->n_prompt = n;
    r->max_tokens = max_tokens;
    wclient_sampling_default(&r->sampling);
}

/* take appends an update's tokens to out[*n..]. */
static void take(int32_t *out, uint32_t *n, const struct wclient_update *u)
{
    if (u->n_tokens) memcpy(out + *n, u->tokens, u->n_tokens * sizeof *out);
    *n += u->n_tokens;
}

/* run_stream streams r to its end and returns how many ids it wrote to out (cap max_tokens). */
static uint32_t run_stream(struct wclient *c, const struct wclient_req *r, int32_t *out,
                           enum wclient_finish *fin)
{
    struct wclient_stream *s;
    int rv = wclient_stream_start(c, r, &s);
    ck_assert_msg(rv == 0, "stream_start %s: %s: %s", r->id, strata_strerror(rv),
                  strata_errdetail());
    uint32_t n = 0;
    const struct wclient_update *u;
    do {
        rv = wclient_stream_next(s, &u);
        ck_assert_msg(rv == 0, "stream_next %s: %s: %s", r->id, strata_strerror(rv),
                      strata_errdetail());
        ck_assert_uint_eq(u->from, n);
        ck_assert_uint_le(n + u->n_tokens, r->max_tokens);
        take(out, &n, u);
    } while (u->finish == WCLIENT_RUNNING);
    *fin = u->finish;
    wclient_stream_free(s);
    return n;
}

/* ---- hello, meta, status, vram, idempotence ----------------------------------------------------
 */

START_TEST(test_hello_meta)
{
    struct worker *w = start(rundir("hello"), 0);
    struct wclient *c = client(worker_url(w));
    struct wclient_hello h;
    int rv = wclient_hello(c, &h);
    ck_assert_msg(rv == 0, "%s", strata_errdetail());
    ck_assert_str_eq(h.arch, "qwen3moe");
    ck_assert_str_eq(h.backend, "cpu");
    ck_assert_str_eq(h.kv_type, "f32");
    ck_assert_uint_eq(h.n_ctx, N_CTX);
    ck_assert_uint_eq(h.max_seqs, N_STREAMS);
    ck_assert_int_eq(h.pid, getpid());
    ck_assert(h.bit_exact);
    struct wclient_meta m;
    ck_assert_int_eq(wclient_meta(c, &m), 0);
    ck_assert_uint_eq(m.n_ctx, N_CTX);
    ck_assert(m.fingerprint == h.fingerprint);
    ck_assert(XXH3_64bits(m.bytes, m.len) == h.fingerprint);
    struct gguf_str arch;
    ck_assert_int_eq(gguf_get_str(m.gguf, "general.architecture", &arch), 0);
    ck_assert_int_eq(memcmp(arch.ptr, "qwen3moe", arch.len), 0);
    ck_assert(gguf_find(m.gguf, "tokenizer.ggml.tokens") != NULL);
    /* the file's header bytes, as an arena would store them */
    struct gguf_file *f;
    ck_assert_int_eq(gguf_open(g_model, &f), 0);
    ck_assert_int_eq(memcmp(m.bytes, f->splits[0].map, f->header_bytes), 0);
    gguf_close(f);
    wclient_meta_free(&m);
    wclient_close(c);
    worker_fini(w);
}
END_TEST

START_TEST(test_idempotent_status_vram)
{
    struct worker *w = start(rundir("idem"), 0);
    struct wclient *c = client(worker_url(w));
    int32_t p[8];
    prompt_of(1, p, 8);
    struct wclient_req r;
    req_of(&r, "dup", p, 8, 8);
    r.sampling.temperature = 0.7f;
    uint64_t s1, s2;
    bool ex;
    ck_assert_int_eq(wclient_submit(c, &r, &s1, &ex), 0);
    ck_assert(!ex);
    ck_assert_int_eq(wclient_submit(c, &r, &s2, &ex), 0); /* a resend: the same request */
    ck_assert(ex);
    ck_assert(s1 == s2);
    r.id = "seeded";
    r.sampling.has_seed = true;
    r.sampling.seed = 42;
    ck_assert_int_eq(wclient_submit(c, &r, &s2, &ex), 0);
    ck_assert(s2 == 42 && !ex);
    ck_assert_int_eq(wclient_cancel(c, "never-submitted"), 0);
    ck_assert_int_eq(wclient_cancel(c, "dup"), 0);
    ck_assert_int_eq(wclient_cancel(c, "dup"), 0);
    const char *ids[] = {"dup", "seeded", "nobody"};
    uint32_t from[] = {0, 0, 0};
    struct wclient_poll_result pr;
    ck_assert_int_eq(wclient_poll(c, ids, from, 3, 2000, &pr), 0);
    ck_assert_uint_eq(pr.n, 3);
    ck_assert_int_eq(pr.u[0].code, 0);
    ck_assert_int_eq(pr.u[2].code, STRATA_ENOENT);
    wclient_poll_free(&pr);
    struct wclient_status st;
    ck_assert_int_eq(wclient_status(c, &st), 0);
    ck_assert_uint_eq(st.requests, 2);
    ck_assert_uint_eq(st.max_seqs, N_STREAMS);
    ck_assert_uint_gt(st.kv_blocks_total, 0);
    ck_assert_str_eq(st.spec, "off"); /* no drafter: serve_test sees one at work */
    ck_assert_uint_eq(st.drafts_proposed, 0);
    struct wclient_vram v;
    ck_assert_int_eq(wclient_vram(c, false, 0, &v), 0);
    ck_assert_str_eq(v.backend, "cpu");
    ck_assert_uint_gt(v.weights_bytes, 0);
    ck_assert_int_eq(wclient_vram(c, true, 1 << 20, &v), STRATA_EUNSUPPORTED);
    wclient_close(c);
    worker_fini(w);
}
END_TEST

/* ---- many concurrent streams -------------------------------------------------------------------
 */

struct job {
    struct wclient *c;
    int k;
    int32_t out[GEN_TOKENS];
    uint32_t n;
    enum wclient_finish fin;
};

static void *job_run(void *arg)
{
    struct job *j = arg;
    int32_t p[40];
    char id[32];
    uint32_t np = 4 + (uint32_t)j->k * 2;
    prompt_of(j->k, p, np);
    snprintf(id, sizeof id, "conc-%d", j->k);
    struct wclient_req r;
    req_of(&r, id, p, np, GEN_TOKENS);
    j->n = run_stream(j->c, &r, j->out, &j->fin);
    return NULL;
}

START_TEST(test_concurrent_streams)
{
    struct worker *w = start(rundir("conc"), 0);
    struct wclient *c = client(worker_url(w));
    static struct job jobs[N_STREAMS];
    pthread_t th[N_STREAMS];
    for (int k = 0; k < N_STREAMS; k++) {
        jobs[k] = (struct job){.c = c, .k = k};
        ck_assert_int_eq(pthread_create(&th[k], NULL, job_run, &jobs[k]), 0);
    }
    for (int k = 0; k < N_STREAMS; k++)
        pthread_join(th[k], NULL);
    /* each alone, one after the other: bit-exact means the batch changed nothing */
    for (int k = 0; k < N_STREAMS; k++) {
        int32_t p[40], out[GEN_TOKENS];
        char id[32];
        uint32_t np = 4 + (uint32_t)k * 2;
        enum wclient_finish fin;
        prompt_of(k, p, np);
        snprintf(id, sizeof id, "alone-%d", k);
        struct wclient_req r;
        req_of(&r, id, p, np, GEN_TOKENS);
        uint32_t n = run_stream(c, &r, out, &fin);
        ck_assert_uint_eq(jobs[k].n, GEN_TOKENS);
        ck_assert_int_eq(jobs[k].fin, WCLIENT_LENGTH);
        ck_assert_uint_eq(n, jobs[k].n);
        ck_assert_int_eq(fin, jobs[k].fin);
        ck_assert_msg(memcmp(out, jobs[k].out, n * sizeof *out) == 0,
                      "stream %d: ids in a batch of 16 differ from its ids alone", k);
    }
    struct wclient_status st;
    ck_assert_int_eq(wclient_status(c, &st), 0);
    ck_assert_uint_eq(st.requests, 2 * N_STREAMS);
    ck_assert_uint_eq(st.tokens_generated, 2 * N_STREAMS * GEN_TOKENS);
    wclient_close(c);
    worker_fini(w);
}
END_TEST

/* streams_of runs N_STREAMS concurrent streams on a worker made with bo into jobs. */
static void streams_of(const char *tag, const struct backend_opts *bo, struct job *jobs,
                       struct wclient_status *st)
{
    struct worker *w = start_with(rundir(tag), 0, bo);
    struct wclient *c = client(worker_url(w));
    pthread_t th[N_STREAMS];
    for (int k = 0; k < N_STREAMS; k++) {
        jobs[k] = (struct job){.c = c, .k = k};
        ck_assert_int_eq(pthread_create(&th[k], NULL, job_run, &jobs[k]), 0);
    }
    for (int k = 0; k < N_STREAMS; k++)
        pthread_join(th[k], NULL);
    ck_assert_int_eq(wclient_status(c, st), 0);
    wclient_close(c);
    worker_fini(w);
}

/* Concurrent streams give the same ids without a cache, with a small cache whose tier swaps every
 * window, and after a restart with a larger static one (answers never depend on the tier). */
START_TEST(test_ids_independent_of_the_expert_cache)
{
    static struct job plain[N_STREAMS], small[N_STREAMS], large[N_STREAMS];
    struct wclient_status st;
    const struct backend_opts none = {0};
    streams_of("nocache", &none, plain, &st);
    ck_assert_uint_eq(st.cache_slots, 0);
    const struct backend_opts a = {
        .expert_cache = {CACHE_SLOTS, 3},
        .tier = {.every = 1, .swaps = 4, .decay = 0.9f, .min_count = 0.5f, .lead = 0.25f},
        .cache_verify = true};
    streams_of("small", &a, small, &st);
    ck_assert_uint_eq(st.cache_slots, 3);
    ck_assert_uint_gt(st.cache_hits, 0);
    ck_assert_uint_gt(st.cache_misses, 0);
    ck_assert_uint_gt(st.cache_swaps, 0);
    ck_assert_str_eq(st.backend, "cpu");
    const struct backend_opts b = {.expert_cache = {CACHE_SLOTS, 12}};
    streams_of("large", &b, large, &st);
    ck_assert_uint_eq(st.cache_slots, 12);
    ck_assert_uint_eq(st.cache_swaps, 0);
    for (int k = 0; k < N_STREAMS; k++) {
        ck_assert_uint_eq(plain[k].n, GEN_TOKENS);
        ck_assert_uint_eq(small[k].n, plain[k].n);
        ck_assert_uint_eq(large[k].n, plain[k].n);
        ck_assert_msg(memcmp(small[k].out, plain[k].out, plain[k].n * sizeof(int32_t)) == 0,
                      "stream %d: ids with a swapping cache of 3 differ", k);
        ck_assert_msg(memcmp(large[k].out, plain[k].out, plain[k].n * sizeof(int32_t)) == 0,
                      "stream %d: ids after a restart with a cache of 12 differ", k);
    }
}
END_TEST

/* ---- bad messages ------------------------------------------------------------------------------
 */

/* raw sends b and returns the reply's status (its error code, or 0). */
static int raw(struct ipc_client *ic, struct msg_builder *b)
{
    struct msg m;
    int rv = ipc_request(ic, b, &m, 3000);
    if (rv == 0) msg_free(&m);
    return rv;
}

/* oversized_dropped speaks SP over the worker's socket by hand (a complete handshake: a
 * connection closed during it would break nng 1.5.2's listener, #1518), declares a message of
 * MSG_MAX_BYTES + 1 bytes and reports whether the worker hung up rather than reading it. */
static bool oversized_dropped(const char *url)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", url + strlen("ipc://"));
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    const uint8_t hello[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}; /* SP, protocol req0 (48) */
    uint8_t peer[8];
    ck_assert_int_eq(write(fd, hello, 8), 8);
    ck_assert_int_eq(read(fd, peer, 8), 8);
    ck_assert_int_eq(peer[5], 0x31); /* rep0 */
    uint64_t len = (uint64_t)MSG_MAX_BYTES + 1;
    uint8_t frame[9 + 4] = {1}; /* ipc frame: type 1, 64-bit big-endian length, then data */
    for (int i = 0; i < 8; i++)
        frame[1 + i] = (uint8_t)(len >> (56 - 8 * i));
    ck_assert_int_eq(write(fd, frame, sizeof frame), (ssize_t)sizeof frame);
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    bool dropped = poll(&pf, 1, 3000) == 1 && read(fd, peer, 1) <= 0;
    close(fd);
    return dropped;
}

START_TEST(test_malformed)
{
    struct worker *w = start(rundir("bad"), 0);
    struct ipc_client *ic;
    ck_assert_int_eq(ipc_client_open(worker_url(w), NULL, &ic), 0);
    /* not msgpack at all: an error reply */
    void *rep;
    size_t rep_len;
    ck_assert_int_eq(ipc_call(ic, "\xc1\x01\x02", 3, &rep, &rep_len, 3000), 0);
    struct msg m;
    ck_assert_int_eq(msg_decode(rep, rep_len, &m), 0);
    ck_assert_int_eq(msg_reply_status(&m), STRATA_EFORMAT);
    msg_free(&m);
    free(rep);

    struct msg_builder b;
    msg_begin_request(&b, "frobnicate");
    ck_assert_int_eq(raw(ic, &b), STRATA_EUNSUPPORTED);
    msg_begin_request(&b, "submit"); /* prompt of the wrong type */
    msg_key(&b, "id");
    msg_pack_str(&b, "x");
    msg_key(&b, "prompt");
    msg_pack_str(&b, "hello");
    msg_key(&b, "max_tokens");
    msg_pack_i64(&b, 4);
    ck_assert_int_eq(raw(ic, &b), STRATA_EPROTO);
    ck_assert(strstr(strata_errdetail(), "prompt") != NULL);
    msg_begin_request(&b, "submit"); /* no max_tokens */
    msg_key(&b, "id");
    msg_pack_str(&b, "x");
    msg_key(&b, "prompt");
    msg_pack_i32s(&b, (int32_t[]){1, 2}, 2);
    ck_assert_int_eq(raw(ic, &b), STRATA_ENOENT);
    msg_begin_request(&b, "submit"); /* a token outside the vocabulary */
    msg_key(&b, "id");
    msg_pack_str(&b, "x");
    msg_key(&b, "prompt");
    msg_pack_i32s(&b, (int32_t[]){1, 1 << 30}, 2);
    msg_key(&b, "max_tokens");
    msg_pack_i64(&b, 4);
    ck_assert_int_eq(raw(ic, &b), STRATA_EPROTO);
    static int32_t longp[N_CTX];
    for (int i = 0; i < N_CTX; i++)
        longp[i] = 1;
    msg_begin_request(&b, "submit"); /* a prompt past the context */
    msg_key(&b, "id");
    msg_pack_str(&b, "x");
    msg_key(&b, "prompt");
    msg_pack_i32s(&b, longp, N_CTX);
    msg_key(&b, "max_tokens");
    msg_pack_i64(&b, 4);
    ck_assert_int_eq(raw(ic, &b), STRATA_ELIMIT);
    msg_begin_request(&b, "poll"); /* too many ids */
    msg_key(&b, "ids");
    msg_pack_array(&b, WCLIENT_POLL_MAX_IDS + 1);
    for (int i = 0; i <= WCLIENT_POLL_MAX_IDS; i++)
        msg_pack_str(&b, "a");
    ck_assert_int_eq(raw(ic, &b), STRATA_ELIMIT);
    msg_begin_request(&b, "poll"); /* from of another length */
    msg_key(&b, "ids");
    msg_pack_array(&b, 2);
    msg_pack_str(&b, "a");
    msg_pack_str(&b, "b");
    msg_key(&b, "from");
    msg_pack_i32s(&b, (int32_t[]){1}, 1);
    ck_assert_int_eq(raw(ic, &b), STRATA_EPROTO);
    msg_begin_request(&b, "cancel"); /* an id too long */
    msg_key(&b, "ids");
    msg_pack_array(&b, 1);
    msg_pack_str(&b, "0123456789012345678901234567890123456789012345678901234567890123456789");
    ck_assert_int_eq(raw(ic, &b), STRATA_EPROTO);

    ipc_client_close(ic);

    /* above the transport cap: nng drops the connection without a reply; the worker serves on */
    ck_assert_msg(oversized_dropped(worker_url(w)), "a frame above the cap was not dropped");

    struct wclient *c = client(worker_url(w));
    struct wclient_hello h;
    ck_assert_int_eq(wclient_hello(c, &h), 0);
    int32_t p[4] = {1, 2, 3, 4}, out[8];
    struct wclient_req r;
    enum wclient_finish fin;
    req_of(&r, "after", p, 4, 8);
    ck_assert_uint_eq(run_stream(c, &r, out, &fin), 8);
    wclient_close(c);
    worker_fini(w);
}
END_TEST

/* ---- leases ------------------------------------------------------------------------------------
 */

START_TEST(test_lease_lapse)
{
    struct worker *w = start(rundir("lease"), 1);
    struct wclient *c = client(worker_url(w));
    int32_t p[6];
    prompt_of(3, p, 6);
    struct wclient_req r;
    req_of(&r, "orphan", p, 6, 16);
    ck_assert_int_eq(wclient_submit(c, &r, NULL, NULL), 0);
    r.id = "kept";
    ck_assert_int_eq(wclient_submit(c, &r, NULL, NULL), 0);
    /* poll "kept" for 2.5 lease periods; "orphan" never */
    const char *id = "kept";
    uint32_t from = 0;
    for (int i = 0; i < 10; i++) {
        struct wclient_poll_result pr;
        ck_assert_int_eq(wclient_poll(c, &id, &from, 1, 0, &pr), 0);
        ck_assert_int_eq(pr.u[0].code, 0);
        wclient_poll_free(&pr);
        nanosleep(&(struct timespec){0, 250 * 1000000}, NULL);
    }
    const char *ids[] = {"orphan", "kept"};
    uint32_t froms[] = {0, 0};
    struct wclient_poll_result pr;
    ck_assert_int_eq(wclient_poll(c, ids, froms, 2, 0, &pr), 0);
    ck_assert_int_eq(pr.u[0].code, STRATA_ENOENT);
    ck_assert_int_eq(pr.u[1].code, 0);
    ck_assert_uint_eq(pr.u[1].n_tokens, 16);
    ck_assert_int_eq(pr.u[1].finish, WCLIENT_LENGTH);
    wclient_poll_free(&pr);
    wclient_close(c);
    worker_fini(w);
}
END_TEST

/* ---- a worker restart in the middle of a stream
 * --------------------------------------------------- */

START_TEST(test_restart_resume)
{
    const char *run = rundir("restart");
    struct worker *w = start(run, 0);
    struct wclient *c = client(worker_url(w));
    enum { N = 200 };
    int32_t p[12], got[N], ref[N];
    prompt_of(7, p, 12);
    struct wclient_req r;
    req_of(&r, "resumed", p, 12, N);
    r.sampling.temperature = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.repeat_penalty = 1.1f;
    struct wclient_stream *s;
    ck_assert_int_eq(wclient_stream_start(c, &r, &s), 0);
    uint32_t n = 0;
    const struct wclient_update *u;
    do {
        ck_assert_int_eq(wclient_stream_next(s, &u), 0);
        take(got, &n, u);
    } while (n == 0);
    ck_assert_msg(u->finish == WCLIENT_RUNNING, "the request ended before the restart");
    ck_assert_uint_lt(n, N);
    worker_fini(w); /* the worker goes away with the request */
    w = start(run, 0);
    while (u->finish == WCLIENT_RUNNING) {
        int rv = wclient_stream_next(s, &u);
        ck_assert_msg(rv == 0, "%s: %s", strata_strerror(rv), strata_errdetail());
        ck_assert_uint_eq(u->from, n);
        ck_assert_uint_le(n + u->n_tokens, N);
        take(got, &n, u);
    }
    ck_assert_uint_eq(wclient_stream_resubmits(s), 1);
    /* the same request undisturbed, with the seed the first worker picked */
    req_of(&r, "undisturbed", p, 12, N);
    r.sampling.temperature = 0.9f;
    r.sampling.top_k = 40;
    r.sampling.repeat_penalty = 1.1f;
    r.sampling.has_seed = true;
    r.sampling.seed = wclient_stream_seed(s);
    enum wclient_finish fin;
    uint32_t n_ref = run_stream(c, &r, ref, &fin);
    ck_assert_int_eq(fin, u->finish);
    ck_assert_uint_eq(n_ref, n);
    ck_assert_msg(memcmp(ref, got, n * sizeof *got) == 0,
                  "the resumed stream's ids differ from an undisturbed run's");
    wclient_stream_free(s);
    wclient_close(c);
    worker_fini(w);
}
END_TEST

/* ---- arena --------------------------------------------------------------------------------------
 */

START_TEST(test_arena_worker)
{
    char shm[700], run_a[700], run_w[700];
    snprintf(shm, sizeof shm, "%s/shm", test_tmpdir());
    snprintf(run_a, sizeof run_a, "%s/run-arena", test_tmpdir());
    snprintf(run_w, sizeof run_w, "%s/run-aw", test_tmpdir());
    mkdir(shm, 0700);
    mkdir(run_a, 0700);
    mkdir(run_w, 0700);
    struct arena_serve_config ac = {
        .model = g_model, .name = "svc", .shm_dir = shm, .runtime_dir = run_a};
    struct arena_server *as;
    int rv = arena_serve_init(&ac, &as);
    ck_assert_msg(rv == 0, "arena: %s: %s", strata_strerror(rv), strata_errdetail());
    /* slot mode over the arena: its copies come from arena_blob_at, its tier's rounds write the
     * arena's decayed profile */
    struct worker_config wc = {
        .arena = "svc",
        .shm_dir = shm,
        .runtime_dir = run_w,
        .ctx = N_CTX,
        .watchdog_ms = -1,
        .backend = {.expert_cache = {CACHE_SLOTS, 4},
                    .tier = {.every = 1, .swaps = 4, .decay = 0.9f, .min_count = 0.5f,
                             .lead = 0.25f},
                    .cache_verify = true}};
    struct worker *wa;
    rv = worker_init(&wc, &wa);
    ck_assert_msg(rv == 0, "worker: %s: %s", strata_strerror(rv), strata_errdetail());
    struct worker *wf = start(rundir("file"), 0);
    /* registered: our pid, our endpoint */
    bool found = false;
    for (int i = 0; i < ARENA_MAX_WORKERS; i++) {
        const struct arena_worker *aw = &as->state->hdr->workers[i];
        if (atomic_load(&aw->pid) == getpid() && strcmp(aw->endpoint, worker_url(wa)) == 0)
            found = aw->gpu == -1 && atomic_load(&aw->heartbeat_ns) > 0;
    }
    ck_assert_msg(found, "the worker is not in the arena's registry");

    /* one model: the same fingerprint and the same ids from the arena and from the file */
    struct wclient *ca = client(worker_url(wa)), *cf = client(worker_url(wf));
    struct wclient_hello ha, hf;
    ck_assert_int_eq(wclient_hello(ca, &ha), 0);
    ck_assert_int_eq(wclient_hello(cf, &hf), 0);
    ck_assert(ha.fingerprint == hf.fingerprint);
    uint64_t heat0 = atomic_load(&as->state->hdr->heat_total);
    int32_t p[10], oa[20], of[20];
    prompt_of(5, p, 10);
    struct wclient_req r;
    enum wclient_finish fa, ff;
    req_of(&r, "ar", p, 10, 20);
    uint32_t na = run_stream(ca, &r, oa, &fa);
    uint32_t nf = run_stream(cf, &r, of, &ff);
    ck_assert_uint_eq(na, 20);
    ck_assert_uint_eq(nf, 20);
    ck_assert_int_eq(memcmp(oa, of, sizeof oa), 0);
    ck_assert_uint_gt(atomic_load(&as->state->hdr->heat_total), heat0);
    struct wclient_status st;
    ck_assert_int_eq(wclient_status(ca, &st), 0);
    ck_assert_uint_gt(st.cache_swaps, 0);
    ck_assert_uint_gt(st.cache_hits, 0);
    float *decayed = malloc((size_t)as->state->hdr->n_layers * as->state->hdr->n_expert * 4);
    ck_assert(arena_profile_get(as->state, decayed)); /* the tier's rounds wrote it */
    free(decayed);
    wclient_close(ca);
    wclient_close(cf);
    worker_fini(wa);
    worker_fini(wf);
    int live = arena_workers_live(as->state, NULL, 0);
    ck_assert_int_eq(live, 0); /* unregistered at exit */
    arena_serve_fini(as);
}
END_TEST

/* ---- decoders on the fuzz corpus's seeds
 * --------------------------------------------------------- */

static void decode_seed(const char *name, struct msg *m, char **buf)
{
    char path[1200];
    size_t len;
    snprintf(path, sizeof path, "%s/tests/corpus/service_fuzz/%s", STRATA_SOURCE_DIR, name);
    *buf = test_read_file(path, &len);
    ck_assert_msg(*buf != NULL, "%s is missing", path);
    ck_assert_int_eq(msg_decode(*buf, len, m), 0);
}

START_TEST(test_parse_seeds)
{
    struct msg m;
    char *buf;
    decode_seed("submit", &m, &buf);
    struct service_submit sub;
    ck_assert_int_eq(service_parse_submit(&m, 1000, 512, &sub), 0);
    ck_assert_str_eq(sub.req.id, "req-1");
    ck_assert_uint_eq(sub.req.n_prompt, 4);
    ck_assert_int_eq(sub.req.prompt[3], 500);
    ck_assert_uint_eq(sub.req.max_tokens, 16);
    ck_assert(sub.has_seed && sub.req.sp.seed == (1ull << 63) + 5);
    ck_assert_uint_eq(sub.req.sp.top_k, 40);
    ck_assert_uint_eq(sub.req.n_stop, 1);
    ck_assert_uint_eq(sub.req.n_generated, 1);
    ck_assert(sub.req.logprobs && sub.req.n_top == 3);
    /* the same message against a smaller vocabulary and context */
    ck_assert_int_eq(service_parse_submit(&m, 500, 512, &sub), STRATA_EPROTO);
    ck_assert_int_eq(service_parse_submit(&m, 1000, 4, &sub), STRATA_ELIMIT);
    msg_free(&m);
    free(buf);
    decode_seed("poll", &m, &buf);
    struct service_poll p;
    ck_assert_int_eq(service_parse_poll(&m, &p), 0);
    ck_assert_uint_eq(p.n, 2);
    ck_assert_str_eq(p.ids[1], "req-2");
    ck_assert_uint_eq(p.from[1], 12);
    ck_assert_int_eq(p.wait_ms, 100);
    msg_free(&m);
    free(buf);
    decode_seed("poll-one-from", &m, &buf);
    ck_assert_int_eq(service_parse_poll(&m, &p), 0);
    ck_assert_uint_eq(p.from[0], 3);
    ck_assert_int_eq(p.wait_ms, 2000);
    ck_assert_int_eq(service_parse_submit(&m, 1000, 512, &sub), STRATA_ENOENT);
    msg_free(&m);
    free(buf);
}
END_TEST

/* ---- the binary -------------------------------------------------------------------------------
 */

/* spawn_worker runs the strata-worker binary on the tiny model in run and returns its pid and
 * the URL it printed. */
static pid_t spawn_worker(const char *run, char *url, size_t cap)
{
    const char *b = getenv("STRATA_BUILD_DIR");
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/strata-worker", b && *b ? b : ".");
    ck_assert_msg(access(bin, X_OK) == 0, "%s is missing: build the strata-worker target", bin);
    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        execl(bin, bin, "--model", g_model, "--runtime-dir", run, "--ctx", "256", "--threads", "2",
              "--bit-exact", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *out = fdopen(fds[0], "r");
    ck_assert_msg(fgets(url, (int)cap, out) != NULL, "strata-worker printed no URL");
    fclose(out);
    url[strcspn(url, "\n")] = 0;
    ck_assert(strncmp(url, "ipc://", 6) == 0 && strstr(url, "worker-0.sock"));
    return pid;
}

/* The binary: killed -9 in the middle of a stream and started again, the stream goes on and its
 * ids are an undisturbed run's; SIGTERM ends it cleanly. */
START_TEST(test_binary_kill_restart)
{
    const char *run = rundir("bin");
    char url[512], url2[512];
    pid_t pid = spawn_worker(run, url, sizeof url);
    struct wclient *c = client(url);
    struct wclient_hello h;
    ck_assert_int_eq(wclient_hello(c, &h), 0);
    ck_assert_int_eq(h.pid, pid);
    ck_assert_uint_eq(h.n_ctx, 256);
    enum { N = 200 };
    int32_t p[9], got[N], ref[N];
    prompt_of(9, p, 9);
    struct wclient_req r;
    req_of(&r, "killed", p, 9, N);
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    struct wclient_stream *s;
    ck_assert_int_eq(wclient_stream_start(c, &r, &s), 0);
    uint32_t n = 0;
    const struct wclient_update *u;
    do {
        ck_assert_int_eq(wclient_stream_next(s, &u), 0);
        take(got, &n, u);
    } while (n == 0);
    ck_assert_msg(u->finish == WCLIENT_RUNNING, "the request ended before the kill");
    kill(pid, SIGKILL);
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    pid = spawn_worker(run, url2, sizeof url2);
    ck_assert_str_eq(url, url2);
    while (u->finish == WCLIENT_RUNNING) {
        int rv = wclient_stream_next(s, &u);
        ck_assert_msg(rv == 0, "%s: %s", strata_strerror(rv), strata_errdetail());
        ck_assert_uint_eq(u->from, n);
        take(got, &n, u);
    }
    ck_assert_uint_eq(wclient_stream_resubmits(s), 1);
    ck_assert_int_eq(wclient_hello(c, &h), 0);
    ck_assert_int_eq(h.pid, pid);
    req_of(&r, "calm", p, 9, N);
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.has_seed = true;
    r.sampling.seed = wclient_stream_seed(s);
    enum wclient_finish fin;
    ck_assert_uint_eq(run_stream(c, &r, ref, &fin), n);
    ck_assert_int_eq(fin, u->finish);
    ck_assert_msg(memcmp(ref, got, n * sizeof *got) == 0,
                  "the stream resumed after kill -9 differs from an undisturbed run");
    wclient_stream_free(s);
    wclient_close(c);
    kill(pid, SIGTERM);
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "strata-worker exited with %d", st);
}
END_TEST

/* ---- the monitor's view: heat, and what answering it costs -------------------------------------
 */

struct watcher {
    struct wclient *c;
    atomic_bool stop;
    int rounds;
};

/* watch asks status, vram and heat every 50 ms: 20 times the monitor page's rate */
static void *watch(void *arg)
{
    struct watcher *wt = arg;
    while (!atomic_load(&wt->stop)) {
        struct wclient_status st;
        struct wclient_vram v;
        struct wclient_heat h;
        ck_assert_int_eq(wclient_status(wt->c, &st), 0);
        ck_assert_int_eq(wclient_vram(wt->c, false, 0, &v), 0);
        ck_assert_int_eq(wclient_heat(wt->c, &h), 0);
        wclient_heat_free(&h);
        wt->rounds++;
        usleep(50 * 1000);
    }
    return NULL;
}

static double since(const struct timespec *a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) + (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

START_TEST(test_heat_and_monitor_cost)
{
    struct worker *w = start(rundir("heat"), 0);
    struct wclient *c = client(worker_url(w));
    struct wclient_heat h0, h1;
    ck_assert_int_eq(wclient_heat(c, &h0), 0);
    ck_assert_uint_gt(h0.n_layer, 0);
    ck_assert_uint_gt(h0.n_expert, 1);
    for (size_t i = 0; i < (size_t)h0.n_layer * h0.n_expert; i++)
        ck_assert_uint_eq(h0.counts[i], 0);
    struct wclient_status s0, s1;
    ck_assert_int_eq(wclient_status(c, &s0), 0);
    struct watcher wt = {.c = client(worker_url(w))};
    pthread_t th;
    pthread_create(&th, NULL, watch, &wt);
    /* streams one after another for 2 s: the worker computes most of the time */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int n = 0;
    do {
        int32_t p[8], out[200];
        char id[32];
        prompt_of(n, p, 8);
        snprintf(id, sizeof id, "heat-%d", n++);
        struct wclient_req r;
        req_of(&r, id, p, 8, 200);
        enum wclient_finish fin;
        run_stream(c, &r, out, &fin);
    } while (since(&t0) < 2.0);
    const double wall = since(&t0);
    atomic_store(&wt.stop, true);
    pthread_join(th, NULL);
    ck_assert_int_eq(wclient_status(c, &s1), 0);
    ck_assert_int_eq(wclient_heat(c, &h1), 0);
    ck_assert_uint_eq(h1.n_layer, h0.n_layer);
    ck_assert_uint_eq(h1.n_expert, h0.n_expert);
    /* every layer routes each computed token to its top-k experts: the layers' sums are equal,
     * and at least one per token computed (the prompts, and every generated token but the last
     * of each stream, which is never fed back) */
    uint64_t layer0 = 0;
    for (uint32_t l = 0; l < h1.n_layer; l++) {
        uint64_t sum = 0;
        for (uint32_t e = 0; e < h1.n_expert; e++)
            sum += h1.counts[(size_t)l * h1.n_expert + e];
        if (l == 0) layer0 = sum;
        ck_assert_uint_eq(sum, layer0);
    }
    ck_assert_uint_ge(layer0, s1.prompt_tokens + s1.tokens_generated - (uint64_t)n);
    const double mon = s1.monitor_s - s0.monitor_s, win = s1.window_s - s0.window_s;
    ck_assert_msg(win > 0.2, "%.3f s of windows in %.2f s", win, wall);
    ck_assert(mon > 0 && wt.rounds > 0);
    /* the page asks once a second; the watcher asked wt.rounds times in `wall` seconds */
    const double per_round = mon / wt.rounds, at_1hz = per_round * wall / win;
    printf("monitor cost: %d rounds of status+vram+heat took %.3f ms of the worker (%.1f us "
           "each); at 1 Hz that is %.4f%% of its window time (%.2f s of windows in %.2f s, %d "
           "streams of 200 tokens)\n",
           wt.rounds, mon * 1e3, per_round * 1e6, 100 * at_1hz, win, wall, n);
    ck_assert_msg(at_1hz < 0.01, "the monitor costs %.3f%% of the window time at 1 Hz",
                  100 * at_1hz);
    wclient_heat_free(&h0);
    wclient_heat_free(&h1);
    wclient_close(wt.c);
    wclient_close(c);
    worker_fini(w);
}
END_TEST

int main(void)
{
    snprintf(g_model, sizeof g_model, "%s/tiny.gguf", test_tmpdir());
    struct fixture_opts fo = {.seed = 11};
    if (fixture_write(&fo, g_model) != 0) {
        fprintf(stderr, "fixture: %s\n", strata_errdetail());
        return 1;
    }
    Suite *s = suite_create("service");
    TCase *tc = tcase_create("service");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_hello_meta);
    tcase_add_test(tc, test_idempotent_status_vram);
    tcase_add_test(tc, test_heat_and_monitor_cost);
    tcase_add_test(tc, test_concurrent_streams);
    tcase_add_test(tc, test_ids_independent_of_the_expert_cache);
    tcase_add_test(tc, test_malformed);
    tcase_add_test(tc, test_lease_lapse);
    tcase_add_test(tc, test_restart_resume);
    tcase_add_test(tc, test_arena_worker);
    tcase_add_test(tc, test_binary_kill_restart);
    tcase_add_test(tc, test_parse_seeds);
    suite_add_tcase(s, tc);
    int rv = test_run(s);
    unlink(g_model);
    return rv;
}
