/* chat — the command-line chat over one worker: conversation, streaming, tok/s. */
#include "frontend/chat.h"

#include "common/base/err.h"
#include "common/base/log.h"
#include "frontend/fe_model.h"
#include "frontend/fe_stop.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int add_message(json_t *msgs, const char *role, const char *content)
{
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    if (!m || json_array_append_new(msgs, m) != 0)
        return strata_errf(STRATA_ENOMEM, "chat: message of %zu bytes", strlen(content));
    return 0;
}

static json_t *fresh(const struct chat_opts *o)
{
    json_t *msgs = json_array();
    if (msgs && o->system) add_message(msgs, "system", o->system);
    return msgs;
}

/* append adds n bytes to b. */
static int append(struct tok_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) return strata_errf(STRATA_ENOMEM, "chat: an answer of %zu bytes", b->n + n);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* answer generates one reply to the prompt ids, printing it as it comes; the reply text (what
 * was printed: without the model's stop string) goes to *reply. The answer ends at an end-of-turn
 * token, at one of the model's stop strings (fe_model's strata.stop) or at max_tokens. */
static int answer(const struct chat_opts *o, const struct fe_backend *ops, void *w,
                  const struct fe_model *m, const struct tok_ids *ids, uint32_t max_tokens,
                  unsigned turn, struct tok_buf *reply)
{
    FILE *out = o->out ? o->out : stdout;
    struct tok_buf raw = {0};
    struct fe_stop stop;
    void *s = NULL;
    const char *rel;
    size_t rel_len;
    bool hit = false;
    int rv = fe_stop_init(&stop, (const char *const *)m->stop_strs, m->n_stop_strs);
    if (rv != 0) return rv;
    char id[64];
    snprintf(id, sizeof id, "chat%d-%llx-%u", (int)getpid(), (unsigned long long)time(NULL), turn);
    struct wclient_req r = {.id = id,
                            .prompt = ids->v,
                            .n_prompt = (uint32_t)ids->n,
                            .max_tokens = max_tokens,
                            .stop = m->stop_ids,
                            .n_stop = m->n_stop_ids};
    r.sampling = (struct wclient_sampling){.temperature = o->temperature,
                                           .top_p = 1.0f,
                                           .repeat_penalty = 1.0f,
                                           .has_seed = o->has_seed,
                                           .seed = o->seed};
    if ((rv = ops->stream_start(w, &r, &s)) != 0) goto out;
    struct tok_stream ts;
    tok_stream_init(&ts, m->tok, 0);
    const struct wclient_update *u = NULL;
    uint32_t n_gen = 0;
    do {
        if ((rv = ops->stream_next(s, &u)) != 0) goto out;
        size_t before = raw.n;
        for (uint32_t i = 0; i < u->n_tokens; i++)
            if ((rv = tok_stream_feed(&ts, u->tokens[i], &raw)) != 0) goto out;
        n_gen += u->n_tokens;
        hit = fe_stop_feed(&stop, raw.p ? raw.p + before : "", raw.n - before, &rel, &rel_len);
        if ((rv = append(reply, rel, rel_len)) != 0) goto out;
        fwrite(rel, 1, rel_len, out);
        fflush(out);
        /* the rest of the answer is not wanted: the worker stops decoding it */
        if (hit && u->finish == WCLIENT_RUNNING && (rv = ops->stream_cancel(s)) != 0) goto out;
    } while (!hit && u->finish == WCLIENT_RUNNING);
    if (!hit) {
        size_t before = raw.n;
        tok_stream_flush(&ts, &raw);
        hit = fe_stop_feed(&stop, raw.p ? raw.p + before : "", raw.n - before, &rel, &rel_len);
        if ((rv = append(reply, rel, rel_len)) != 0) goto out;
        fwrite(rel, 1, rel_len, out);
        if (!hit) {
            fe_stop_flush(&stop, &rel, &rel_len);
            if ((rv = append(reply, rel, rel_len)) != 0) goto out;
            fwrite(rel, 1, rel_len, out);
        }
    }
    if (!hit && u->finish == WCLIENT_ERROR) {
        rv = strata_errf(u->error_code, "the worker failed the answer");
        goto out;
    }
    if (!o->quiet) {
        uint32_t pn = u->n_prompt > u->n_cached ? u->n_prompt - u->n_cached : 0;
        fprintf(out,
                "\n[prompt %u tokens (%u cached): prefill %.1f tok/s | answer %u tokens: decode "
                "%.1f tok/s%s]",
                u->n_prompt, u->n_cached, u->prefill_ms > 0 ? pn * 1000.0 / u->prefill_ms : 0.0,
                n_gen, u->decode_ms > 0 ? n_gen * 1000.0 / u->decode_ms : 0.0,
                !hit && u->finish == WCLIENT_LENGTH ? ", cut at the length limit (--max-tokens)"
                                                    : "");
    }
    fputc('\n', out);
    fflush(out);
out:
    if (s) ops->stream_free(s);
    fe_stop_fini(&stop);
    free(raw.p);
    return rv;
}

