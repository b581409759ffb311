/* fe_model — tokenizer, chat template and turn-ending ids from a model's GGUF metadata. */
#include "frontend/fe_model.h"

#include "common/base/err.h"
#include "common/gguf/gguf.h"
#include "common/tmpl/tmpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Texts of the tokens that end an assistant turn in the templates strata knows. "<|end|>" ends a
 * turn for phi3 but only a message for gpt-oss's channels, so it is skipped for those. GLM-4.5's
 * assistant turn ends where the next role tag would start ("<|user|>", "<|observation|>" for a
 * tool's answer), as llama.cpp's end-of-generation tokens for it. */
static const char *const turn_ends[] = {"<|im_end|>",
                                        "<|eot_id|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|return|>",
                                        "<|endoftext|>",
                                        "<｜end▁of▁sentence｜>",
                                        "<|user|>",
                                        "<|observation|>"};

static void add_stop(struct fe_model *m, int32_t id)
{
    if (id < 0 || m->n_stop_ids == FE_MODEL_MAX_STOP_IDS) return;
    for (uint32_t i = 0; i < m->n_stop_ids; i++)
        if (m->stop_ids[i] == id) return;
    m->stop_ids[m->n_stop_ids++] = id;
}

static char *token_text(const struct tok *t, int32_t id)
{
    size_t len = 0;
    const char *s = id >= 0 ? tok_token_text(t, id, &len) : NULL;
    return s ? strndup(s, len) : strdup("");
}

/* template_source finds the template text: the override (a built-in name or a file), the file's
 * tokenizer.chat_template, or chatml. *owned is set when the text was read from a file. */
static int template_source(const struct gguf_file *meta, const char *spec, const char **src,
                           size_t *len, char **owned)
{
    struct gguf_str s;
    *owned = NULL;
    if (spec && tmpl_named(spec, src) != 0) {
        FILE *f = fopen(spec, "rb");
        if (!f)
            return strata_errf(STRATA_ENOENT,
                               "--chat-template '%s' is neither a built-in template (%s) nor a "
                               "readable file",
                               spec, tmpl_named_list());
        char *buf = NULL;
        size_t n = 0, cap = 0, got;
        do {
            if (n + 4096 > cap) {
                char *p = realloc(buf, cap = cap ? cap * 2 : 8192);
                if (!p) {
                    free(buf);
                    fclose(f);
                    return strata_errf(STRATA_ENOMEM, "chat template %s", spec);
                }
                buf = p;
            }
            got = fread(buf + n, 1, cap - n, f);
            n += got;
        } while (got > 0);
        fclose(f);
        *owned = buf;
        *src = buf;
        *len = n;
        return 0;
    }
    if (spec) {
        *len = strlen(*src);
        return 0;
    }
    if (gguf_get_str(meta, "tokenizer.chat_template", &s) == 0) {
        *src = s.ptr;
        *len = (size_t)s.len;
        return 0;
    }
    tmpl_named("chatml", src);
    *len = strlen(*src);
    return 0;
}

/* Names converters write when they know none: they say nothing of the model. */
static const char *const placeholder_names[] = {"converted by strata"};

void fe_model_name(const struct gguf_file *meta, const char *worker_url, char *buf, size_t n)
{
    struct gguf_str s;
    if (gguf_get_str(meta, "general.name", &s) == 0) {
        while (s.len > 0 && (s.ptr[0] == ' ' || s.ptr[0] == '\t'))
            s.ptr++, s.len--;
        while (s.len > 0 && (s.ptr[s.len - 1] == ' ' || s.ptr[s.len - 1] == '\t'))
            s.len--;
        bool placeholder = s.len == 0;
        for (size_t i = 0; i < sizeof placeholder_names / sizeof *placeholder_names; i++)
            placeholder |= s.len == strlen(placeholder_names[i]) &&
                           strncasecmp(s.ptr, placeholder_names[i], s.len) == 0;
        if (!placeholder) {
            snprintf(buf, n, "%.*s", (int)s.len, s.ptr);
            return;
        }
    }
    const char *file = worker_url ? strrchr(worker_url, '/') : NULL, *dir = file;
    if (file && strncmp(worker_url, "ipc://", 6) == 0) {
        while (dir > worker_url && dir[-1] != '/')
            dir--;
        if (dir > worker_url + 6 && file > dir) {
            snprintf(buf, n, "%.*s", (int)(file - dir), dir);
            return;
        }
    }
    snprintf(buf, n, "strata");
}

/* read_stops fills m's stop strings from strata.stop. */
static int read_stops(struct fe_model *m, const struct gguf_file *meta)
{
    const struct gguf_kv *kv = gguf_find(meta, "strata.stop");
    if (!kv) return 0;
    const struct gguf_value *v = &kv->val;
    uint64_t n = v->type == GGUF_STRING ? 1 : v->type == GGUF_ARRAY ? v->arr.n : 0;
    if ((v->type != GGUF_STRING && (v->type != GGUF_ARRAY || v->arr.type != GGUF_STRING)) ||
        n > FE_MODEL_MAX_STOP_STRS)
        return strata_errf(STRATA_EINVAL,
                           "strata.stop must be a string or an array of at most %d strings (it "
                           "is a %s of %llu): fix the file's metadata (strata quantize IN OUT "
                           "copy --override-kv strata.stop=str:TEXT)",
                           FE_MODEL_MAX_STOP_STRS, gguf_vtype_name(v->type), (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s = v->type == GGUF_STRING ? v->str : gguf_arr_str(v, i);
        if (s.len == 0) continue;
        if (!(m->stop_strs[m->n_stop_strs] = strndup(s.ptr, s.len)))
            return strata_errf(STRATA_ENOMEM, "model: stop strings");
        m->n_stop_strs++;
    }
    return 0;
}

int fe_model_init(struct fe_model *m, const struct gguf_file *meta, uint32_t n_ctx,
                  const char *tmpl_spec, const char *worker_url)
{
    int rv;
    const char *src = NULL;
    size_t len = 0;
    char *owned = NULL;
    memset(m, 0, sizeof *m);
    m->n_ctx = n_ctx;
    if ((rv = tok_from_gguf(meta, NULL, &m->tok)) != 0) goto fail;
    m->n_vocab = tok_n_vocab(m->tok);
    if ((rv = template_source(meta, tmpl_spec, &src, &len, &owned)) != 0) goto fail;
    if ((rv = tmpl_compile(src, len, NULL, &m->tmpl)) != 0) goto fail;
    if (!(m->tmpl_src = strndup(src, len))) {
        rv = strata_errf(STRATA_ENOMEM, "model: chat template text");
        goto fail;
    }
    struct gguf_str arch;
    if (gguf_get_str(meta, "general.architecture", &arch) == 0 && arch.len < 64) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.ptr);
        gguf_get_u32(meta, key, &m->n_ctx_train);
    }
    m->reason = tmpl_reason_style_of(src, len);
    add_stop(m, tok_eos(m->tok));
    uint32_t eot;
    if (gguf_get_u32(meta, "tokenizer.ggml.eot_token_id", &eot) == 0) add_stop(m, (int32_t)eot);
    for (size_t i = 0; i < sizeof turn_ends / sizeof *turn_ends; i++) {
        if (m->reason == TMPL_REASON_CHANNEL && strcmp(turn_ends[i], "<|end|>") == 0) continue;
        int32_t id = tok_find(m->tok, turn_ends[i], strlen(turn_ends[i]));
        if (id >= 0 && tok_token_type(m->tok, id) == TOK_TYPE_CONTROL) add_stop(m, id);
    }
    if ((rv = read_stops(m, meta)) != 0) goto fail;
    fe_model_name(meta, worker_url, m->name, sizeof m->name);
    m->bos_text = token_text(m->tok, tok_bos(m->tok));
    m->eos_text = token_text(m->tok, tok_eos(m->tok));
    if (!m->bos_text || !m->eos_text) {
        rv = strata_errf(STRATA_ENOMEM, "model: special token texts");
        goto fail;
    }
    free(owned);
    return 0;
fail:
    free(owned);
    fe_model_fini(m);
    return rv;
}

