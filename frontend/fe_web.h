/* fe_web — the web pages the frontend serves: `/` (chat) and `/monitor`, with their scripts and
 * style under /web/. Every file is compiled into the binary (frontend/web/embed.cmake turns the
 * files of frontend/web/ into a C table at build time): nothing is read from disk or fetched from
 * the network at run time. The pages need no API key to load; they ask for it and send it with
 * their calls. Answers carry a strict Content-Security-Policy (scripts and styles from this origin
 * only, no inline script), so even a rendering bug cannot run model output as code. Read-only
 * tables: any thread.
 */
#ifndef STRATA_FE_WEB_H
#define STRATA_FE_WEB_H

#include <stdbool.h>
#include <stddef.h>

struct http_req;

struct fe_web_asset {
    const char *path; /* "/", "/monitor", "/web/chat.js", ... */
    const char *type; /* Content-Type */
    const char *etag; /* "\"<sha1 of the file>\"" */
    const unsigned char *data;
    size_t len;
};

/* fe_web_assets: the table, ended by a zeroed entry; fe_web_total_bytes: their sizes added. */
extern const struct fe_web_asset fe_web_assets[];
extern const size_t fe_web_total_bytes;

/* fe_web_find returns the asset served at path, or NULL. */
const struct fe_web_asset *fe_web_find(const char *path);

/* fe_web_http answers a GET of an asset (200, or 304 for a matching If-None-Match) and returns
 * true; false, without answering, when path is no asset. */
bool fe_web_http(struct http_req *r);

#endif
