/* fe_web — serving the embedded pages (the table is generated: frontend/web/embed.cmake). */
#include "frontend/fe_web.h"

#include "frontend/http.h"

#include <string.h>

const struct fe_web_asset *fe_web_find(const char *path)
{
    for (const struct fe_web_asset *a = fe_web_assets; a->path; a++)
        if (strcmp(a->path, path) == 0) return a;
    return NULL;
}

bool fe_web_http(struct http_req *r)
{
    const struct fe_web_asset *a = fe_web_find(http_path(r));
    if (!a) return false;
    const char *inm = http_header(r, "If-None-Match");
    const char *const headers[] = {
        "ETag",
        a->etag,
        "Cache-Control",
        "no-cache",
        "X-Content-Type-Options",
        "nosniff",
        "Referrer-Policy",
        "no-referrer",
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        NULL};
    if (inm && strcmp(inm, a->etag) == 0)
        http_respond(r, 304, a->type, "", 0, headers);
    else
        http_respond(r, 200, a->type, (const char *)a->data, a->len, headers);
    return true;
}
