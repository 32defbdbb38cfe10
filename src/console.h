/*
 * console.h -- the operator's console of `kinbox run` (internal): a page,
 * its script and style sheet (src/console/, compiled in) and the JSON
 * endpoints they call, served under /console on the `[metrics] listen`
 * endpoint (http.c's route). console.c is the HTTP side (paths, security
 * headers, the token, Origin, the audit line); console_data.c builds the
 * answers and runs the actions with the library's operator calls on the
 * console's own database connection (docs/console.md).
 */
#ifndef KINBOX_CONSOLE_H
#define KINBOX_CONSOLE_H

#include <stddef.h>
#include <stdint.h>

#include "kinbox/admin.h"
#include "kinbox/conf.h"
#include "kinbox/module.h"

#include "http.h"

/* One compiled-in file of src/console/ (generated console_assets.c). */
typedef struct kinbox__console_asset {
        const char *name;
        const char *data;
        size_t size;
} kinbox__console_asset_t;
extern const kinbox__console_asset_t kinbox__console_assets[];

/* The handler that replays a consumer's dead letters: the module and the
 * consumer's configuration (both kept by the caller while the console
 * runs), or NULL with err set. Called on a request's thread with the
 * console's lock held. */
typedef const kinbox_module_t *(*kinbox__console_handler_fn)(
    const char *consumer, const kinbox_conf_t **conf, char *err, size_t sz,
    void *opaque);

/* One configured consumer, as the console shows it. */
typedef struct kinbox__console_consumer {
        const char *name, *group, *topics; /* copied */
        int hold_key; /* dead_letter.hold_key */
        int64_t batch_max;
} kinbox__console_consumer_t;

typedef struct kinbox__console_s kinbox__console_t;

/* A console over conf's database (`database.*`, `console.*`, the logger;
 * read now, not kept) for these consumers, the relay enabled or not
 * (relay_source "poll", "wal", "binlog"; NULL: no relay). Reads
 * console.token_file now: NULL with errstr when it is set and cannot be
 * read or holds fewer than 16 characters. Connects lazily. */
kinbox__console_t *kinbox__console_new(
    const kinbox_conf_t *conf, const kinbox__console_consumer_t *consumers,
    size_t n, const char *relay_source, kinbox__console_handler_fn handler,
    void *opaque, char *errstr, size_t errstr_size);

/* The route to give kinbox__http_route() (prefix "/console") with the
 * console as opaque. Thread-safe: requests run one at a time. */
void kinbox__console_serve(const kinbox__http_req_t *req,
                           kinbox__http_ans_t *ans, void *opaque);

/* Free (after the server stopped). NULL is a no-op. */
void kinbox__console_destroy(kinbox__console_t *c);

/* ---- console_data.c: the answers (JSON objects, the caller's) ---- */

/* What console_data.c needs of the console. */
typedef struct kinbox__console_data kinbox__console_data_t;

kinbox__console_data_t *kinbox__console_data_new(
    const kinbox_conf_t *conf, const kinbox__console_consumer_t *consumers,
    size_t n, const char *relay_source, kinbox__console_handler_fn handler,
    void *opaque, char *errstr, size_t errstr_size);
void kinbox__console_data_destroy(kinbox__console_data_t *d);

/* A GET of the API (path after /console/api/, its query arguments through
 * req): 200 with a JSON text, or another code with {"error": ...}. */
unsigned kinbox__console_get(kinbox__console_data_t *d,
                             const kinbox__http_req_t *req, const char *path,
                             char **json);
/* A POST of the API (an action): as kinbox__console_get(); what (a line
 * for the audit log) receives what was done. */
unsigned kinbox__console_post(kinbox__console_data_t *d,
                              const kinbox__http_req_t *req, const char *path,
                              char **json, char *what, size_t what_size);

#endif
