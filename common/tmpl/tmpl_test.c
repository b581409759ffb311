/* tmpl_test — the chat-template interpreter against Python Jinja2 3.1: every golden case in
 * ../shared/data/chat-templates, a table of expressions, filters and whitespace rules whose
 * expected strings Jinja2 rendered (with the variables in unit_vars), errors, limits, the named
 * templates, and the reasoning splitter (whole and streamed byte by byte). */
#include "common/base/err.h"
#include "common/tmpl/tmpl.h"
#include "common/tmpl/tmpl_reason.h"
#include "tests/testutil.h"

#include <dirent.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 2024-07-26 12:00 local time, the date the goldens were rendered with */
static time_t golden_now(void)
{
    struct tm tm = {.tm_year = 124, .tm_mon = 6, .tm_mday = 26, .tm_hour = 12, .tm_isdst = -1};
    return mktime(&tm);
}

/* render compiles src and renders it with vars (JSON text); returns the code, output in *out. */
static int render(const char *src, const char *vars, const struct tmpl_limits *lim, char **out)
{
    struct tmpl *t = NULL;
    json_t *v = json_loads(vars ? vars : "{}", 0, NULL);
    size_t len;
    int rv;
    ck_assert_ptr_nonnull(v);
    *out = NULL;
    if ((rv = tmpl_compile(src, strlen(src), lim, &t)) == 0) {
        tmpl_set_now(t, golden_now());
        rv = tmpl_render_json(t, v, out, &len);
        if (!rv) ck_assert_uint_eq(len, strlen(*out));
    }
    tmpl_fini(t);
    json_decref(v);
    return rv;
}

static const char *unit_vars =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi  there\"}, "
    "{\"role\": \"assistant\", \"content\": \"Yo\"}], \"xs\": [1, 2, 3], "
    "\"d\": {\"a\": 1, \"b\": 2}, \"s\": \"hello\"}";