/* first_turn is the index of the first message fit may drop: the system message stays. */
static size_t first_turn(const json_t *msgs)
{
    const char *role = json_string_value(json_object_get(json_array_get(msgs, 0), "role"));
    return role && strcmp(role, "system") == 0 ? 1 : 0;
}

/* fit renders msgs into *ids, dropping the oldest exchanges (a user message and the answer after
 * it) until the prompt leaves room for an answer of *max_tokens (or a quarter of the context,
 * whichever is less): a chat longer than the context keeps going and forgets its beginning, and
 * the user is told. *max_tokens becomes what fits. STRATA_ELIMIT when the last message alone does
 * not fit. */
static int fit(const struct chat_opts *o, const struct fe_model *m, json_t *msgs,
               struct tok_ids *ids, uint32_t *max_tokens)
{
    FILE *out = o->out ? o->out : stdout;
    uint32_t want = *max_tokens < m->n_ctx / 4 ? *max_tokens : m->n_ctx / 4;
    size_t dropped = 0;
    bool opens;
    int rv;
    for (;;) {
        ids->n = 0;
        if ((rv = fe_model_chat(m, msgs, NULL, NULL, ids, &opens)) != 0) return rv;
        if (ids->n + want <= m->n_ctx) break;
        size_t first = first_turn(msgs);
        if (json_array_size(msgs) <= first + 1) {
            if (ids->n < m->n_ctx) break; /* the question alone: answer in what is left */
            return strata_errf(STRATA_ELIMIT,
                               "your message is %zu tokens with the template, the context holds "
                               "%u: say it in fewer words",
                               ids->n, m->n_ctx);
        }
        /* an exchange: the user's message and the answers up to the next one */
        json_array_remove(msgs, first);
        dropped++;
        while (json_array_size(msgs) > first + 1) {
            const char *role =
                json_string_value(json_object_get(json_array_get(msgs, first), "role"));
            if (role && strcmp(role, "user") == 0) break;
            json_array_remove(msgs, first);
        }
    }
    if (dropped && !o->quiet)
        fprintf(out,
                "(the conversation outgrew the model's %u-token context: the oldest %zu "
                "exchange%s %s forgotten; /reset starts over)\n",
                m->n_ctx, dropped, dropped == 1 ? "" : "s", dropped == 1 ? "is" : "are");
    uint32_t room = m->n_ctx - (uint32_t)ids->n;
    if (*max_tokens > room) *max_tokens = room;
    return 0;
}

int chat_run(const struct chat_opts *o, const struct fe_backend *ops, void *w)
{
    FILE *in = o->in ? o->in : stdin, *out = o->out ? o->out : stdout;
    struct wclient_hello h;
    struct wclient_meta meta = {0};
    struct fe_model m = {0};
    json_t *msgs = NULL;
    char *line = NULL;
    size_t cap = 0;
    int rv;
    if ((rv = ops->hello(w, &h)) != 0 || (rv = ops->meta(w, &meta)) != 0) {
        fprintf(stderr, "chat: the worker does not answer: %s: %s (is strata-worker running?)\n",
                strata_strerror(rv), strata_errdetail());
        goto out;
    }
    if ((rv = fe_model_init(&m, meta.gguf, meta.n_ctx ? meta.n_ctx : h.n_ctx, o->chat_template,
                            o->worker_url)) != 0) {
        fprintf(stderr, "chat: cannot build the model's tokenizer or template: %s: %s\n",
                strata_strerror(rv), strata_errdetail());
        goto out;
    }
    if (!o->quiet)
        fprintf(out, "%s (%u tokens of context). /reset starts over, /quit leaves.\n", m.name,
                m.n_ctx);
    if (!(msgs = fresh(o))) {
        rv = strata_errf(STRATA_ENOMEM, "chat");
        goto out;
    }
    for (unsigned turn = 0;; turn++) {
        if (!o->quiet) {
            fputs("> ", out);
            fflush(out);
        }
        ssize_t n = getline(&line, &cap, in);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            line[--n] = '\0';
        if (n == 0) continue;
        if (strcmp(line, "/quit") == 0 || strcmp(line, "/exit") == 0) break;
        if (strcmp(line, "/reset") == 0) {
            json_decref(msgs);
            if (!(msgs = fresh(o))) {
                rv = strata_errf(STRATA_ENOMEM, "chat");
                goto out;
            }
            if (!o->quiet) fputs("(conversation cleared)\n", out);
            continue;
        }
        if ((rv = add_message(msgs, "user", line)) != 0) goto out;
        struct tok_buf reply = {0};
        struct tok_ids ids = {0};
        uint32_t max_tokens = o->max_tokens ? o->max_tokens : CHAT_MAX_TOKENS;
        rv = fit(o, &m, msgs, &ids, &max_tokens);
        if (rv == 0) rv = answer(o, ops, w, &m, &ids, max_tokens, turn, &reply);
        free(ids.v);
        if (rv == 0) {
            /* the history keeps the answer without its reasoning, as chat templates expect */
            char *content = NULL, *reasoning = NULL;
            rv = tmpl_reason_split(m.reason, false, reply.p ? reply.p : "", reply.n, &content,
                                   &reasoning);
            if (rv == 0) rv = add_message(msgs, "assistant", content);
            free(content);
            free(reasoning);
        } else {
            /* this turn failed: forget its question so the next one starts clean */
            json_array_remove(msgs, json_array_size(msgs) - 1);
            fprintf(stderr, "\nchat: %s: %s\n", strata_strerror(rv), strata_errdetail());
            if (rv == STRATA_ELIMIT) rv = 0;
        }
        free(reply.p);
        if (rv != 0) goto out;
    }
    rv = 0;
out:
    free(line);
    json_decref(msgs);
    fe_model_fini(&m);
    if (ops->meta_free) ops->meta_free(&meta);
    return rv;
}

