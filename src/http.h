/*
 * http.h -- the health and metrics endpoint of `kinbox run` (internal):
 * /metrics, /healthz and /readyz, served by http.c for the command's
 * services (src/cli/ops.c) and the tests. Not part of the public API: the
 * shared library does not export it; the command and the tests link the
 * library's objects.
 */
#ifndef KINBOX_HTTP_H
#define KINBOX_HTTP_H

#include <stddef.h>

#include "kinbox/conf.h"

/* A server. Opaque. */
typedef struct kinbox__http_s kinbox__http_t;

/* Readiness probe: return 0 when ready, else non-zero with the reason in
 * why. Runs on the server's probe thread, never at the same time as the
 * collect callback; a /readyz request waits for it at most 3 s (then 503,
 * "did not answer within 3 s"), and requests that arrive while it runs
 * share its answer (an answer less than 1 s old is served again). */
typedef int (*kinbox__ready_fn)(char *why, size_t why_size, void *opaque);

/* Called before /metrics is rendered, to refresh sampled gauges. Runs on
 * the probe thread too; /metrics waits for it at most 5 s, then renders
 * the values it has. */
typedef void (*kinbox__collect_fn)(void *opaque);

/* Listen on listen (`HOST:PORT`, `[V6]:PORT`; port 0 picks one, see
 * kinbox__http_port()) and serve /metrics (kinbox__metrics_render()),
 * /healthz (200 while the process runs) and /readyz (200 when ready says
 * so, else 503 with the reason; NULL: always ready). collect may be NULL.
 *
 * conf (may be NULL; read now, not kept) gives the logger: libmicrohttpd's
 * own messages (malformed requests, connection limits reached) become log
 * lines at debug level (facility "http"), at most 10 a minute plus a count
 * of those suppressed; nothing is written to stderr directly. NULL: the
 * default logger at info level (so these messages are not shown).
 *
 * The server is bounded: a thread per connection (so /healthz never waits
 * behind a slow /readyz or /metrics), at most 256 connections, 64 per
 * client address, idle connections closed after 5 s; over a limit a
 * connection is accepted and closed at once. A connection must deliver a
 * whole request head within 10 s of its accept (or its previous answer),
 * however slowly its bytes come, and an address keeps at most 16
 * connections waiting for their request: a 17th shuts the oldest.
 * Returns the server, or NULL with errstr set (bad address, cannot
 * listen). Thread-safe. */
kinbox__http_t *kinbox__http_start(const char *listen,
                                   const kinbox_conf_t *conf,
                                   kinbox__ready_fn ready,
                                   kinbox__collect_fn collect, void *opaque,
                                   char *errstr, size_t errstr_size);

/* The port actually bound; 0 for NULL. */
int kinbox__http_port(const kinbox__http_t *h);

/* Stop serving and free. Requests waiting for a callback are answered at
 * once; a ready or collect callback in progress is waited for (keep them
 * bounded). NULL is a no-op. */
void kinbox__http_stop(kinbox__http_t *h);

/* An extra route (the console, src/console.c): a request whose path starts
 * with its prefix, GET/HEAD or POST (a POST's body, at most 64 KB, read
 * first; over that: 413). Strings valid during the call. */
typedef struct kinbox__http_req {
        const char *method, *url, *body;
        size_t body_len;
        char peer[64]; /* the client's address, text */
        int peer_loopback; /* 127.0.0.0/8 or ::1 */
        void *conn; /* internal */
} kinbox__http_req_t;

/* A request header or query argument (kind 0: header, 1: argument), or
 * NULL. */
const char *kinbox__http_req_get(const kinbox__http_req_t *r, int kind,
                                 const char *name);

/* The route's answer: code, content type (static), body (malloc'ed,
 * taken; NULL: empty) of len bytes, up to 12 extra headers (static
 * strings, name NULL ends). */
typedef struct kinbox__http_ans {
        unsigned code;
        const char *ctype;
        char *body;
        size_t len;
        const char *hdr[12][2];
} kinbox__http_ans_t;

/* Runs on the connection's thread (several at once). */
typedef void (*kinbox__http_route_fn)(const kinbox__http_req_t *req,
                                      kinbox__http_ans_t *ans, void *opaque);

/* Serve paths starting with prefix (kept, static) by fn; one route. Set
 * it right after kinbox__http_start(); requests before get 404. */
void kinbox__http_route(kinbox__http_t *h, const char *prefix,
                        kinbox__http_route_fn fn, void *opaque);

#endif