static const struct {
    const char *src, *want;
} units[] = {
    {"{{ 1.0 }} {{ 1e20 }} {{ 1e16 }} {{ 0.0001 }} {{ 1/3 }} {{ 10/2 }} {{ 7//2 }} {{ -7//2 }} {{ "
     "-7 % 3 }} {{ 2**10 }} {{ 2**-1 }} {{ 1e-5 }} {{ -0.0 }} {{ 0.1 + 0.2 }}",
     "1.0 1e+20 1e+16 0.0001 0.3333333333333333 5.0 3 -4 2 1024 0.5 1e-05 -0.0 "
     "0.30000000000000004"},
    {"{{ xs }} {{ d }} {{ none }} {{ true }} {{ (1,2) }} {{ (1,) }} {{ \"it's\" }} {{ [\"it's\", "
     "'a\"b', \"x\\\ny\"] }}",
     "[1, 2, 3] {'a': 1, 'b': 2} None True (1, 2) (1,) it's [\"it's\", 'a\"b', 'xy']"},
    {"{% for x in foo %}a{% endfor %}{{ \"x\" in foo }}{{ foo }}{{ foo is defined }}{{ none.x }}",
     "FalseFalse"},
    {"{% if false %}{{ x|nofilt }}{% endif %}ok", "ok"},
    {"{% set x = 1 %}{% for i in xs %}{{ x }}{% set x = 2 %}{% endfor %}{{ x }}", "1111"},
    {"{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}|{{ m(1, b=3) }}|{{ m(b=5, a=4) "
     "}}",
     "12|13|45"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}",
     "321"},
    {"{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}", "2"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set x %} hi {{ 1 }}{% endset %}[{{ x }}]", "12[ hi 1]"},
    {"{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}", "2"},
    {"{{ \"a,b,c\".split(\",\", 1) }}{{ \"  x \".strip() }}{{ \"xxaxx\".strip(\"x\") }}{{ \"a "
     "b\".split() }}{{ \"a,b\".rsplit(\",\",1) }}{{ \" a b \".split(None, 1) }}",
     "['a', 'b,c']xa['a', 'b']['a', 'b']['a', 'b ']"},
    {"{{ d.get(\"a\") }}{{ d.get(\"z\") }}{{ d.get(\"z\", 5) }}{{ d.keys()|list }}{{ d[\"a\"] }}{{ "
     "d.values()|list }}",
     "1None5['a', 'b']1[1, 2]"},
    {"{{ xs|join(\", \") }}{{ xs|map(\"string\")|join }}{{ "
     "[{\"a\":1},{\"a\":2}]|map(attribute=\"a\")|list }}",
     "1, 2, 3123[1, 2]"},
    {"{{ [1,2,1]|unique|list }}{{ d|dictsort }}{{ d|items|list }}{{ \"x\"|default(\"y\") }}{{ "
     "\"\"|default(\"y\") }}{{ \"\"|default(\"y\", true) }}{{ u|d(\"z\") }}",
     "[1, 2][('a', 1), ('b', 2)][('a', 1), ('b', 2)]xyz"},
    {"{{ \"<a>\"|e }}{{ \"<a>\"|safe }}{{ \"a\nb\"|indent(2) }}|{{ \"a\nb\"|indent(2, true) }}|{{ "
     "\"a\n\nb\n\"|indent }}|{{ \"a\n\nb\"|indent(2, blank=true) }}",
     "&lt;a&gt;<a>a\n  b|  a\n  b|a\n\n    b\n|a\n  \n  b"},
    {"{{ 1 == 1.0 }}{{ \"1\" == 1 }}{{ [1] == [1] }}{{ true == 1 }}{{ none is none }}{{ 5 is "
     "divisibleby 5 }}{{ 3 is odd }}{{ 2 in xs }}{{ \"a\" is in \"abc\" }}{{ xs is sequence }}{{ d "
     "is mapping }}{{ s is iterable }}{{ 1 is number }}{{ true is boolean }}{{ 2 is even }}{{ 1 is "
     "eq 1 }}{{ 1 is ne 1 }}{{ u is undefined }}{{ true is true }}{{ false is false }}",
     "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrue"},
    {"{% for a in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.previtem }}{{ loop.nextitem }}{{ "
     "loop.cycle(\"a\",\"b\") }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ "
     "loop.last }}{{ loop.length }},{% endfor %}",
     "102a32TrueFalse3,2113b21FalseFalse3,322a10FalseTrue3,"},
    {"{% for a in xs if a > 1 %}{{ loop.index }}/{{ loop.length }}{% else %}E{% endfor %}{% for a "
     "in [] %}x{% else %}E{% endfor %}",
     "1/22/2E"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% "
     "for c in \"héj\" %}[{{ c }}]{% endfor %}",
     "a=1;b=2;ab[h][é][j]"},
    {"{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% "
     "endif %}{{ i }}{% endfor %}",
     "02"},
    {"{{ \"%s-%d\" % (\"a\", 3) }}{{ \"%s\" % xs }}{{ \"%05.2f|%x|%-4s|\" % (3.14159, 255, \"ab\") "
     "}}{{ \"{}-{x}\".format(1, x=2) }}",
     "a-3[1, 2, 3]03.14|ff|ab  |1-2"},
    {"{{ xs|tojson }}{{ {\"a\":[1,{\"b\":none}], \"é\":1.5, \"c\": "
     "\"x\\ty\\u0001\"}|tojson(indent=2) }}{{ []|tojson(indent=2) }}{{ \"é<>&'\"|tojson }}{{ "
     "{\"k\": true, \"f\": 1.0}|tojson }}",
     "[1, 2, 3]{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"é\": 1.5,\n  "
     "\"c\": \"x\\ty\\u0001\"\n}[]\"é<>&'\"{\"k\": true, \"f\": 1.0}"},
    {"{{ s|center(11) }}|{{ \"a b  c\"|wordcount }}|{{ \"hello world-foo (bar\"|title }}|{{ "
     "\"hELLo\"|capitalize }}|{{ \"they're 1st\"|title }}|{{ \"they're 1st\".title() }}",
     "   hello   |3|Hello World-Foo (Bar|Hello|They're 1st|They'Re 1St"},
    {"{{ xs|sum }}{{ xs|min }}{{ xs|max }}{{ [3,1,2]|sort }}{{ xs|reverse|list }}{{ "
     "xs|batch(2)|list }}{{ [\"b\",\"A\",\"a\"]|sort }}{{ [3,1,2]|sort(reverse=true) }}",
     "613[1, 2, 3][3, 2, 1][[1, 2], [3]]['A', 'a', 'b'][3, 2, 1]"},
    {"{{ 3.7|round }} {{ 3.14159|round(2) }} {{ 2.5|round }} {{ -3|abs }} {{ \"12\"|int }} {{ "
     "\"1.5\"|float }} {{ \"x\"|int }} {{ 3|float }} {{ 3|round }} {{ 2.675|round(2) }} {{ "
     "\"1.9\"|int }}",
     "4.0 3.14 2.0 3 12 1.5 0 3.0 3 2.67 1"},
    {"{{ s[1:3] }}{{ s[::-1] }}{{ s[-2:] }}{{ xs[::2] }}{{ xs[-1] }}{{ xs[10] }}|{{ s[1] }}{{ "
     "xs[1:] }}{{ s[:-1] }}{{ xs[::-2] }}{{ \"héllo\"[1:3] }}",
     "elollehlo[1, 3]3|e[2, 3]hell[3, 1]él"},
    {"{{ messages|selectattr(\"role\", \"equalto\", \"user\")|list }}{{ "
     "messages|rejectattr(\"role\", \"eq\", \"user\")|map(attribute=\"content\")|list }}{{ "
     "[0,1,2]|select|list }}{{ [0,1,2]|reject(\"odd\")|list }}",
     "[{'role': 'user', 'content': 'Hi  there'}]['Yo'][1, 2][0, 2]"},
    {"{{ \"a\" ~ 1 ~ none ~ u }}{{ 1 + 2 * 3 - 4 / 2 }}{{ not 1 }}{{ 1 if 0 else 2 }}{{ 1 if 0 "
     "}}{{ -2**2 }}{{ 2 < 3 < 4 }}{{ 3 > 2 > 2 }}{{ 1 and 0 }}{{ 0 or \"x\" }}",
     "a1None5.0False24TrueFalse0x"},
    {"{{ 'a\\d\n\\x41\\u00e9' }}{{ \"\\\"q\\\"\" }}{{ 'x' 'y' }}{{ True }}{{ None }}{{ [1, 2,] "
     "}}{{ {'a': 1,} }}",
     "a\\d\nAé\"q\"xyTrueNone[1, 2]{'a': 1}"},
    {"{%- if true -%}  A  {%- endif -%}  B", "AB"},
    {"  {% if true %}\n    x\n  {% endif %}\n", "    x\n"},
    {"{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\n", "  user\n  assistant\n"},
    {"{# c #}\n  {# c2 #}\nq\n", "q"},
    {"{%+ if true %}a{% endif +%}\nb", "a\nb"},
    {"{{ \"x\" }}\n{{ \"y\" }}\n", "x\ny"},
    {"a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c", "abc"},
    {"\\t {% if true %}x{% endif %} \n{% if true %}\n y{% endif %}", "\\t x \n y"},
    {"{{ \"a\" }}   {%- set x = 1 %}   b{% raw %}{{ x }}{% endraw %}", "a   b{{ x }}"},
    {"{% filter upper %}up {{ s }}{% endfilter %}", "UP HELLO"},
    {"{{ messages[0].content.upper() }}{{ \"Ab\".lower() }}{{ \"ab\".startswith(\"a\") }}{{ "
     "\"ab\".endswith((\"x\",\"b\")) }}{{ \"abcabc\".find(\"c\") }}{{ \"abcabc\".count(\"bc\") "
     "}}{{ \"abc\".replace(\"b\", \"X\") }}{{ \"aaa\".replace(\"a\",\"b\",2) }}{{ \", "
     "\".join([\"a\", \"b\"]) }}",
     "HI  THEREabTrueTrue22aXcbbaa, b"},
    {"{{ xs|first }}{{ xs|last }}{{ s|first }}{{ s|length }}{{ d|length }}{{ \"héé\"|length }}{{ "
     "[]|first }}|{{ xs|count }}",
     "13h523|3"},
    {"{{ \"  a  \"|trim }}|{{ \"xxaxx\"|trim(\"x\") }}|{{ \"\\u3000a\\u00a0\"|trim }}|{{ \"ñandú "
     "ÉCOLE\".upper() }}{{ \"ΑΒΓ Привет\".lower() }}",
     "a|a|a|ÑANDÚ ÉCOLEαβγ привет"},
    {"{{ range(3)|list }}{{ range(1,7,2)|list }}{{ range(5,0,-2)|list }}{{ strftime_now(\"%d %b "
     "%Y\") }}",
     "[0, 1, 2][1, 3, 5][5, 3, 1]26 Jul 2024"},
    {"{% set y = xs + [4] %}{{ y }}{{ xs * 2 }}{{ \"ab\" * 3 }}{{ \"%d%%\" % 5 }}{{ \"%(a)s\" % d "
     "}}{{ dict(a=1) }}",
     "[1, 2, 3, 4][1, 2, 3, 1, 2, 3]ababab5%1{'a': 1}"},
};

