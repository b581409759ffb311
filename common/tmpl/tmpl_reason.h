/* tmpl_reason — splits a reasoning model's generated text into `reasoning_content` and the
 * answer (`content`), for the OpenAI-style HTTP API, whole or incrementally while streaming.
 *
 * Two markups: the think-tag style (DeepSeek-R1, Qwen3, QwQ, SmolLM3: "<think>...</think>answer",
 * where the template's generation prompt may already have opened "<think>", so the text starts
 * inside the reasoning) and gpt-oss's channel style ("<|channel|>analysis<|message|>...<|end|>"
 * then "<|start|>assistant<|channel|>final<|message|>answer"; commentary goes to content).
 * Whitespace right after an opening or closing tag is dropped; the whole-text split also trims
 * the reasoning's trailing whitespace. A stream holds back only bytes that may begin a tag, so
 * the concatenated deltas equal the whole-text split (up to that trailing whitespace).
 * A stream object belongs to one thread; the functions never block.
 */
#ifndef STRATA_TMPL_REASON_H
#define STRATA_TMPL_REASON_H

#include <stdbool.h>
#include <stddef.h>

enum tmpl_reason_style {
    TMPL_REASON_NONE,    /* no reasoning markup: all text is content */
    TMPL_REASON_THINK,   /* <think>...</think> */
    TMPL_REASON_CHANNEL, /* gpt-oss <|channel|>NAME<|message|>...<|end|> */
};

/* tmpl_reason_style_of guesses the style from a chat template's source (or a generated text). */
enum tmpl_reason_style tmpl_reason_style_of(const char *src, size_t n);

/* tmpl_reason_prompt_opens reports whether a rendered prompt ends inside the reasoning (an
 * open "<think>" or "<|channel|>analysis<|message|>", trailing whitespace aside): the generated
 * text then starts as reasoning. */
bool tmpl_reason_prompt_opens(enum tmpl_reason_style style, const char *prompt, size_t n);

/* Deltas: malloc'd, NUL-terminated, grown by each call; reset the lengths to reuse. */
struct tmpl_reason_out {
    char *content, *reasoning;
    size_t content_len, reasoning_len;
    size_t content_cap, reasoning_cap;
};
void tmpl_reason_out_free(struct tmpl_reason_out *o);

struct tmpl_reason_stream {
    enum tmpl_reason_style style;
    int state;
    bool to_reasoning; /* channel style: the current message body is analysis */
    char *pend;        /* bytes not yet classified: a possible tag prefix or a header */
    size_t pend_len, pend_cap;
};

/* tmpl_reason_init starts a stream; in_reasoning: the prompt opened the reasoning. */
void tmpl_reason_init(struct tmpl_reason_stream *s, enum tmpl_reason_style style,
                      bool in_reasoning);

/* tmpl_reason_feed classifies text[n] and appends what is certain to o. STRATA_ENOMEM. */
int tmpl_reason_feed(struct tmpl_reason_stream *s, const char *text, size_t n,
                     struct tmpl_reason_out *o);

/* tmpl_reason_finish flushes what the stream held back (the text ended) and frees its state. */
int tmpl_reason_finish(struct tmpl_reason_stream *s, struct tmpl_reason_out *o);

/* tmpl_reason_split splits a whole generated text into *content and *reasoning (malloc'd,
 * NUL-terminated; *reasoning is "" when there is none). STRATA_ENOMEM. */
int tmpl_reason_split(enum tmpl_reason_style style, bool in_reasoning, const char *text, size_t n,
                      char **content, char **reasoning);

#endif
