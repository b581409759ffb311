/* tmpl_fuzz — compiles and renders arbitrary template text with a fixed small conversation under
 * tight limits: must never crash, hang or leak, whatever the text. */
#include "common/tmpl/tmpl.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char vars_json[] =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
        "\"content\": \"Hi <think> {{ x }}\"}, {\"role\": \"assistant\", \"content\": \"Yo\", "
        "\"reasoning_content\": \"hm\"}], \"add_generation_prompt\": true, \"bos_token\": \"<s>\", "
        "\"eos_token\": \"</s>\", \"enable_thinking\": false, \"n\": 3, \"f\": 1.5, \"z\": null}";
    struct tmpl_limits lim;
    tmpl_limits_default(&lim);
    lim.max_source = 1 << 16;
    lim.max_parse_depth = 64;
    lim.max_steps = 20000;
    lim.max_call_depth = 16;
    lim.max_output = 1 << 16;
    lim.max_memory = 8u << 20;
    struct tmpl *t;
    if (tmpl_compile((const char *)data, size, &lim, &t) != 0) return 0;
    tmpl_set_now(t, 1721995200);
    json_t *vars = json_loads(vars_json, 0, NULL);
    char *out = NULL;
    size_t len;
    if (vars && tmpl_render_json(t, vars, &out, &len) == 0) free(out);
    json_decref(vars);
    tmpl_fini(t);
    return 0;
}