START_TEST(matches_jinja2)
{
    char *out;
    int rv = render(units[_i].src, unit_vars, NULL, &out);
    ck_assert_msg(rv == 0, "case %d: %s: %s", _i, units[_i].src, strata_errdetail());
    ck_assert_msg(strcmp(out, units[_i].want) == 0, "case %d: %s\n got: [%s]\nwant: [%s]", _i,
                  units[_i].src, out, units[_i].want);
    free(out);
}
END_TEST

START_TEST(generation_tag_renders_body)
{
    char *out;
    ck_assert_int_eq(render("a{% generation %}{{ 1 + 1 }}{%- endgeneration %}b", NULL, NULL, &out),
                     0);
    ck_assert_str_eq(out, "a2b");
    free(out);
}
END_TEST

/* expect_err renders src and checks the code and that the detail contains want. */
static void expect_err(const char *src, int code, const char *want)
{
    char *out;
    int rv = render(src, unit_vars, NULL, &out);
    ck_assert_msg(rv == code, "%s: got %d (%s), want %d", src, rv, strata_errdetail(), code);
    ck_assert_msg(strstr(strata_errdetail(), want), "%s: detail [%s] lacks [%s]", src,
                  strata_errdetail(), want);
    ck_assert_ptr_null(out);
}

START_TEST(errors_name_the_line)
{
    expect_err("a\n\n{{ raise_exception('no system role') }}", STRATA_EINVAL,
               "line 3: raise_exception: no system role");
    expect_err("{{ foo.bar }}", STRATA_EINVAL, "'foo' is undefined");
    expect_err("{{ foo() }}", STRATA_EINVAL, "'foo' is undefined");
    expect_err("{{ d.zz.y }}", STRATA_EINVAL, "'zz' is undefined");
    expect_err("{{ 'a' + 1 }}", STRATA_EINVAL, "unsupported operand");
    expect_err("{{ 1 < 'a' }}", STRATA_EINVAL, "cannot order int and str");
    expect_err("{{ s.nomethod() }}", STRATA_EINVAL, "has no attribute 'nomethod'");
    expect_err("{% set d.a = 1 %}", STRATA_EINVAL, "non-namespace");
    expect_err("{{ u|tojson }}", STRATA_EINVAL, "not JSON serializable");
    /* Jinja2: an unknown filter is a compile error, but inside an if only when it runs */
    expect_err("\n{{ x|nofilter }}", STRATA_EFORMAT, "line 2: no filter named 'nofilter'");
    expect_err("{% if true %}{{ x|nofilter }}{% endif %}", STRATA_EINVAL, "no filter named");
    expect_err("{{ x is nosuchtest }}", STRATA_EFORMAT, "no test named 'nosuchtest'");
    expect_err("{% include 'other.jinja' %}", STRATA_EUNSUPPORTED, "cannot load other templates");
    expect_err("{% import 'm' as m %}", STRATA_EUNSUPPORTED, "'import' is not allowed");
    expect_err("{% extends 'base' %}", STRATA_EUNSUPPORTED, "'extends' is not allowed");
    expect_err("{% for x in xs %}\n{% if x %}", STRATA_EFORMAT, "needs 'endif'");
    expect_err("{% break %}", STRATA_EFORMAT, "outside a for-loop");
    expect_err("{{ 1 +\n }}", STRATA_EFORMAT, "line 2: expected an expression");
    expect_err("{{ 'abc }}", STRATA_EFORMAT, "unterminated string");
    expect_err("{% frobnicate %}", STRATA_EFORMAT, "unknown or unsupported tag 'frobnicate'");
    expect_err("{{ 9999999999 * 9999999999 }}", STRATA_EOVERFLOW, "overflows 64 bits");

    char *out;
    ck_assert_int_eq(render("{% if false %}{{ x|nofilter }}{% endif %}ok", NULL, NULL, &out), 0);
    ck_assert_str_eq(out, "ok");
    free(out);
}
END_TEST

