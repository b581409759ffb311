/* strata bench-worker — `strata bench-worker --worker URL`: aggregate decode tokens/s of a running
 * strata-worker at 1, 4 and 16 concurrent streams (or --streams LIST), through common/ipc/wclient.h.
 *
 * Each stream has its own prompt (no shared prefix, so the prefix cache does not help) and decodes
 * greedily without stop ids. Every update's arrival is time-stamped; the decode rate counts the
 * tokens that arrived while all streams of the round were decoding (after the last one's first
 * token, up to the first finish), so prefill and the ramp at either end stay out of it. */
#include "common/base/err.h"
#include "common/ipc/wclient.h"
#include "launcher/cmd.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_STREAMS 256

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata bench-worker --worker URL [--streams 1,4,16] [--tokens N]\n"
            "                           [--prompt N]\n"
            "\n"
            "Measures a running strata-worker: for each stream count S, S requests at once of a\n"
            "different N-id prompt each (default 32), greedy, --tokens generated each (default\n"
            "64); prints the aggregate decode tokens/s while all S decode, the wall rate, the\n"
            "time to first token, and the load average of this machine.\n");
}

struct arrival {
    double t;
    uint32_t n;
};

struct bstream {
    struct wclient *c;
    int round, k;
    uint32_t n_prompt, n_tokens;
    double t0, t_first, t_end;
    struct arrival *arr;
    uint32_t n_arr;
    uint32_t got;
    int rv;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *bench_one(void *arg)
{
    struct bstream *b = arg;
    int32_t *p = malloc(b->n_prompt * sizeof *p);
    char id[64];
    if (!p) {
        b->rv = STRATA_ENOMEM;
        return NULL;
    }
    for (uint32_t i = 0; i < b->n_prompt; i++)
        p[i] = (int32_t)((b->round * 7919 + b->k * 131 + i * 17 + 3) % 200 + 1);
    snprintf(id, sizeof id, "bench-%d-%d-%d", (int)getpid(), b->round, b->k);
    struct wclient_req r = {
        .id = id, .prompt = p, .n_prompt = b->n_prompt, .max_tokens = b->n_tokens};
    wclient_sampling_default(&r.sampling);
    struct wclient_stream *s;
    b->t0 = now_s();
    if ((b->rv = wclient_stream_start(b->c, &r, &s)) != 0) {
        free(p);
        return NULL;
    }
    const struct wclient_update *u;
    do {
        if ((b->rv = wclient_stream_next(s, &u)) != 0) break;
        double t = now_s();
        if (u->n_tokens && !b->got) b->t_first = t;
        if (u->n_tokens) b->arr[b->n_arr++] = (struct arrival){t, u->n_tokens};
        b->got += u->n_tokens;
    } while (u->finish == WCLIENT_RUNNING);
    b->t_end = now_s();
    wclient_stream_free(s);
    free(p);
    return NULL;
}

static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

/* round runs S streams at once and prints a row. */
static int round_of(struct wclient *c, int round, int S, uint32_t n_prompt, uint32_t n_tokens)
{
    struct bstream *bs = calloc((size_t)S, sizeof *bs);
    pthread_t *th = calloc((size_t)S, sizeof *th);
    int rv = 0;
    if (!bs || !th) {
        rv = STRATA_ENOMEM;
        goto done;
    }
    double load = loadavg();
    for (int k = 0; k < S; k++) {
        bs[k] = (struct bstream){
            .c = c, .round = round, .k = k, .n_prompt = n_prompt, .n_tokens = n_tokens};
        if (!(bs[k].arr = calloc(n_tokens, sizeof *bs[k].arr))) {
            rv = STRATA_ENOMEM;
            S = k;
            break;
        }
    }
    for (int k = 0; k < S; k++)
        pthread_create(&th[k], NULL, bench_one, &bs[k]);
    for (int k = 0; k < S; k++)
        pthread_join(th[k], NULL);
    if (rv != 0) goto done;
    double t0 = 1e300, ta = 0, tb = 1e300, tend = 0, ttft = 0;
    uint64_t total = 0, steady = 0;
    for (int k = 0; k < S; k++) {
        if (bs[k].rv != 0) {
            rv = bs[k].rv;
            goto done;
        }
        if (bs[k].t0 < t0) t0 = bs[k].t0;
        if (bs[k].t_first > ta) ta = bs[k].t_first;
        if (bs[k].t_end < tb) tb = bs[k].t_end;
        if (bs[k].t_end > tend) tend = bs[k].t_end;
        ttft += bs[k].t_first - bs[k].t0;
        total += bs[k].got;
    }
    for (int k = 0; k < S; k++)
        for (uint32_t i = 0; i < bs[k].n_arr; i++)
            if (bs[k].arr[i].t > ta && bs[k].arr[i].t <= tb) steady += bs[k].arr[i].n;
    double decode = tb > ta ? (double)steady / (tb - ta) : 0;
    printf("%7d  %11.1f  %9.1f  %11.1f  %8llu  %7.2f\n", S, decode, (double)total / (tend - t0),
           ttft / S * 1e3, (unsigned long long)total, load);
done:
    for (int k = 0; bs && k < S; k++)
        free(bs[k].arr);
    free(bs);
    free(th);
    return rv;
}

static int run(int argc, char **argv)
{
    const char *url = NULL, *list = "1,4,16";
    uint32_t n_tokens = 64, n_prompt = 32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        char *end;
        unsigned long n = strtoul(v, &end, 10);
        if (strcmp(a, "--worker") == 0) {
            url = v;
        } else if (strcmp(a, "--streams") == 0) {
            list = v;
        } else if ((strcmp(a, "--tokens") == 0 || strcmp(a, "--prompt") == 0) && *v && !*end &&
                   n >= 1 && n <= 100000) {
            *(a[2] == 't' ? &n_tokens : &n_prompt) = (uint32_t)n;
        } else {
            fprintf(stderr, "strata bench-worker: bad option %s %s\n", a, v);
            usage(stderr);
            return 2;
        }
    }
    if (!url) {
        usage(stderr);
        return 2;
    }
    struct wclient *c;
    struct wclient_hello h;
    int rv = wclient_open(url, NULL, &c);
    if (rv != 0) return strata_cmd_fail("bench-worker", url, rv);
    if ((rv = wclient_hello(c, &h)) != 0) {
        wclient_close(c);
        return strata_cmd_fail("bench-worker", "hello", rv);
    }
    printf("worker %s: %s (%s), backend %s, context %u, %u streams at most\n"
           "prompt %u ids, %u tokens per stream, greedy; %ld CPUs here\n\n",
           url, h.model, h.arch, h.backend, h.n_ctx, h.max_seqs, n_prompt, n_tokens,
           sysconf(_SC_NPROCESSORS_ONLN));
    printf("streams  decode tok/s  wall tok/s  ttft ms avg    tokens  load1\n");
    int round = 0;
    for (const char *p = list; *p;) {
        char *end;
        errno = 0;
        long S = strtol(p, &end, 10);
        if (end == p || errno || S < 1 || S > MAX_STREAMS || (*end && *end != ',')) {
            fprintf(stderr,
                    "strata bench-worker: --streams %s: give counts 1..%d, comma-separated\n", list,
                    MAX_STREAMS);
            wclient_close(c);
            return 2;
        }
        if ((rv = round_of(c, round++, (int)S, n_prompt, n_tokens)) != 0) {
            wclient_close(c);
            return strata_cmd_fail("bench-worker", "stream", rv);
        }
        p = *end ? end + 1 : end;
    }
    wclient_close(c);
    return 0;
}

const struct strata_cmd strata_cmd_bench_worker = {
    "bench-worker", "aggregate decode tok/s of a running worker", run};
