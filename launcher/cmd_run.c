/* strata run — one-shot generation in this process: `strata run MODEL.gguf -p TEXT`.
 *
 * The model is read in place from the GGUF mapping (no arena, no worker) and computed by the
 * forward pass of a backend (gpu-worker/backend.h) on --threads CPU threads; prompts go in chunks
 * of --chunk tokens. The output is the generated text (or ids, for a file without a tokenizer), or
 * with --json one line {"prompt_ids", "ids", "text", "top_logprobs", "seed", "finish_reason"}.
 * With --teacher LIST it generates nothing: it feeds the given continuation after the prompt
 * (teacher forcing) and prints, for every step, its argmax, top logit and the given token's logit,
 * so another implementation's greedy output can be checked step by step (tests/llamacpp/run.sh).
 * The reference backend is bit-exact (docs/design.md §3.4) in every mode: the same model, prompt,
 * sampling options and seed give the same tokens whatever the thread count or chunk size.
 */
#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/arena/model.h"
#include "common/tok/tok.h"
#include "gpu-worker/backend.h"
#include "gpu-worker/kv.h"
#include "gpu-worker/sample.h"
#include "gpu-worker/spec.h"
#include "launcher/cmd.h"
#include "launcher/sup_svc.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define PENALTY_LAST_N 64 /* tokens of history the penalties look at, as llama.cpp's default */
#define SEED_MAX       ((1ull << 53) - 1)

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata run MODEL.gguf (-p TEXT | --ids 1,2,3) [--teacher 4,5,6] [options]\n"
            "       strata run --name NAME (-p TEXT | --ids 1,2,3) [options]\n\n"
            "Generates text with the model in this process, on the CPU (reference backend).\n"
            "With --name, a worker of the running service NAME (strata serve) generates it.\n"
            "  --name NAME           use the running service NAME instead of a MODEL file\n"
            "  --runtime-dir DIR     its socket directory (as given to strata serve)\n"
            "  -p, --prompt TEXT     the prompt (tokenized with the model's tokenizer, BOS added)\n"
            "  --ids LIST            the prompt as comma-separated token ids\n"
            "  --teacher LIST        score this continuation (ids) instead of generating: one\n"
            "                        JSON line {prompt_ids, teacher_ids, steps: [{id, logit,\n"
            "                        argmax, top_logit, min_logit}]}, step i being the logits\n"
            "                        after the prompt and LIST[0..i); sampling options unused\n"
            "  -n N                  tokens to generate (default 64); stops early at EOS\n"
            "  --ignore-eos          do not stop at the end-of-sequence token\n"
            "  --temp T              temperature (default 0.8; 0 is greedy)\n"
            "  --top-k K             keep the K most likely tokens (default 40; 0 off)\n"
            "  --top-p P             keep the smallest set of probability >= P (default 0.95)\n"
            "  --min-p P             keep tokens with p >= P * p_max (default 0.05)\n"
            "  --repeat-penalty R    penalize the last %d tokens (default 1.0: off)\n"
            "  --presence-penalty X  subtract X from tokens present in them (default 0)\n"
            "  --frequency-penalty X subtract X per occurrence (default 0)\n"
            "  --seed S              the random stream's seed (default: a random one, reported)\n"
            "  --logprobs N          report the N most likely alternatives per token (--json)\n"
            "  --ctx N               context length (default: the model's trained context)\n"
            "  --threads N           compute threads (default: the online CPUs)\n"
            "  --chunk N             prompt tokens per forward pass (default 256)\n"
            "  --spec-lookup N       speculative decoding: verify up to N (<= 8) drafts a pass,\n"
            "                        found in the prompt and output (prompt lookup); the text\n"
            "                        is the same, greedy or sampled\n"
            "  --draft FILE.gguf     draft with this small model of the same vocabulary instead\n"
            "  --draft-max N         the draft model's drafts a pass (default 4, <= 8)\n"
            "  --bit-exact           refuse to run unless the backend promises bit-exact "
            "results\n" BACKEND_OPTS_USAGE
            "  --json                print one JSON line: prompt_ids, ids, text, top_logprobs,\n"
            "                        seed, finish_reason (\"stop\" at EOS, \"length\" otherwise)\n",
            PENALTY_LAST_N);
}