START_TEST(limits_stop_runaway_templates)
{
    struct tmpl_limits lim;
    tmpl_limits_default(&lim);
    lim.max_steps = 10000;
    lim.max_output = 1000;
    lim.max_memory = 1u << 20;
    lim.max_parse_depth = 50;
    char *out;
    ck_assert_int_eq(render("{% for i in range(200) %}{% for j in range(200) %}{% endfor %}"
                            "{% endfor %}",
                            NULL, &lim, &out),
                     STRATA_ELIMIT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "max_steps"));
    ck_assert_int_eq(
        render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &lim, &out),
        STRATA_ELIMIT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "max_call_depth"));
    ck_assert_int_eq(render("{% for i in range(500) %}xxxxx{% endfor %}", NULL, &lim, &out),
                     STRATA_ELIMIT);
    ck_assert_int_eq(render("{{ 'x' * 100000000 }}", NULL, &lim, &out), STRATA_ELIMIT);
    ck_assert_int_eq(render("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                            "{% set ns.s = ns.s + ns.s %}{% endfor %}",
                            NULL, &lim, &out),
                     STRATA_ELIMIT);
    ck_assert_int_eq(render("{{ range(100000000)|length }}", NULL, &lim, &out), STRATA_ELIMIT);
    char deep[400];
    memset(deep, 0, sizeof deep);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 120; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 120; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    ck_assert_int_eq(render(deep, NULL, &lim, &out), STRATA_ELIMIT);
    /* within the limits the same shapes work */
    ck_assert_int_eq(
        render("{% for i in range(100) %}{% endfor %}{{ 'x' * 10 }}", NULL, &lim, &out), 0);
    ck_assert_str_eq(out, "xxxxxxxxxx");
    free(out);
    /* a list that contains itself prints and serialises into an error, not a crash */
    ck_assert_int_ne(render("{% set l = [] %}{{ l.append(l) }}{{ l|tojson }}", NULL, &lim, &out),
                     0);
}
END_TEST

