/*
 * console.c -- the operator's console, HTTP side: the page and its static
 * files, the JSON endpoints' dispatch, and the rules that keep a browser
 * console safe (docs/console.md, Security):
 *
 *  - every answer carries a Content-Security-Policy without inline script
 *    or style (the script is /console/app.js), nosniff, no framing, no
 *    caching, no referrer;
 *  - loopback clients only unless console.allow_remote, and then only a
 *    Host header naming an address or localhost (no DNS rebinding);
 *  - reads need nothing; an action is a POST with `Authorization: Bearer
 *    TOKEN` (console.token_file, compared in constant time) and, when the
 *    browser sends one, an Origin equal to the server's own; refused
 *    otherwise (401 / 403), and logged;
 *  - each action leaves an audit line (who, what, when, result) in the
 *    log at notice level.
 *
 * Requests run one at a time (the console's lock): the console has one
 * database connection, its own.
 */
#include "console.h"
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TOKEN_MIN 16
#define TOKEN_MAX 512

struct kinbox__console_s {
        pthread_mutex_t mu;
        kinbox__console_data_t *data;
        kinbox__log_t lg;
        char token[TOKEN_MAX + 1]; /* "" : read-only */
        bool allow_remote;
};

static const char *const csp =
    "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'";

/* console.token_file's first line into c->token; -1 with errstr. */
static int
read_token(kinbox__console_t *c, const char *path, char *errstr, size_t sz)
{
        FILE *f = fopen(path, "r");
        if (!f) {
                kinbox__errstr(errstr, sz, "console.token_file %s: %s", path,
                               strerror(errno));
                return -1;
        }
        char line[TOKEN_MAX + 2] = "";
        if (!fgets(line, sizeof(line), f))
                line[0] = '\0';
        fclose(f);
        line[strcspn(line, "\r\n")] = '\0';
        size_t n = strlen(line);
        while (n && isspace((unsigned char)line[n - 1]))
                line[--n] = '\0';
        if (n < TOKEN_MIN || n > TOKEN_MAX) {
                kinbox__errstr(errstr, sz,
                               "console.token_file %s: the first line must "
                               "hold a token of %d to %d characters",
                               path, TOKEN_MIN, TOKEN_MAX);
                return -1;
        }
        memcpy(c->token, line, n + 1);
        return 0;
}

kinbox__console_t *
kinbox__console_new(const kinbox_conf_t *conf,
                    const kinbox__console_consumer_t *consumers, size_t n,
                    const char *relay_source,
                    kinbox__console_handler_fn handler, void *opaque,
                    char *errstr, size_t errstr_size)
{
        kinbox__console_t *c = kinbox__calloc(1, sizeof(*c));
        if (!c) {
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return NULL;
        }
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        c->allow_remote = s->console_allow_remote;
        kinbox__conf_logger(conf, &c->lg);
        if (s->console_token_file &&
            read_token(c, s->console_token_file, errstr, errstr_size)) {
                free(c);
                return NULL;
        }
        c->data =
            kinbox__console_data_new(conf, consumers, n, relay_source, handler,
                                     opaque, errstr, errstr_size);
        if (!c->data) {
                free(c);
                return NULL;
        }
        pthread_mutex_init(&c->mu, NULL);
        return c;
}

void
kinbox__console_destroy(kinbox__console_t *c)
{
        if (!c)
                return;
        kinbox__console_data_destroy(c->data);
        pthread_mutex_destroy(&c->mu);
        /* The token leaves no copy in freed memory. */
        volatile char *t = c->token;
        for (size_t i = 0; i < sizeof(c->token); i++)
                t[i] = 0;
        free(c);
}

/* Equal in time independent of where they differ (the lengths aside). */
static bool
token_equal(const char *want, const char *got)
{
        size_t wl = strlen(want), gl = strlen(got);
        unsigned char d = wl != gl;
        for (size_t i = 0; i < wl; i++)
                d |= (unsigned char)want[i] ^ (unsigned char)got[i % (gl + 1)];
        return !d;
}

