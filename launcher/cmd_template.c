/* strata template — renders a chat template for one conversation: the template is a file or a
 * built-in name, the conversation a JSON object on stdin (messages, add_generation_prompt,
 * bos_token, eos_token, extra); the rendering goes to stdout with nothing added. */
#include "common/base/err.h"
#include "common/tmpl/tmpl.h"
#include "launcher/cmd.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: strata template NAME|FILE.jinja [--date YYYY-MM-DD] < case.json\n"
            "  Renders a chat template file or built-in template for the conversation read\n"
            "  from stdin: {\"messages\": [...], \"add_generation_prompt\": true,\n"
            "  \"bos_token\": \"..\", \"eos_token\": \"..\", \"extra\": {...}}; the keys of\n"
            "  \"extra\" become template variables too. Prints the rendering, nothing added.\n"
            "  built-in: %s\n"
            "  --date  the date strftime_now() formats (default: today)\n",
            tmpl_named_list());
}

/* case_vars builds the template variables from a case: the four named keys plus extra's keys. */
static int case_vars(const json_t *c, json_t **out)
{
    static const char *const keys[] = {"messages", "add_generation_prompt", "bos_token",
                                       "eos_token"};
    json_t *v = json_object();
    if (!v) return STRATA_ENOMEM;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        json_t *x = json_object_get(c, keys[i]);
        if (x && json_object_set(v, keys[i], x) != 0) goto oom;
    }
    json_t *extra = json_object_get(c, "extra");
    if (extra && !json_is_object(extra)) {
        json_decref(v);
        return strata_errf(STRATA_EINVAL, "\"extra\" must be a JSON object");
    }
    if (extra && json_object_update(v, extra) != 0) goto oom;
    *out = v;
    return 0;
oom:
    json_decref(v);
    return STRATA_ENOMEM;
}

/* show_line prints the template line an error detail ("line N: ...") names, to stderr. */
static void show_line(const char *spec)
{
    int line;
    if (sscanf(strata_errdetail(), "line %d:", &line) != 1 || line < 1) return;
    const char *src;
    char *text = NULL;
    if (tmpl_named(spec, &src) != 0) {
        FILE *f = fopen(spec, "rb");
        size_t cap = 0;
        if (!f) return;
        ssize_t n = getdelim(&text, &cap, 0, f); /* the whole file: templates hold no NUL */
        fclose(f);
        if (n < 0) {
            free(text);
            return;
        }
        src = text;
    }
    for (int k = 1; k < line && src; k++) {
        src = strchr(src, '\n');
        if (src) src++;
    }
    if (src) {
        size_t n = strcspn(src, "\r\n");
        fprintf(stderr, "  %d | %.*s\n", line, (int)(n > 200 ? 200 : n), src);
    }
    free(text);
}

static int run(int argc, char **argv)
{
    const char *spec = NULL, *date = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--date") && i + 1 < argc) {
            date = argv[++i];
        } else if (argv[i][0] == '-' || spec) {
            usage(stderr);
            return 2;
        } else {
            spec = argv[i];
        }
    }
    if (!spec) {
        usage(stderr);
        return 2;
    }
    struct tm tm = {0};
    if (date) {
        char *end = strptime(date, "%Y-%m-%d", &tm);
        if (!end || *end) {
            fprintf(stderr, "strata template: --date %s: expected YYYY-MM-DD\n", date);
            return 2;
        }
        tm.tm_hour = 12; /* midday: no time zone moves it to another day */
        tm.tm_isdst = -1;
    }
    struct tmpl *t = NULL;
    json_t *c = NULL, *vars = NULL;
    char *out = NULL;
    size_t len;
    int rv, status = 1;
    if ((rv = tmpl_load(spec, NULL, &t)) != 0) {
        strata_cmd_fail("template", spec, rv);
        show_line(spec);
        goto done;
    }
    if (date) tmpl_set_now(t, mktime(&tm));
    json_error_t jerr;
    if (!(c = json_loadf(stdin, 0, &jerr)) || !json_is_object(c)) {
        fprintf(stderr, "strata template: stdin: expected a JSON object: %s (line %d)\n",
                c ? "not an object" : jerr.text, jerr.line);
        goto done;
    }
    if ((rv = case_vars(c, &vars)) != 0) {
        strata_cmd_fail("template", "stdin", rv);
        goto done;
    }
    if ((rv = tmpl_render_json(t, vars, &out, &len)) != 0) {
        strata_cmd_fail("template", spec, rv);
        show_line(spec);
        goto done;
    }
    status = fwrite(out, 1, len, stdout) == len && fflush(stdout) == 0 ? 0 : 1;
done:
    free(out);
    json_decref(vars);
    json_decref(c);
    tmpl_fini(t);
    return status;
}

const struct strata_cmd strata_cmd_template = {"template",
                                               "render a chat template for a "
                                               "conversation on stdin",
                                               run};