static const char *conv = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                          "{\"role\": \"user\", \"content\": \" Hi \"}, {\"role\": \"assistant\", "
                          "\"content\": \"Hello\"}, {\"role\": \"user\", \"content\": \"Bye\"}], "
                          "\"add_generation_prompt\": true}";

START_TEST(named_templates_render_as_llama_cpp)
{
    static const struct {
        const char *name, *want;
    } want[] = {
        {"chatml", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n"
                   "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                   "<|im_start|>assistant\n"},
        {"llama3", "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n"},
        {"mistral", "[INST]Be brief.\n\n Hi [/INST]Hello</s>[INST]Bye[/INST]"},
        {"mistral-v7", "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST]  Hi [/INST] Hello</s>"
                       "[INST] Bye[/INST]"},
        {"gemma", "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
                  "Hello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
                  "<start_of_turn>model\n"},
        {"phi3",
         "<|system|>\nBe brief.<|end|>\n<|user|>\n Hi <|end|>\n<|assistant|>\nHello<|end|>\n"
         "<|user|>\nBye<|end|>\n<|assistant|>\n"},
        {"deepseek3", "Be brief.\n\n<｜User｜> Hi <｜Assistant｜>Hello<｜end▁of▁sentence｜>"
                      "<｜User｜>Bye<｜Assistant｜>"},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        const char *src;
        char *out;
        ck_assert_int_eq(tmpl_named(want[i].name, &src), 0);
        ck_assert_msg(render(src, conv, NULL, &out) == 0, "%s: %s", want[i].name,
                      strata_errdetail());
        ck_assert_msg(!strcmp(out, want[i].want), "%s:\n got [%s]\nwant [%s]", want[i].name, out,
                      want[i].want);
        free(out);
    }
    const char *src;
    ck_assert_int_eq(tmpl_named("nope", &src), STRATA_ENOENT);
}
END_TEST

START_TEST(load_takes_a_name_or_a_file)
{
    struct tmpl *t;
    char path[4096];
    ck_assert_int_eq(tmpl_load("chatml", NULL, &t), 0);
    tmpl_fini(t);
    snprintf(path, sizeof path, "%s/t.jinja", test_tmpdir());
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{{ bos_token }}x\n", f);
    fclose(f);
    ck_assert_int_eq(tmpl_load(path, NULL, &t), 0);
    json_t *v = json_pack("{s:s}", "bos_token", "<s>");
    char *out;
    size_t len;
    ck_assert_int_eq(tmpl_render_json(t, v, &out, &len), 0);
    ck_assert_str_eq(out, "<s>x"); /* the one trailing newline is dropped, as Jinja2 does */
    free(out);
    json_decref(v);
    tmpl_fini(t);
    snprintf(path, sizeof path, "%s/missing.jinja", test_tmpdir());
    ck_assert_int_eq(tmpl_load(path, NULL, &t), STRATA_ENOENT);
    ck_assert_ptr_nonnull(strstr(strata_errdetail(), "chatml"));
}
END_TEST

/* run_case renders one golden case; returns true when it matches. */
static bool run_case(const struct tmpl *t, const json_t *c, const char *file)
{
    json_t *vars = json_object();
    static const char *const keys[] = {"messages", "add_generation_prompt", "bos_token",
                                       "eos_token"};
    for (size_t i = 0; i < 4; i++)
        json_object_set(vars, keys[i], json_object_get(c, keys[i]));
    json_object_update(vars, json_object_get(c, "extra"));
    char *out = NULL;
    size_t len;
    int rv = tmpl_render_json(t, vars, &out, &len);
    json_decref(vars);
    const char *name = json_string_value(json_object_get(c, "name"));
    bool ok;
    if (json_is_true(json_object_get(c, "expected_error"))) {
        ok = rv != 0;
    } else {
        const char *want = json_string_value(json_object_get(c, "expected"));
        ok = rv == 0 && want && strcmp(out, want) == 0;
        if (!ok)
            fprintf(stderr, "FAIL %s %s: %s\n got: [%s]\nwant: [%s]\n", file, name,
                    rv ? strata_errdetail() : "", out ? out : "", want ? want : "");
    }
    free(out);
    return ok;
}

START_TEST(golden_cases_match_jinja2)
{
    const char *dir = test_data_path("chat-templates");
    if (!dir) return;
    char base[4096];
    snprintf(base, sizeof base, "%s", dir);
    DIR *d = opendir(base);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    int pass = 0, total = 0, files = 0;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 7 || strcmp(e->d_name + n - 6, ".jinja") != 0) continue;
        char path[8192], cases[8192];
        snprintf(path, sizeof path, "%s/%s", base, e->d_name);
        snprintf(cases, sizeof cases, "%s/%.*s.cases.json", base, (int)(n - 6), e->d_name);
        size_t len;
        char *src = test_read_file(path, &len);
        json_t *list = json_load_file(cases, 0, NULL);
        ck_assert_ptr_nonnull(src);
        ck_assert_msg(json_is_array(list), "%s", cases);
        struct tmpl *t;
        ck_assert_msg(tmpl_compile(src, len, NULL, &t) == 0, "%s: %s", e->d_name,
                      strata_errdetail());
        tmpl_set_now(t, golden_now());
        for (size_t i = 0; i < json_array_size(list); i++, total++)
            pass += run_case(t, json_array_get(list, i), e->d_name);
        files++;
        tmpl_fini(t);
        json_decref(list);
        free(src);
    }
    closedir(d);
    printf("tmpl: %d/%d golden cases match Jinja2 (%d templates)\n", pass, total, files);
    ck_assert_int_gt(total, 0);
    ck_assert_int_eq(pass, total);
}
END_TEST

