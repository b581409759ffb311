/* fe_model — what the frontend knows of the model it serves: the tokenizer, the chat template,
 * the reasoning markup, the context length and the ids that end a turn, all built from the GGUF
 * metadata a worker's `meta` returns (or a local file's).
 *
 * Immutable after fe_model_init: any number of threads render prompts and decode with one model
 * at once (tok and tmpl are thread-safe after construction). The HTTP frontend and the CLI chat
 * share it.
 */
#ifndef STRATA_FE_MODEL_H
#define STRATA_FE_MODEL_H

#include "common/tmpl/tmpl_reason.h"
#include "common/tok/tok.h"
#include "frontend/fe_stop.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct gguf_file;
struct tmpl;

#define FE_MODEL_MAX_STOP_IDS  8
#define FE_MODEL_MAX_STOP_STRS FE_STOP_MODEL_MAX

struct fe_model {
    struct tok *tok;
    struct tmpl *tmpl;             /* the chat template (the override, the file's, chatml) */
    enum tmpl_reason_style reason; /* reasoning markup of the template */
    uint32_t n_ctx;                /* positions of one request (prompt + generated) */
    uint32_t n_vocab;
    int32_t stop_ids[FE_MODEL_MAX_STOP_IDS]; /* EOS and end-of-turn tokens the vocabulary has */
    uint32_t n_stop_ids;
    /* strata.stop (a string or an array of strings): texts that end the model's turn, for a
     * model that has no end-of-turn token (the demo: a blank line between speeches). The HTTP
     * frontend adds them to every chat request's stop strings (not to raw completions), and so
     * does the CLI chat. */
    char *stop_strs[FE_MODEL_MAX_STOP_STRS];
    uint32_t n_stop_strs;
    char name[128];            /* fe_model_name's choice */
    char *tmpl_src;            /* the chat template's text (for /props) */
    uint32_t n_ctx_train;      /* general.context_length, 0 when the file does not say */
    char *bos_text, *eos_text; /* for the template's bos_token / eos_token ("" if none) */
};

/* fe_model_init builds m from meta (not kept). n_ctx: the worker's context. tmpl_spec: NULL for
 * the file's template (chatml when it has none), else a built-in name or a file (tmpl_load).
 * worker_url: the URL the metadata came from, for the name (fe_model_name; may be NULL).
 * Returns 0 or the tokenizer's / template's error with the detail; STRATA_EINVAL for more than
 * FE_MODEL_MAX_STOP_STRS stop strings or a strata.stop that is not strings; on failure m holds
 * nothing. */
int fe_model_init(struct fe_model *m, const struct gguf_file *meta, uint32_t n_ctx,
                  const char *tmpl_spec, const char *worker_url);

/* fe_model_name writes the model's name to buf: general.name when it names the model (not empty,
 * not a converter's placeholder such as "converted by strata"), else the name of the worker's
 * runtime directory in worker_url (ipc://.../strata/NAME/worker-0.sock: NAME is the arena's name,
 * which is the model file's base name unless --name chose another), else "strata". */
void fe_model_name(const struct gguf_file *meta, const char *worker_url, char *buf, size_t n);

/* fe_model_fini frees m; a zeroed m is fine. */
void fe_model_fini(struct fe_model *m);

/* fe_model_render renders messages with the generation prompt, kwargs and reasoning_effort as
 * fe_model_chat does, into *text (malloc'd, *len bytes; the caller frees it, also on failure).
 * Returns 0, STRATA_EINVAL (the template raised), STRATA_ELIMIT, STRATA_ENOMEM. */
int fe_model_render(const struct fe_model *m, const json_t *messages, const json_t *kwargs,
                    const char *reasoning_effort, char **text, size_t *len);

/* fe_model_chat renders messages (a JSON array of {"role", "content"}) with the generation prompt,
 * plus kwargs' keys (chat_template_kwargs, may be NULL) and reasoning_effort (may be NULL) as
 * template variables, and tokenizes the result (special tokens parsed; BOS added when the
 * vocabulary wants it and the template did not write it). *opens: the prompt leaves the answer
 * inside the reasoning. Returns 0, STRATA_EINVAL (the template raised: the detail says why),
 * STRATA_ELIMIT, STRATA_ENOMEM. */
int fe_model_chat(const struct fe_model *m, const json_t *messages, const json_t *kwargs,
                  const char *reasoning_effort, struct tok_ids *out, bool *opens);

#endif