static void
security_headers(kinbox__http_ans_t *a)
{
        static const char *const h[][2] = {
            {"Content-Security-Policy", NULL},
            {"X-Content-Type-Options", "nosniff"},
            {"X-Frame-Options", "DENY"},
            {"Referrer-Policy", "no-referrer"},
            {"Cache-Control", "no-store"},
            {"Cross-Origin-Opener-Policy", "same-origin"},
            {"Cross-Origin-Resource-Policy", "same-origin"},
        };
        for (size_t i = 0; i < KINBOX__ARRAY_SIZE(h); i++) {
                a->hdr[i][0] = h[i][0];
                a->hdr[i][1] = h[i][1] ? h[i][1] : csp;
        }
}

/* {"error": msg} with code. */
static void
ans_error(kinbox__http_ans_t *a, unsigned code, const char *msg)
{
        json_t *j = json_pack("{s:s}", "error", msg);
        a->code = code;
        a->ctype = "application/json";
        a->body = j ? json_dumps(j, JSON_COMPACT) : NULL;
        a->len = a->body ? strlen(a->body) : 0;
        json_decref(j);
}

static void
ans_json(kinbox__http_ans_t *a, unsigned code, char *json)
{
        a->code = code;
        a->ctype = "application/json";
        a->body = json;
        a->len = json ? strlen(json) : 0;
}

/* A static file of src/console/; false when there is none. */
static bool
ans_asset(kinbox__http_ans_t *a, const char *name)
{
        for (const kinbox__console_asset_t *f = kinbox__console_assets;
             f->name; f++) {
                if (strcmp(f->name, name))
                        continue;
                const char *dot = strrchr(name, '.');
                a->code = 200;
                a->ctype = !dot                   ? "text/plain"
                           : !strcmp(dot, ".js")  ? "text/javascript"
                           : !strcmp(dot, ".css") ? "text/css"
                           : !strcmp(dot, ".html")
                               ? "text/html; charset=utf-8"
                               : "application/octet-stream";
                a->body = kinbox__calloc(1, f->size + 1);
                if (a->body)
                        memcpy(a->body, f->data, f->size);
                a->len = a->body ? f->size : 0;
                return true;
        }
        return false;
}

/* Host names an address or localhost (not a name an attacker's DNS could
 * point here). */
static bool
host_ok(const char *host)
{
        if (!host || !*host)
                return false;
        if (host[0] == '[')
                return true; /* an IPv6 literal */
        size_t n = strcspn(host, ":");
        if (n == 9 && !strncmp(host, "localhost", 9))
                return true;
        for (size_t i = 0; i < n; i++)
                if (!isdigit((unsigned char)host[i]) && host[i] != '.')
                        return false;
        return n > 0;
}

/* An action's caller: Origin (when sent) is this server, the token
 * matches. 0, or the refusal's code with why. */
static unsigned
action_refused(kinbox__console_t *c, const kinbox__http_req_t *r,
               const char **why)
{
        const char *origin = kinbox__http_req_get(r, 0, "Origin");
        const char *host = kinbox__http_req_get(r, 0, "Host");
        if (origin) {
                const char *o = !strncmp(origin, "http://", 7)    ? origin + 7
                                : !strncmp(origin, "https://", 8) ? origin + 8
                                                                  : NULL;
                if (!o || !host || strcmp(o, host)) {
                        *why = "cross-origin request refused (Origin is not "
                               "this server)";
                        return 403;
                }
        }
        const char *site = kinbox__http_req_get(r, 0, "Sec-Fetch-Site");
        if (site && strcmp(site, "same-origin") && strcmp(site, "none")) {
                *why = "cross-site request refused (Sec-Fetch-Site)";
                return 403;
        }
        if (!c->token[0]) {
                *why = "the console is read-only (no console.token_file)";
                return 403;
        }
        const char *auth = kinbox__http_req_get(r, 0, "Authorization");
        if (!auth || strncmp(auth, "Bearer ", 7) ||
            !token_equal(c->token, auth + 7)) {
                *why = "a valid bearer token is required "
                       "(Authorization: Bearer TOKEN)";
                return 401;
        }
        return 0;
}