/* split_both splits whole and streamed one byte at a time and checks both give the same. */
static void split_both(enum tmpl_reason_style st, bool open, const char *text, const char *content,
                       const char *reasoning)
{
    char *c, *r;
    ck_assert_int_eq(tmpl_reason_split(st, open, text, strlen(text), &c, &r), 0);
    ck_assert_msg(!strcmp(c, content), "content [%s], want [%s]", c, content);
    ck_assert_msg(!strcmp(r, reasoning), "reasoning [%s], want [%s]", r, reasoning);
    free(c);
    free(r);
    struct tmpl_reason_stream s;
    struct tmpl_reason_out o = {0};
    tmpl_reason_init(&s, st, open);
    for (size_t i = 0; text[i]; i++)
        ck_assert_int_eq(tmpl_reason_feed(&s, text + i, 1, &o), 0);
    ck_assert_int_eq(tmpl_reason_finish(&s, &o), 0);
    ck_assert_msg(!strcmp(o.content, content), "streamed content [%s], want [%s]", o.content,
                  content);
    ck_assert_msg(!strncmp(o.reasoning, reasoning, strlen(reasoning)), "streamed reasoning [%s]",
                  o.reasoning);
    tmpl_reason_out_free(&o);
}

START_TEST(reasoning_is_split_out)
{
    split_both(TMPL_REASON_THINK, false, "<think>\nLet me see.\n</think>\n\nParis.", "Paris.",
               "Let me see.");
    split_both(TMPL_REASON_THINK, true, "Let me see.</think>Paris.", "Paris.", "Let me see.");
    split_both(TMPL_REASON_THINK, false, "Just an answer with </thin in it",
               "Just an answer "
               "with </thin in it",
               "");
    split_both(TMPL_REASON_THINK, false, "  <thinker>", "  <thinker>", "");
    split_both(TMPL_REASON_THINK, true, "still thinking <", "", "still thinking <");
    split_both(TMPL_REASON_NONE, false, "<think>x</think>y", "<think>x</think>y", "");
    split_both(TMPL_REASON_CHANNEL, false,
               "<|channel|>analysis<|message|>User asks. Easy.<|end|><|start|>assistant"
               "<|channel|>final<|message|>Paris.<|return|>",
               "Paris.", "User asks. Easy.");
    split_both(TMPL_REASON_CHANNEL, true,
               "Think.<|end|><|start|>assistant<|channel|>final"
               "<|message|>Done",
               "Done", "Think.");
    split_both(TMPL_REASON_CHANNEL, false, "plain text", "plain text", "");

    ck_assert_int_eq(tmpl_reason_style_of("{{ '<think>' }}", 14), TMPL_REASON_THINK);
    ck_assert_int_eq(tmpl_reason_style_of("<|channel|>final", 16), TMPL_REASON_CHANNEL);
    ck_assert_int_eq(tmpl_reason_style_of("<|im_start|>", 12), TMPL_REASON_NONE);
    ck_assert(tmpl_reason_prompt_opens(TMPL_REASON_THINK, "<|im_start|>assistant\n<think>\n", 30));
    ck_assert(!tmpl_reason_prompt_opens(TMPL_REASON_THINK, "a<think>\n\n</think>\n\n", 20));
}
END_TEST