struct run_opts {
    const char *model, *prompt, *ids, *teacher;
    const char *name, *runtime_dir; /* --name: a running service generates (run_service) */
    uint32_t n_predict, ctx, threads, chunk;
    uint32_t spec_lookup, draft_max; /* drafts a pass: prompt lookup, the draft model's */
    const char *draft;               /* --draft: the draft model's file */
    bool json, ignore_eos, seed_given, bit_exact;
    struct sample_params sp;
    struct backend_opts backend;
};

static int parse_f32(const char *s, const char *opt, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end)
        return strata_errf(STRATA_EINVAL, "%s '%s': expected a number", opt, s);
    *out = v;
    return 0;
}

/* parse_ids appends the comma-separated ids in s (the value of option opt) to out. */
static int parse_ids(const char *s, const char *opt, struct tok_ids *out)
{
    const char *p = s;
    const size_t n0 = out->n;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ','))
            return strata_errf(STRATA_EINVAL, "%s '%s': expected comma-separated token ids", opt,
                               s);
        if (out->n == out->cap) {
            size_t cap = out->cap ? 2 * out->cap : 64;
            int32_t *nv = realloc(out->v, cap * sizeof *nv);
            if (!nv) return STRATA_ENOMEM;
            out->v = nv;
            out->cap = cap;
        }
        out->v[out->n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (out->n == n0) return strata_errf(STRATA_EINVAL, "%s is empty", opt);
    return 0;
}

enum {
    O_IDS = 256,
    O_TEACHER,
    O_TEMP,
    O_TOPK,
    O_TOPP,
    O_MINP,
    O_REP,
    O_PRES,
    O_FREQ,
    O_SEED,
    O_LOGPROBS,
    O_CTX,
    O_THREADS,
    O_CHUNK,
    O_BITEXACT,
    O_JSON,
    O_IGNORE_EOS,
    O_HELP,
    O_NAME,
    O_BACKEND,
    O_RUNTIME,
    O_SPEC,
    O_DRAFT,
    O_DRAFTMAX
};

