/* tmpl_named — built-in chat templates for models whose GGUF has none, chosen by name as
 * llama.cpp's --chat-template names them, and the NAME|FILE loader behind --chat-template.
 * Each is Jinja source rendering exactly what llama.cpp's hand-written formatter of the same
 * name renders (llama_chat_apply_template); like those, they leave BOS to the tokenizer. */
#include "common/tmpl/tmpl.h"

#include "common/base/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    const char *src;
} named[] = {
    {"chatml", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"},
    {"llama3", "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
               "{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
               "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"},
    /* llama.cpp's mistral-v3-tekken (Mistral Nemo and later): no spaces around [INST] */
    {"mistral", "{% set ns = namespace(open=false) %}{% for m in messages %}"
                "{% if not ns.open %}[INST]{% set ns.open = true %}{% endif %}"
                "{% if m.role == 'system' %}{{ m.content }}\n\n"
                "{% elif m.role == 'user' %}{{ m.content }}[/INST]"
                "{% else %}{{ m.content }}</s>{% set ns.open = false %}{% endif %}{% endfor %}"},
    {"mistral-v7", "{% for m in messages %}{% if m.role == 'system' %}[SYSTEM_PROMPT] "
                   "{{ m.content }}[/SYSTEM_PROMPT]{% elif m.role == 'user' %}[INST] "
                   "{{ m.content }}[/INST]{% else %} {{ m.content }}</s>{% endif %}{% endfor %}"},
    /* gemma has no system role: the system text opens the next user turn */
    {"gemma", "{% set ns = namespace(sys='') %}{% for m in messages %}"
              "{% if m.role == 'system' %}{% set ns.sys = ns.sys + m.content | trim %}{% else %}"
              "{% set role = 'model' if m.role == 'assistant' else m.role %}"
              "<start_of_turn>{{ role }}\n{% if ns.sys and role != 'model' %}{{ ns.sys }}\n\n"
              "{% set ns.sys = '' %}{% endif %}{{ m.content | trim }}<end_of_turn>\n{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"},
    {"phi3", "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"},
    {"deepseek3", "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n"
                  "{% elif m.role == 'user' %}<｜User｜>{{ m.content }}"
                  "{% elif m.role == 'assistant' %}<｜Assistant｜>{{ m.content }}"
                  "<｜end▁of▁sentence｜>{% endif %}{% endfor %}"
                  "{% if add_generation_prompt %}<｜Assistant｜>{% endif %}"},
};

int tmpl_named(const char *name, const char **src)
{
    for (size_t i = 0; i < sizeof named / sizeof *named; i++)
        if (!strcmp(named[i].name, name)) {
            *src = named[i].src;
            return 0;
        }
    return strata_errf(STRATA_ENOENT, "no built-in chat template named '%s' (built-in: %s)", name,
                       tmpl_named_list());
}

const char *tmpl_named_list(void)
{
    return "chatml, llama3, mistral, mistral-v7, gemma, phi3, deepseek3";
}

int tmpl_load(const char *spec, const struct tmpl_limits *lim, struct tmpl **out)
{
    const char *src = NULL;
    if (tmpl_named(spec, &src) == 0) return tmpl_compile(src, strlen(src), lim, out);
    FILE *f = fopen(spec, "rb");
    if (!f) {
        if (errno == ENOENT)
            return strata_errf(STRATA_ENOENT,
                               "--chat-template %s: neither a built-in template "
                               "(%s) nor a file",
                               spec, tmpl_named_list());
        return strata_errf(strata_errno(errno), "cannot open chat template %s", spec);
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rv = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16384;
            char *nb = cap <= (64u << 20) ? realloc(buf, cap) : NULL;
            if (!nb) {
                rv = strata_errf(STRATA_ELIMIT, "chat template %s is too large", spec);
                goto done;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    if (ferror(f)) {
        rv = strata_errf(STRATA_EIO, "cannot read chat template %s", spec);
        goto done;
    }
    rv = tmpl_compile(buf, n, lim, out);
done:
    free(buf);
    fclose(f);
    return rv;
}