static void usage(const char *prog, FILE *to)
{
    fprintf(
        to,
        "usage: %s (--worker URL | --arena NAME [--shm-dir DIR]) [options]\n"
        "Chat with a model in the terminal: answers stream as they come; prefill and decode\n"
        "tok/s are printed after each. /reset starts over, /quit (or end of input) leaves.\n"
        "  --worker URL          the worker's socket, e.g. "
        "ipc:///run/user/1000/strata/m/worker-0.sock\n"
        "  --arena NAME          use the first live worker registered in arena NAME\n"
        "  --shm-dir DIR         where the arena lives (default /dev/shm)\n"
        "  --chat-template SPEC  a built-in template name or a Jinja file (default: the model's)\n"
        "  --system TEXT         a system message for each conversation\n"
        "  --temperature T       sampling temperature (default 0.7; 0 is greedy)\n"
        "  --max-tokens N        longest answer (default %d; an answer also ends at the\n"
        "                        model's end of turn)\n"
        "  --seed N              seed for sampling (default: the worker picks)\n"
        "  --quiet               print answers only (no prompt marker, no statistics)\n"
        "A conversation longer than the context keeps going: its oldest exchanges are dropped\n"
        "(and the chat says so).\n",
        prog, CHAT_MAX_TOKENS);
}

int chat_main(const char *prog, int argc, char **argv)
{
    static const struct option lo[] = {{"worker", required_argument, 0, 'w'},
                                       {"arena", required_argument, 0, 'a'},
                                       {"shm-dir", required_argument, 0, 'd'},
                                       {"chat-template", required_argument, 0, 't'},
                                       {"system", required_argument, 0, 's'},
                                       {"temperature", required_argument, 0, 'T'},
                                       {"max-tokens", required_argument, 0, 'n'},
                                       {"seed", required_argument, 0, 'S'},
                                       {"quiet", no_argument, 0, 'q'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    struct chat_opts o = {.temperature = 0.7f};
    const char *url = NULL, *arena = NULL, *shm_dir = NULL;
    char urls[1][FE_URL_MAX];
    char *end;
    int c, rv, idx = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, &idx)) != -1) {
        switch (c) {
        case 'w':
            url = optarg;
            break;
        case 'a':
            arena = optarg;
            break;
        case 'd':
            shm_dir = optarg;
            break;
        case 't':
            o.chat_template = optarg;
            break;
        case 's':
            o.system = optarg;
            break;
        case 'T':
            o.temperature = strtof(optarg, &end);
            if (*end || o.temperature < 0) goto bad;
            break;
        case 'n':
            o.max_tokens = (uint32_t)strtoul(optarg, &end, 10);
            if (*end || !o.max_tokens) goto bad;
            break;
        case 'S':
            o.seed = strtoull(optarg, &end, 10);
            if (*end) goto bad;
            o.has_seed = true;
            break;
        case 'q':
            o.quiet = true;
            break;
        case 'h':
            usage(prog, stdout);
            return 0;
        default:
            usage(prog, stderr);
            return 2;
        }
    }
    if (optind < argc || (!url && !arena) || (url && arena)) {
        fprintf(stderr, "%s: give exactly one of --worker URL or --arena NAME\n", prog);
        usage(prog, stderr);
        return 2;
    }
    if (arena) {
        int n;
        if ((rv = fe_arena_endpoints(shm_dir, arena, urls, 1, &n)) != 0) {
            fprintf(stderr, "%s: %s\n", prog, strata_errdetail());
            return 1;
        }
        url = urls[0];
    }
    struct wclient *w;
    if ((rv = wclient_open(url, NULL, &w)) != 0) {
        fprintf(stderr, "%s: cannot open %s: %s: %s\n", prog, url, strata_strerror(rv),
                strata_errdetail());
        return 1;
    }
    o.worker_url = url;
    rv = chat_run(&o, &fe_backend_wclient, w);
    wclient_close(w);
    return rv ? 1 : 0;
bad:
    fprintf(stderr, "%s: bad value '%s' for --%s\n", prog, optarg, lo[idx].name);
    return 2;
}