/* parse_args returns 0, or 2 for a usage error (message printed), or -1 after --help. */
static int parse_args(int argc, char **argv, struct run_opts *o)
{
    static const struct option longopts[] = {
        {"prompt", required_argument, NULL, 'p'},
        {"ids", required_argument, NULL, O_IDS},
        {"teacher", required_argument, NULL, O_TEACHER},
        {"temp", required_argument, NULL, O_TEMP},
        {"top-k", required_argument, NULL, O_TOPK},
        {"top-p", required_argument, NULL, O_TOPP},
        {"min-p", required_argument, NULL, O_MINP},
        {"repeat-penalty", required_argument, NULL, O_REP},
        {"presence-penalty", required_argument, NULL, O_PRES},
        {"frequency-penalty", required_argument, NULL, O_FREQ},
        {"seed", required_argument, NULL, O_SEED},
        {"logprobs", required_argument, NULL, O_LOGPROBS},
        {"ctx", required_argument, NULL, O_CTX},
        {"threads", required_argument, NULL, O_THREADS},
        {"chunk", required_argument, NULL, O_CHUNK},
        {"bit-exact", no_argument, NULL, O_BITEXACT},
        {"json", no_argument, NULL, O_JSON},
        {"ignore-eos", no_argument, NULL, O_IGNORE_EOS},
        {"help", no_argument, NULL, O_HELP},
        {"name", required_argument, NULL, O_NAME},
        {"runtime-dir", required_argument, NULL, O_RUNTIME},
        {"spec-lookup", required_argument, NULL, O_SPEC},
        {"draft", required_argument, NULL, O_DRAFT},
        {"draft-max", required_argument, NULL, O_DRAFTMAX},
        {"backend", required_argument, NULL, O_BACKEND},
        {"kv-type", required_argument, NULL, O_BACKEND},
        {"expert-cache", required_argument, NULL, O_BACKEND},
        {"adapt-every", required_argument, NULL, O_BACKEND},
        {"adapt-swaps", required_argument, NULL, O_BACKEND},
        {"adapt-decay", required_argument, NULL, O_BACKEND},
        {"adapt-min", required_argument, NULL, O_BACKEND},
        {"adapt-lead", required_argument, NULL, O_BACKEND},
        {"cache-verify", required_argument, NULL, O_BACKEND},
        {"pin", required_argument, NULL, O_BACKEND},
        {"pcie-frac", required_argument, NULL, O_BACKEND},
        {"pcie-threshold", required_argument, NULL, O_BACKEND},
        {"vram-mib", required_argument, NULL, O_BACKEND},
        {"gpu", required_argument, NULL, O_BACKEND},
        {"vram-reserve-mib", required_argument, NULL, O_BACKEND},
        {"adapt-async", required_argument, NULL, O_BACKEND},
        {"slot-kv", required_argument, NULL, O_BACKEND},
        {NULL, 0, NULL, 0},
    };
    *o = (struct run_opts){.n_predict = 64, .chunk = 256, .backend = backend_opts_default()};
    sample_params_default(&o->sp);
    o->sp.temperature = 0.8f;
    o->sp.top_k = 40;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.05f;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = ncpu > 0 ? (uint32_t)ncpu : 1;
    optind = 1;
    int c, li = 0, rv = 0;
    while (rv == 0 && (c = getopt_long(argc, argv, "p:n:h", longopts, &li)) != -1) {
        switch (c) {
        case 'p':
            o->prompt = optarg;
            break;
        case O_IDS:
            o->ids = optarg;
            break;
        case O_TEACHER:
            o->teacher = optarg;
            break;
        case 'n':
            rv = strata_cmd_parse_u32(optarg, "-n", 1, &o->n_predict);
            break;
        case O_TEMP:
            rv = parse_f32(optarg, "--temp", &o->sp.temperature);
            break;
        case O_TOPK:
            rv = strata_cmd_parse_u32(optarg, "--top-k", 0, &o->sp.top_k);
            break;
        case O_TOPP:
            rv = parse_f32(optarg, "--top-p", &o->sp.top_p);
            break;
        case O_MINP:
            rv = parse_f32(optarg, "--min-p", &o->sp.min_p);
            break;
        case O_REP:
            rv = parse_f32(optarg, "--repeat-penalty", &o->sp.repeat_penalty);
            break;
        case O_PRES:
            rv = parse_f32(optarg, "--presence-penalty", &o->sp.presence_penalty);
            break;
        case O_FREQ:
            rv = parse_f32(optarg, "--frequency-penalty", &o->sp.frequency_penalty);
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            o->sp.seed = strtoull(optarg, &end, 10);
            /* At most 2^53 - 1: the seed travels in JSON, whose readers keep doubles. */
            if (errno || end == optarg || *end || optarg[0] == '-' || o->sp.seed > SEED_MAX)
                rv = strata_errf(STRATA_EINVAL, "--seed '%s': expected an integer 0..%llu", optarg,
                                 (unsigned long long)SEED_MAX);
            o->seed_given = true;
            break;
        }
        case O_LOGPROBS:
            rv = strata_cmd_parse_u32(optarg, "--logprobs", 0, &o->sp.n_logprobs);
            if (!rv && o->sp.n_logprobs > SAMPLE_MAX_LOGPROBS)
                rv = strata_errf(STRATA_EINVAL, "--logprobs %u: at most %d", o->sp.n_logprobs,
                                 SAMPLE_MAX_LOGPROBS);
            break;
        case O_CTX:
            rv = strata_cmd_parse_u32(optarg, "--ctx", 1, &o->ctx);
            break;
        case O_THREADS:
            rv = strata_cmd_parse_u32(optarg, "--threads", 1, &o->threads);
            break;
        case O_CHUNK:
            rv = strata_cmd_parse_u32(optarg, "--chunk", 1, &o->chunk);
            break;
        case O_BITEXACT:
            o->bit_exact = true;
            break;
        case O_BACKEND:
            rv = backend_opt(&o->backend, longopts[li].name, optarg);
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_IGNORE_EOS:
            o->ignore_eos = true;
            break;
        case O_NAME:
            o->name = optarg;
            break;
        case O_RUNTIME:
            o->runtime_dir = optarg;
            break;
        case O_SPEC:
            rv = strata_cmd_parse_u32(optarg, "--spec-lookup", 0, &o->spec_lookup);
            if (!rv && o->spec_lookup > SPEC_MAX_DRAFT)
                rv = strata_errf(STRATA_EINVAL, "--spec-lookup %u: at most %d", o->spec_lookup,
                                 SPEC_MAX_DRAFT);
            break;
        case O_DRAFT:
            o->draft = optarg;
            break;
        case O_DRAFTMAX:
            rv = strata_cmd_parse_u32(optarg, "--draft-max", 1, &o->draft_max);
            if (!rv && o->draft_max > SPEC_MAX_DRAFT)
                rv = strata_errf(STRATA_EINVAL, "--draft-max %u: at most %d", o->draft_max,
                                 SPEC_MAX_DRAFT);
            break;
        case 'h':
        case O_HELP:
            usage(stdout);
            return -1;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (rv) {
        fprintf(stderr, "strata run: %s\n", strata_errdetail());
        return 2;
    }
    if (optind != argc - !o->name || (!o->prompt == !o->ids) || (o->name && o->teacher)) {
        fprintf(stderr, "strata run: give one MODEL.gguf (or --name NAME, without --teacher) and "
                        "one of -p TEXT or --ids LIST\n");
        usage(stderr);
        return 2;
    }
    if (o->name && (o->spec_lookup || o->draft)) {
        fprintf(stderr, "strata run: with --name the service's workers decode: give them "
                        "--spec-lookup or --draft (strata serve)\n");
        return 2;
    }
    o->model = o->name ? NULL : argv[optind];
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static json_t *ids_json(const int32_t *ids, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

static json_t *logprob_json(const struct sample_result *r)
{
    json_t *top = json_array();
    for (uint32_t j = 0; j < r->n_top; j++)
        json_array_append_new(
            top, json_pack("{s:i, s:f}", "id", r->top[j].id, "logprob", (double)r->top[j].logprob));
    return json_pack("{s:i, s:f, s:o}", "id", r->id, "logprob", (double)r->logprob, "top", top);
}

/* teacher_force scores ids[0..n) as the continuation of the sequence whose next-token logits are
 * in `logits` (n_vocab floats, overwritten): one step per id, then the id is fed. Appends to steps
 * one object per step: the id, its logit, the argmax (lowest id on a tie), the top and the lowest
 * logit (a checker states its tolerance as a share of top - min). Errors as fwd_eval. */
static int teacher_force(struct backend *fw, struct kv_seq *seq, uint32_t n_vocab,
                         const int32_t *ids, size_t n, float *logits, json_t *steps)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t best = 0;
        float lo = logits[0];
        for (uint32_t v = 1; v < n_vocab; v++) {
            if (logits[v] > logits[best]) best = v;
            if (logits[v] < lo) lo = logits[v];
        }
        json_array_append_new(steps,
                              json_pack("{s:i, s:f, s:i, s:f, s:f}", "id", ids[i], "logit",
                                        (double)logits[ids[i]], "argmax", (int)best, "top_logit",
                                        (double)logits[best], "min_logit", (double)lo));
        if (i + 1 == n) break; /* the last id's own logits are not asked for */
        struct backend_token ft = {seq, ids[i], true};
        int rv = backend_eval(fw, &ft, 1, logits);
        if (!rv) rv = backend_tick(fw);
        if (rv) return rv;
    }
    return 0;
}

/* print_json prints o compactly on one line and drops the reference. */
static void print_json(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s) puts(s);
    free(s);
    json_decref(o);
}