void fe_model_fini(struct fe_model *m)
{
    tok_fini(m->tok);
    tmpl_fini(m->tmpl);
    for (uint32_t i = 0; i < m->n_stop_strs; i++)
        free(m->stop_strs[i]);
    free(m->bos_text);
    free(m->eos_text);
    free(m->tmpl_src);
    memset(m, 0, sizeof *m);
}

int fe_model_render(const struct fe_model *m, const json_t *messages, const json_t *kwargs,
                    const char *reasoning_effort, char **text, size_t *len)
{
    int rv;
    *text = NULL;
    *len = 0;
    json_t *vars = json_pack("{s:O, s:b, s:s, s:s}", "messages", messages, "add_generation_prompt",
                             1, "bos_token", m->bos_text, "eos_token", m->eos_text);
    if (!vars) return strata_errf(STRATA_ENOMEM, "chat: template variables");
    /* kwargs are the client's template switches (enable_thinking...); they may not replace the
     * conversation itself */
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)kwargs, key, v)
    {
        if (strcmp(key, "messages") != 0) json_object_set(vars, key, v);
    }
    if (reasoning_effort)
        json_object_set_new(vars, "reasoning_effort", json_string(reasoning_effort));
    rv = tmpl_render_json(m->tmpl, vars, text, len);
    json_decref(vars);
    return rv;
}

int fe_model_chat(const struct fe_model *m, const json_t *messages, const json_t *kwargs,
                  const char *reasoning_effort, struct tok_ids *out, bool *opens)
{
    char *text;
    size_t len;
    int rv = fe_model_render(m, messages, kwargs, reasoning_effort, &text, &len);
    if (rv != 0) goto out;
    unsigned flags = TOK_PARSE_SPECIAL;
    size_t bl = strlen(m->bos_text);
    if (bl == 0 || len < bl || memcmp(text, m->bos_text, bl) != 0) flags |= TOK_ADD_SPECIAL;
    if ((rv = tok_encode(m->tok, text, len, flags, out)) != 0) goto out;
    *opens = tmpl_reason_prompt_opens(m->reason, text, len);
out:
    free(text);
    return rv;
}
