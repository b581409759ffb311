/* tools_fuzz — arbitrary model output through every family's tool-call parser (untyped, and typed
 * by a request's tools) and the streaming hold-back: never a crash; calls carry JSON-object
 * arguments, the content is no longer than the text, and the held-back point never passes the
 * text. */
#include "frontend/tools.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The tools of a request whose parameters have types (for the XML-like syntaxes' values). */
static const json_t *typed_tools(void)
{
    static json_t *t;
    if (!t)
        t = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"plan\", "
                       "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
                       "{\"type\": \"string\"}, \"days\": {\"type\": \"integer\"}, \"ok\": "
                       "{\"type\": \"boolean\"}, \"where\": {\"type\": \"object\"}, \"unit\": "
                       "{\"enum\": [\"c\", \"f\"]}}}}}]",
                       0, NULL);
    return t;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    const char *text = (const char *)data;
    for (int k = 0; k < 2 * (TOOLS_HARMONY + 1); k++) {
        const int f = k / 2;
        struct tools_parsed p;
        if (tools_parse((enum tools_family)f, k % 2 ? typed_tools() : NULL, text, size, "fuzz",
                        &p) != 0)
            continue;
        if (p.content_len > size) abort();
        for (size_t i = 0; i < p.n_calls; i++) {
            json_t *a = json_loads(p.calls[i].arguments, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            if (!a || !p.calls[i].id[0]) abort();
            json_decref(a);
        }
        if (p.unclosed && (p.n_calls || p.content_len != size)) abort();
        tools_parsed_free(&p);
        if (tools_content_end((enum tools_family)f, text, size) > size) abort();
    }
    return 0;
}