/* run_service generates with a worker of the running service o->name (launcher/sup_svc.h). */
static int run_service(struct run_opts *o)
{
    struct tok_ids ids = {0};
    char dir[512], url[SUP_SVC_URL_MAX];
    const char *what = "--ids";
    int rv = 0;
    if (o->ids && (rv = parse_ids(o->ids, "--ids", &ids)) != 0) goto out;
    what = o->name;
    if ((rv = sup_svc_dir(o->runtime_dir, o->name, dir, sizeof dir)) != 0 ||
        (rv = sup_svc_find_worker(dir, 2000, url, sizeof url)) != 0)
        goto out;
    struct sup_svc_gen g = {.prompt = o->prompt,
                            .ids = ids.v,
                            .n_ids = ids.n,
                            .max_tokens = o->n_predict,
                            .ignore_eos = o->ignore_eos,
                            .json = o->json,
                            .n_logprobs = o->sp.n_logprobs};
    g.sampling = (struct wclient_sampling){.temperature = o->sp.temperature,
                                           .top_k = o->sp.top_k,
                                           .top_p = o->sp.top_p,
                                           .min_p = o->sp.min_p,
                                           .repeat_penalty = o->sp.repeat_penalty,
                                           .presence_penalty = o->sp.presence_penalty,
                                           .frequency_penalty = o->sp.frequency_penalty,
                                           .has_seed = o->seed_given,
                                           .seed = o->sp.seed};
    what = url;
    rv = sup_svc_generate(url, &g);
out:
    free(ids.v);
    return rv ? strata_cmd_fail("run", what, rv) : 0;
}