/* Who asked, for the audit line: the address and X-Kinbox-Operator (its
 * letters, digits and ._@- only). */
static void
who(const kinbox__http_req_t *r, char *out, size_t sz)
{
        const char *op = kinbox__http_req_get(r, 0, "X-Kinbox-Operator");
        char name[65] = "";
        size_t k = 0;
        for (; op && *op && k < sizeof(name) - 1; op++)
                if (isalnum((unsigned char)*op) || strchr("._@-", *op))
                        name[k++] = *op;
        name[k] = '\0';
        snprintf(out, sz, "%s%s%s", name[0] ? name : "", name[0] ? "@" : "",
                 r->peer);
}

static void
audit(kinbox__console_t *c, const kinbox__http_req_t *r, const char *what,
      unsigned code)
{
        char by[160], when[40];
        who(r, by, sizeof(by));
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
        kinbox__log(
            &c->lg, code < 300 ? KINBOX_LOG_NOTICE : KINBOX_LOG_WARNING,
            "console", "audit: by=%s action=\"%s\" at=%s result=%u%s", by,
            what, when, code, code < 300 ? "" : " (refused or failed)");
}

static void
serve_api(kinbox__console_t *c, const kinbox__http_req_t *r,
          kinbox__http_ans_t *a, const char *path)
{
        char *json = NULL;
        if (!strcmp(r->method, "GET") && !strcmp(path, "session")) {
                /* What the page may offer; no secret in it. */
                json_t *j = json_pack("{s:b,s:i}", "actions", !!c->token[0],
                                      "refresh_ms", 2000);
                ans_json(a, 200, j ? json_dumps(j, JSON_COMPACT) : NULL);
                json_decref(j);
                return;
        }
        if (!strcmp(r->method, "GET") || !strcmp(r->method, "HEAD")) {
                unsigned code = kinbox__console_get(c->data, r, path, &json);
                ans_json(a, code, json);
                return;
        }
        if (strcmp(r->method, "POST")) {
                ans_error(a, 405, "method not allowed");
                return;
        }
        const char *why = NULL;
        unsigned code = action_refused(c, r, &why);
        char what[300];
        snprintf(what, sizeof(what), "POST /console/api/%.200s", path);
        if (code) {
                audit(c, r, what, code);
                ans_error(a, code, why);
                if (code == 401)
                        a->hdr[7][0] = "WWW-Authenticate",
                        a->hdr[7][1] = "Bearer realm=\"kinbox console\"";
                return;
        }
        code =
            kinbox__console_post(c->data, r, path, &json, what, sizeof(what));
        audit(c, r, what, code);
        ans_json(a, code, json);
}

void
kinbox__console_serve(const kinbox__http_req_t *r, kinbox__http_ans_t *a,
                      void *opaque)
{
        kinbox__console_t *c = opaque;
        security_headers(a);
        if (!r->peer_loopback && !c->allow_remote) {
                ans_error(a, 403,
                          "the console answers loopback clients only "
                          "(console.allow_remote)");
                return;
        }
        if (!host_ok(kinbox__http_req_get(r, 0, "Host"))) {
                ans_error(a, 403, "Host must be an address or localhost");
                return;
        }
        const char *p = r->url + strlen("/console");
        pthread_mutex_lock(&c->mu);
        if (!strncmp(p, "/api/", 5)) {
                serve_api(c, r, a, p + 5);
        } else if (strcmp(r->method, "GET") && strcmp(r->method, "HEAD")) {
                ans_error(a, 405, "method not allowed");
        } else if (!*p || !strcmp(p, "/")) {
                ans_asset(a, "index.html");
        } else if (p[0] != '/' || strchr(p + 1, '/') || p[1] == '.' ||
                   !ans_asset(a, p + 1)) {
                ans_error(a, 404, "not found");
        }
        pthread_mutex_unlock(&c->mu);
}