/* GLM-4.5 / GLM-4.7-Flash: the think-tag style; its generation prompt ends in "<think>" (the
 * text starts as reasoning and ends it with "</think>"), or with enable_thinking false in
 * "</think>" (the text is all answer). The template from the bundled data, each case's prompt. */
START_TEST(glm_reasoning_is_split_out)
{
    const char *dir = test_data_path("chat-templates");
    if (!dir) return;
    char path[8192], cases[8192];
    snprintf(path, sizeof path, "%s/GLM-4.7-Flash.jinja", dir);
    snprintf(cases, sizeof cases, "%s/GLM-4.7-Flash.cases.json", dir);
    size_t len;
    char *src = test_read_file(path, &len);
    json_t *list = json_load_file(cases, 0, NULL);
    ck_assert_ptr_nonnull(src);
    ck_assert_ptr_nonnull(list);
    ck_assert_int_eq(tmpl_reason_style_of(src, len), TMPL_REASON_THINK);
    int opened = 0, closed = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *c = json_array_get(list, i);
        if (!json_is_true(json_object_get(c, "add_generation_prompt"))) continue;
        const char *want = json_string_value(json_object_get(c, "expected"));
        const bool opens = tmpl_reason_prompt_opens(TMPL_REASON_THINK, want, strlen(want));
        opened += opens;
        closed += !opens;
        if (opens)
            split_both(TMPL_REASON_THINK, true, "The capital is Paris.</think>Paris.", "Paris.",
                       "The capital is Paris.");
        else
            split_both(TMPL_REASON_THINK, false, "Paris.", "Paris.", "");
    }
    ck_assert_int_gt(opened, 0); /* thinking on (the default) */
    ck_assert_int_gt(closed, 0); /* enable_thinking false */
    json_decref(list);
    free(src);
}
END_TEST