static int run(int argc, char **argv)
{
    struct run_opts o;
    int prv = parse_args(argc, argv, &o);
    if (prv) return prv < 0 ? 0 : prv;
    if (o.name) return run_service(&o);

    struct gguf_file *gf = NULL;
    struct model *m = NULL;
    struct tok *tk = NULL;
    struct kv_cache *kv = NULL;
    struct backend *fw = NULL;
    struct sample *smp = NULL;
    struct gguf_file *dgf = NULL; /* --draft */
    struct model *dm = NULL;
    struct spec_draft *sd = NULL;
    struct kv_seq seq;
    struct spec_seq ss = {0};
    struct tok_ids hist = {0};
    struct tok_buf text = {0};
    json_t *lps = json_array();
    float *logits = NULL;
    const char *what = o.model;
    int rv, status = 1;
    kv_seq_init(&seq);

    if ((rv = gguf_open(o.model, &gf)) != 0) {
        what = NULL; /* the detail names the file and the cause */
        goto fail;
    }
    if ((rv = model_load(gf, &m)) != 0) goto fail;
    const struct model_hparams *hp = &m->hp;
    int tok_rv = tok_from_gguf(gf, NULL, &tk);
    if (o.prompt) {
        what = "tokenizer";
        if ((rv = tok_rv) != 0) goto fail;
        what = "prompt";
        if ((rv = tok_encode(tk, o.prompt, strlen(o.prompt), TOK_ADD_SPECIAL | TOK_PARSE_SPECIAL,
                             &hist)) != 0)
            goto fail;
    } else {
        what = "--ids";
        if ((rv = parse_ids(o.ids, "--ids", &hist)) != 0) goto fail;
    }
    const size_t n_prompt = hist.n;
    if (!n_prompt) {
        rv = strata_errf(STRATA_EINVAL, "the prompt has no tokens");
        goto fail;
    }
    if (o.teacher) {
        what = "--teacher";
        if ((rv = parse_ids(o.teacher, "--teacher", &hist)) != 0) goto fail;
        for (size_t i = n_prompt; i < hist.n; i++) {
            if ((uint32_t)hist.v[i] >= hp->n_vocab) {
                rv = strata_errf(STRATA_EINVAL, "id %d is not below the vocabulary size %u",
                                 hist.v[i], hp->n_vocab);
                goto fail;
            }
        }
    }
    if (!o.seed_given) {
        if (getrandom(&o.sp.seed, sizeof o.sp.seed, 0) != sizeof o.sp.seed)
            o.sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        o.sp.seed &= SEED_MAX;
    }

    what = "setup";
    struct kv_config kc;
    backend_kv_config(m, o.ctx, 1, &kc);
    /* the last teacher id is scored, never fed */
    if (o.teacher && hist.n - 1 > kc.n_ctx) {
        rv = strata_errf(STRATA_ELIMIT,
                         "the prompt and --teacher ids need %zu positions, the context has %u: "
                         "pass a larger --ctx or fewer ids",
                         hist.n - 1, kc.n_ctx);
        goto fail;
    }
    struct backend_opts bo = o.backend;
    bo.n_threads = o.threads;
    bo.max_pass_tokens = o.chunk < kc.n_ctx ? o.chunk : kc.n_ctx;
    bo.n_ctx = kc.n_ctx;
    bo.n_seq = 1;
    /* the pass's sequence is the token sampled and its drafts: a row of logits each */
    const uint32_t k_max = o.teacher                    ? 0
                           : o.draft                    ? (o.draft_max ? o.draft_max : 4)
                           : o.spec_lookup;
    logits = malloc((size_t)(1 + k_max) * hp->n_vocab * sizeof *logits);
    int32_t *grown = realloc(hist.v, (hist.n + o.n_predict) * sizeof *hist.v);
    if (grown) hist.v = grown;
    if (!logits || !grown) {
        rv = strata_errf(STRATA_ENOMEM, "out of memory for %u logits", hp->n_vocab);
        goto fail;
    }
    if ((rv = backend_start(m, &bo, &fw)) != 0 ||
        (!o.teacher && (rv = sample_init(hp->n_vocab, &smp)) != 0))
        goto fail;
    if (o.draft && !o.teacher) {
        what = "--draft";
        const struct spec_draft_opts dopt = {
            .n_threads = o.threads, .n_ctx = kc.n_ctx, .n_seq = 1, .max_pass_tokens = bo.max_pass_tokens};
        if ((rv = gguf_open(o.draft, &dgf)) != 0 || (rv = model_load(dgf, &dm)) != 0 ||
            (rv = spec_draft_start(m, dm, &dopt, &sd)) != 0)
            goto fail;
        what = "setup";
    }
    kv = backend_kv(fw);
    struct backend_info bi;
    backend_info(fw, &bi);
    if (o.bit_exact && !bi.bit_exact) {
        rv = strata_errf(STRATA_EUNSUPPORTED,
                         "--bit-exact: the %s backend cannot promise bit-exact results with these "
                         "options",
                         bi.name);
        goto fail;
    }

    what = "prompt";
    double t0 = now_s();
    if ((rv = backend_prompt(fw, &seq, hist.v, (uint32_t)n_prompt, o.chunk, logits)) != 0)
        goto fail;
    double t1 = now_s();
    if (o.teacher) {
        what = "--teacher";
        json_t *steps = json_array();
        rv = teacher_force(fw, &seq, hp->n_vocab, hist.v + n_prompt, hist.n - n_prompt, logits,
                           steps);
        if (rv) {
            json_decref(steps);
            goto fail;
        }
        print_json(json_pack("{s:o, s:o, s:o}", "prompt_ids", ids_json(hist.v, n_prompt),
                             "teacher_ids", ids_json(hist.v + n_prompt, hist.n - n_prompt), "steps",
                             steps));
        fprintf(stderr,
                "strata run: prompt %zu tokens in %.3f s, scored %zu teacher ids in %.3f s\n",
                n_prompt, t1 - t0, hist.n - n_prompt, now_s() - t1);
    } else {
        const int32_t eos = tk ? tok_eos(tk) : -1;
        const char *finish = "length";
        struct tok_stream ts;
        if (tk) tok_stream_init(&ts, tk, 0);
        what = "generation";
        /* With drafts: the pass after a sampled token feeds it and up to k drafts, a row of
         * logits each; the next positions are sampled from those rows while the drafts match
         * what was sampled (the same draws as one token a pass: the draw is keyed by position). */
        ss = (struct spec_seq){.be = fw, .sd = sd, .seq = &seq};
        spec_adapt_init(&ss.ad, k_max);
        for (uint32_t i = 0; i < o.n_predict; i++) {
            struct sample_result r;
            size_t w0 = hist.n > PENALTY_LAST_N ? hist.n - PENALTY_LAST_N : 0;
            if ((rv = sample_token(smp, &o.sp, logits + (size_t)ss.row * hp->n_vocab,
                                   hist.v + w0, (uint32_t)(hist.n - w0), hist.n, &r)) != 0)
                goto fail;
            hist.v[hist.n++] = r.id;
            json_array_append_new(lps, logprob_json(&r));
            if (!o.json) {
                if (tk) {
                    size_t before = text.n;
                    if ((rv = tok_stream_feed(&ts, r.id, &text)) != 0) goto fail;
                    fwrite(text.p + before, 1, text.n - before, stdout);
                } else {
                    printf("%s%d", i ? " " : "", r.id);
                }
                fflush(stdout);
            } else if (tk && (rv = tok_stream_feed(&ts, r.id, &text)) != 0) {
                goto fail;
            }
            if (r.id == eos && !o.ignore_eos) {
                finish = "stop";
                break;
            }
            if (i + 1 == o.n_predict) break;
            if (hist.n - 1 == kc.n_ctx) { /* every position but the last token's is fed */
                fprintf(stderr, "strata run: the context of %u tokens is full; stopping (--ctx)\n",
                        kc.n_ctx);
                break;
            }
            if (spec_seq_take(&ss, r.id)) continue; /* a draft was right: no pass */
            if ((rv = spec_seq_pass(&ss, hist.v, (uint32_t)hist.n, o.n_predict - i - 1, kc.n_ctx,
                                    bo.max_pass_tokens, logits)) != 0)
                goto fail;
        }
        if (tk) {
            size_t before = text.n;
            if ((rv = tok_stream_flush(&ts, &text)) != 0) goto fail;
            if (!o.json) fwrite(text.p + before, 1, text.n - before, stdout);
        }
        double t2 = now_s();
        const size_t n_gen = hist.n - n_prompt;
        if (o.json) {
            print_json(json_pack(
                "{s:o, s:o, s:s%, s:O, s:I, s:s}", "prompt_ids", ids_json(hist.v, n_prompt), "ids",
                ids_json(hist.v + n_prompt, n_gen), "text", text.p ? text.p : "", text.n,
                "top_logprobs", lps, "seed", (json_int_t)o.sp.seed, "finish_reason", finish));
        } else {
            putchar('\n');
        }
        fprintf(stderr,
                "strata run: prompt %zu tokens in %.3f s (%.1f tok/s), generated %zu in %.3f s "
                "(%.1f tok/s), seed %llu\n",
                n_prompt, t1 - t0, n_prompt / (t1 - t0), n_gen, t2 - t1,
                n_gen > 1 ? (n_gen - 1) / (t2 - t1) : 0.0, (unsigned long long)o.sp.seed);
        if (k_max)
            fprintf(stderr,
                    "strata run: %s drafts: %u of %u accepted (%.0f%%), %.2f tokens per decode "
                    "pass\n",
                    sd ? "draft-model" : "prompt-lookup", (unsigned)ss.accepted,
                    (unsigned)ss.proposed, ss.proposed ? 100.0 * ss.accepted / ss.proposed : 0.0,
                    ss.passes ? (double)(n_gen - 1) / ss.passes : 0.0);
    }
    status = 0;
fail:
    if (status && what)
        status = strata_cmd_fail("run", what, rv);
    else if (status)
        fprintf(stderr, "strata run: %s%s\n", strata_errdetail(),
                rv == strata_errno(ENOENT) ? " (the bundled demo model is models/demo.gguf)" : "");
    json_decref(lps);
    free(text.p);
    free(hist.v);
    free(logits);
    sample_fini(smp);
    if (kv) kv_seq_fini(kv, &seq);
    backend_close(fw);
    spec_seq_fini(&ss);
    spec_draft_close(sd);
    model_fini(dm);
    gguf_close(dgf);
    tok_fini(tk);
    model_fini(m);
    gguf_close(gf);
    return status;
}

const struct strata_cmd strata_cmd_run = {
    "run", "generate text from a GGUF model in this process (or score a continuation: --teacher)",
    run};
