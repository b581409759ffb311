/* tmpl — chat templates: a Jinja2 interpreter for the `tokenizer.chat_template` of a model, the
 * named built-in templates for models without one, and reasoning-content splitting.
 *
 * Semantics follow Python Jinja2 3.1 as Hugging Face transformers renders chat templates
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, `{% generation %}`,
 * tojson = json.dumps(ensure_ascii=False), raise_exception, strftime_now). Differences, by choice:
 * list.append/pop work (the sandbox forbids them); macros accept extra arguments as varargs and
 * kwargs whether or not the body uses them; integers are 64-bit (overflow is an error, Python's
 * are unbounded); case mapping covers Latin, Greek and Cyrillic only. include/import/extends are
 * errors: templates are untrusted input and never reach files or the network. Every render is
 * bounded by the limits: steps (loop iterations and macro calls), macro call depth, output bytes
 * and memory; parsing by nesting depth and token count. Unknown filters and tests fail at compile
 * time, except inside an `if` body, where they fail only when run (Jinja2's rule). A compiled
 * template is immutable: render it from any number of threads at once. Errors return a STRATA_E*
 * code with "line N: what" in strata_errdetail().
 */
#ifndef STRATA_TMPL_H
#define STRATA_TMPL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct tmpl_limits {
    size_t max_source;   /* template bytes (default 1 MiB) */
    int max_parse_depth; /* nesting of blocks and expressions (default 100) */
    uint64_t max_steps;  /* loop iterations + macro calls + statements run (default 1,000,000) */
    int max_call_depth;  /* macro calls in progress (default 64) */
    size_t max_output;   /* rendered bytes (default 4 MiB) */
    size_t max_memory;   /* bytes of values one render may allocate (default 64 MiB) */
};

/* tmpl_limits_default fills l with the defaults above: ample for every real chat template. */
void tmpl_limits_default(struct tmpl_limits *l);

struct tmpl;

/* tmpl_compile parses src[len] (UTF-8 Jinja) with limits lim (NULL: defaults) into *out, which the
 * caller frees with tmpl_fini. STRATA_EFORMAT: a syntax error, unknown filter or test, or a
 * forbidden tag; STRATA_ELIMIT: a limit; STRATA_ENOMEM. */
int tmpl_compile(const char *src, size_t len, const struct tmpl_limits *lim, struct tmpl **out);

/* tmpl_set_now fixes the time strftime_now() formats (local time of `now`); (time_t)-1, the
 * default, reads the clock at each render. Not thread-safe against a concurrent render. */
void tmpl_set_now(struct tmpl *t, time_t now);

/* tmpl_render_json renders t with the variables of the JSON object vars (messages,
 * add_generation_prompt, bos_token, eos_token and any extra keys) into a malloc'd NUL-terminated
 * *out of *len bytes (caller frees). Does not block. STRATA_EINVAL: the template raised or hit a
 * type error (raise_exception's message is in the detail); STRATA_ELIMIT: a limit was reached. */
int tmpl_render_json(const struct tmpl *t, const json_t *vars, char **out, size_t *len);

/* tmpl_fini frees t; NULL is fine. */
void tmpl_fini(struct tmpl *t);

/* tmpl_named returns the source of the built-in template `name` (chatml, llama3, mistral,
 * mistral-v7, gemma, phi3, deepseek3) in *src (static); STRATA_ENOENT for another name. */
int tmpl_named(const char *name, const char **src);

/* tmpl_named_list returns the built-in names, comma separated (static), for usage messages. */
const char *tmpl_named_list(void);

/* tmpl_load compiles `spec` as --chat-template takes it: a built-in name, else a file path.
 * STRATA_ENOENT when it is neither; file errors as strata_errno; else as tmpl_compile. */
int tmpl_load(const char *spec, const struct tmpl_limits *lim, struct tmpl **out);

#endif