/* sh runs a shell command line; returns its exit status. */
static int sh(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(command_renders_stdin_case)
{
    const char *build = getenv("STRATA_BUILD_DIR"), *dir = test_tmpdir();
    if (!build) {
        printf("SKIP command_renders_stdin_case: STRATA_BUILD_DIR is unset (run under ctest)\n");
        return;
    }
    char cmd[8192], path[4096];
    snprintf(path, sizeof path, "%s/case.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"name\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
          "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"extra\": {\"d\": 1}}",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s/strata template chatml < %s > %s/out.txt", build, path, dir);
    ck_assert_int_eq(sh(cmd), 0);
    snprintf(path, sizeof path, "%s/out.txt", dir);
    size_t len;
    char *out = test_read_file(path, &len);
    ck_assert_str_eq(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);

    snprintf(path, sizeof path, "%s/bad.jinja", dir);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{{ bos_token }}\n{{ strftime_now('%Y-%m-%d') }}{{ d + 'x' }}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s/strata template %s --date 2025-01-02 < %s/case.json > %s/o.txt "
             "2> %s/err.txt",
             build, path, dir, dir, dir);
    ck_assert_int_eq(sh(cmd), 1);
    snprintf(path, sizeof path, "%s/err.txt", dir);
    out = test_read_file(path, &len);
    ck_assert_msg(strstr(out, "line 2: unsupported operand") && strstr(out, "2 | {{ strftime"),
                  "stderr: %s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tmpl");
    TCase *tc = tcase_create("jinja");
    tcase_add_loop_test(tc, matches_jinja2, 0, (int)(sizeof units / sizeof *units));
    tcase_add_test(tc, generation_tag_renders_body);
    tcase_add_test(tc, errors_name_the_line);
    tcase_add_test(tc, limits_stop_runaway_templates);
    tcase_add_test(tc, named_templates_render_as_llama_cpp);
    tcase_add_test(tc, load_takes_a_name_or_a_file);
    tcase_add_test(tc, reasoning_is_split_out);
    tcase_add_test(tc, glm_reasoning_is_split_out);
    tcase_add_test(tc, command_renders_stdin_case);
    suite_add_tcase(s, tc);
    TCase *gold = tcase_create("golden");
    tcase_set_timeout(gold, 30);
    tcase_add_test(gold, golden_cases_match_jinja2);
    suite_add_tcase(s, gold);
    return test_run(s);
}
