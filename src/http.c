/*
 * http.c -- /metrics, /healthz and /readyz on libmicrohttpd.
 *
 * A thread per connection, so /healthz answers from its own thread and
 * never waits behind a slow /readyz or /metrics. The caller's ready and
 * collect callbacks run on one probe thread of their own (never two at
 * once); a request asks the probe and waits for its answer at most its own
 * deadline. Requests that arrive while a probe runs share its answer, so a
 * database or broker outage costs one probe, not one per request.
 *
 * The probe thread also enforces the request deadline: a connection that
 * has not delivered a whole request head within HTTP_REQUEST_DEADLINE_MS of
 * its accept (or of its previous answer) is shut down, and a client address
 * keeps at most HTTP_IDLE_PER_IP connections that wait for their request
 * (the oldest goes when another arrives): a slow client cannot hold the
 * slots the probes of its own address need.
 */
#include "http.h"
#include "internal.h"
#include "metrics.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* Held connections must not exhaust the process's descriptors (database
 * and broker connections need them) nor starve /healthz: a bounded number
 * of connections, fewer per client address, idle ones closed. Over the
 * limits, libmicrohttpd accepts and closes at once. */
#define HTTP_MAX_CONNECTIONS 256
#define HTTP_MAX_PER_IP 64
#define HTTP_IDLE_TIMEOUT_S 5
/* A whole request head within this long of the accept or the previous
 * answer, however slowly its bytes come. */
#define HTTP_REQUEST_DEADLINE_MS 10000
/* Connections of one address that wait for their request head. */
#define HTTP_IDLE_PER_IP 16
/* How long a request waits for the probe: /readyz (a database round trip
 * and a 2 s broker metadata request), /metrics (sampled gauges: rendered
 * with their previous values after the deadline). */
#define READY_DEADLINE_MS 3000
#define METRICS_DEADLINE_MS 5000
/* A readiness answer this recent is served again without a probe. */
#define READY_FRESH_MS 1000
/* libmicrohttpd's own messages (bad requests, limits reached) go to the
 * kinbox logger at debug level, at most this many per window. */
#define HTTP_LOG_BURST 10
#define HTTP_LOG_WINDOW_MS 60000

/* One open connection (libmicrohttpd's socket context). */
struct conn {
        struct conn *next, *prev;
        int fd;
        struct sockaddr_storage addr;
        int64_t since_ms; /* accepted, or its last answer */
        bool busy; /* a request head arrived; not answered yet */
        bool shut; /* shut down by the deadline or an eviction */
};

struct kinbox__http_s {
        struct MHD_Daemon *d;
        /* The probe thread, the connections, the probe's answers. */
        pthread_t probe;
        bool probe_started;
        pthread_mutex_t mu;
        pthread_cond_t cv; /* probe wanted, probe done, stop */
        bool stop;
        uint64_t ready_req, ready_done;
        int ready_rc;
        char ready_why[512];
        int64_t ready_at_ms;
        uint64_t collect_req, collect_done;
        struct conn *conns;
        kinbox__log_t lg;
        pthread_mutex_t log_lock;
        int64_t log_window_start;
        unsigned log_count, log_suppressed;
        kinbox__ready_fn ready;
        kinbox__collect_fn collect;
        void *opaque;
        int port;
        /* kinbox__http_route(), under mu */
        const char *route_prefix;
        kinbox__http_route_fn route_fn;
        void *route_opaque;
};

/* A routed request's state: its body so far. */
struct rstate {
        char *body;
        size_t n;
        bool big;
};
#define ROUTE_BODY_MAX 65536

static enum MHD_Result
reply(struct MHD_Connection *conn, unsigned code, const char *ctype,
      char *body, bool owned)
{
        struct MHD_Response *r = MHD_create_response_from_buffer(
            strlen(body), body,
            owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
        if (!r) {
                if (owned)
                        free(body);
                return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", ctype);
        enum MHD_Result ret = MHD_queue_response(conn, code, r);
        MHD_destroy_response(r);
        return ret;
}

/* Wait on h->cv until ms_deadline (monotonic); h->mu held. */
static void
wait_until(kinbox__http_t *h, int64_t deadline_ms)
{
        int64_t left = deadline_ms - kinbox__now_ms();
        if (left <= 0)
                return;
        struct timespec ts;
        kinbox__deadline_on(CLOCK_MONOTONIC, left, &ts);
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
}

/* The readiness answer for a request: the probe's, waited for at most
 * READY_DEADLINE_MS. Returns the callback's result, or 2 when the probe
 * did not answer in time (why says so). */
static int
ask_ready(kinbox__http_t *h, char *why, size_t sz)
{
        if (!h->ready)
                return 0;
        int64_t now = kinbox__now_ms(), deadline = now + READY_DEADLINE_MS;
        pthread_mutex_lock(&h->mu);
        uint64_t want;
        if (h->ready_req > h->ready_done) {
                want = h->ready_req; /* one runs: share its answer */
        } else if (h->ready_done && now - h->ready_at_ms < READY_FRESH_MS) {
                want = h->ready_done;
        } else {
                want = ++h->ready_req;
                pthread_cond_broadcast(&h->cv);
        }
        while (h->ready_done < want && !h->stop && kinbox__now_ms() < deadline)
                wait_until(h, deadline);
        int rc;
        if (h->ready_done >= want) {
                rc = h->ready_rc;
                snprintf(why, sz, "%s", h->ready_why);
        } else {
                rc = 2;
                snprintf(why, sz,
                         h->stop ? "stopping"
                                 : "the readiness check (database, broker) "
                                   "did not answer within %d s",
                         READY_DEADLINE_MS / 1000);
        }
        pthread_mutex_unlock(&h->mu);
        return rc;
}

/* Refresh the sampled gauges before /metrics renders: the probe's collect,
 * waited for at most METRICS_DEADLINE_MS (then the previous values). */
static void
ask_collect(kinbox__http_t *h)
{
        if (!h->collect)
                return;
        int64_t deadline = kinbox__now_ms() + METRICS_DEADLINE_MS;
        pthread_mutex_lock(&h->mu);
        uint64_t want = h->collect_req > h->collect_done ? h->collect_req
                                                         : ++h->collect_req;
        pthread_cond_broadcast(&h->cv);
        while (h->collect_done < want && !h->stop &&
               kinbox__now_ms() < deadline)
                wait_until(h, deadline);
        pthread_mutex_unlock(&h->mu);
}

/* Shut a connection down (its thread sees the end and closes it);
 * h->mu held, so its descriptor is still open (closed after
 * MHD_CONNECTION_NOTIFY_CLOSED, which takes h->mu). */
static void
conn_shut(struct conn *c)
{
        if (!c->shut) {
                c->shut = true;
                shutdown(c->fd, SHUT_RDWR);
        }
}

static bool
same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
        if (a->ss_family != b->ss_family)
                return false;
        if (a->ss_family == AF_INET)
                return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
                       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
        if (a->ss_family == AF_INET6)
                return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                               &((const struct sockaddr_in6 *)b)->sin6_addr,
                               sizeof(struct in6_addr));
        return false;
}

/* Connections past the request deadline are shut; h->mu held. Returns
 * the next time one would be due (monotonic ms). */
static int64_t
reap(kinbox__http_t *h, int64_t now)
{
        int64_t next = now + 1000; /* new connections are due later */
        for (struct conn *c = h->conns; c; c = c->next) {
                if (c->busy || c->shut)
                        continue;
                int64_t due = c->since_ms + HTTP_REQUEST_DEADLINE_MS;
                if (due <= now)
                        conn_shut(c);
                else if (due < next)
                        next = due;
        }
        return next;
}

static void *
probe_main(void *arg)
{
        kinbox__http_t *h = arg;
        pthread_mutex_lock(&h->mu);
        while (!h->stop) {
                int64_t next = reap(h, kinbox__now_ms());
                if (h->ready_req > h->ready_done) {
                        uint64_t run = h->ready_req;
                        pthread_mutex_unlock(&h->mu);
                        char why[512] = "";
                        int rc = h->ready(why, sizeof(why), h->opaque);
                        pthread_mutex_lock(&h->mu);
                        h->ready_rc = rc;
                        snprintf(h->ready_why, sizeof(h->ready_why), "%s",
                                 why);
                        h->ready_at_ms = kinbox__now_ms();
                        h->ready_done = run;
                        pthread_cond_broadcast(&h->cv);
                        continue;
                }
                if (h->collect_req > h->collect_done) {
                        uint64_t run = h->collect_req;
                        pthread_mutex_unlock(&h->mu);
                        h->collect(h->opaque);
                        pthread_mutex_lock(&h->mu);
                        h->collect_done = run;
                        pthread_cond_broadcast(&h->cv);
                        continue;
                }
                wait_until(h, next);
        }
        pthread_mutex_unlock(&h->mu);
        return NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: track each connection; a new one from an
 * address with HTTP_IDLE_PER_IP connections waiting for their request
 * shuts the oldest of those. */
static void
on_conn(void *cls, struct MHD_Connection *mc, void **ctx,
        enum MHD_ConnectionNotificationCode what)
{
        kinbox__http_t *h = cls;
        if (what == MHD_CONNECTION_NOTIFY_STARTED) {
                struct conn *c = calloc(1, sizeof(*c));
                const union MHD_ConnectionInfo *fi = MHD_get_connection_info(
                    mc, MHD_CONNECTION_INFO_CONNECTION_FD);
                const union MHD_ConnectionInfo *ai = MHD_get_connection_info(
                    mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
                if (!c || !fi) {
                        free(c);
                        return;
                }
                c->fd = fi->connect_fd;
                if (ai && ai->client_addr) {
                        socklen_t l = ai->client_addr->sa_family == AF_INET6
                                          ? sizeof(struct sockaddr_in6)
                                          : sizeof(struct sockaddr_in);
                        memcpy(&c->addr, ai->client_addr, l);
                }
                c->since_ms = kinbox__now_ms();
                pthread_mutex_lock(&h->mu);
                struct conn *oldest = NULL;
                int waiting = 0;
                for (struct conn *o = h->conns; o; o = o->next) {
                        if (o->busy || o->shut ||
                            !same_addr(&o->addr, &c->addr))
                                continue;
                        waiting++;
                        if (!oldest || o->since_ms < oldest->since_ms)
                                oldest = o;
                }
                if (waiting >= HTTP_IDLE_PER_IP && oldest)
                        conn_shut(oldest);
                c->next = h->conns;
                if (h->conns)
                        h->conns->prev = c;
                h->conns = c;
                pthread_mutex_unlock(&h->mu);
                *ctx = c;
        } else if (what == MHD_CONNECTION_NOTIFY_CLOSED && *ctx) {
                struct conn *c = *ctx;
                pthread_mutex_lock(&h->mu);
                if (c->prev)
                        c->prev->next = c->next;
                else
                        h->conns = c->next;
                if (c->next)
                        c->next->prev = c->prev;
                pthread_mutex_unlock(&h->mu);
                free(c);
                *ctx = NULL;
        }
}

/* The connection's request head arrived (busy: not reaped) or its answer
 * went out (waiting again, for the next request on the connection). */
static void
conn_mark(kinbox__http_t *h, struct MHD_Connection *mc, bool busy)
{
        const union MHD_ConnectionInfo *i =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        struct conn *c = i ? i->socket_context : NULL;
        if (!c)
                return;
        pthread_mutex_lock(&h->mu);
        c->busy = busy;
        c->since_ms = kinbox__now_ms();
        pthread_mutex_unlock(&h->mu);
}

static void
on_completed(void *cls, struct MHD_Connection *mc, void **state,
             enum MHD_RequestTerminationCode toe)
{
        KINBOX__UNUSED(toe);
        if (*state && *state != cls) {
                struct rstate *rs = *state;
                free(rs->body);
                free(rs);
                *state = NULL;
        }
        conn_mark(cls, mc, false);
}

void
kinbox__http_route(kinbox__http_t *h, const char *prefix,
                   kinbox__http_route_fn fn, void *opaque)
{
        pthread_mutex_lock(&h->mu);
        h->route_prefix = prefix;
        h->route_fn = fn;
        h->route_opaque = opaque;
        pthread_mutex_unlock(&h->mu);
}

static bool
routed(kinbox__http_t *h, const char *url)
{
        pthread_mutex_lock(&h->mu);
        const char *p = h->route_prefix;
        pthread_mutex_unlock(&h->mu);
        return p && !strncmp(url, p, strlen(p));
}

const char *
kinbox__http_req_get(const kinbox__http_req_t *r, int kind, const char *name)
{
        return MHD_lookup_connection_value(
            r->conn, kind ? MHD_GET_ARGUMENT_KIND : MHD_HEADER_KIND, name);
}

static void
req_peer(struct MHD_Connection *conn, kinbox__http_req_t *rq)
{
        const union MHD_ConnectionInfo *ai =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const struct sockaddr *sa = ai ? ai->client_addr : NULL;
        snprintf(rq->peer, sizeof(rq->peer), "unknown");
        if (sa && sa->sa_family == AF_INET) {
                const struct sockaddr_in *a = (const void *)sa;
                inet_ntop(AF_INET, &a->sin_addr, rq->peer, sizeof(rq->peer));
                rq->peer_loopback = (ntohl(a->sin_addr.s_addr) >> 24) == 127;
        } else if (sa && sa->sa_family == AF_INET6) {
                const struct sockaddr_in6 *a = (const void *)sa;
                inet_ntop(AF_INET6, &a->sin6_addr, rq->peer, sizeof(rq->peer));
                rq->peer_loopback = IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
        }
}

/* Answer a routed request with the route's answer. */
static enum MHD_Result
route_reply(kinbox__http_t *h, struct MHD_Connection *conn,
            kinbox__http_req_t *rq)
{
        pthread_mutex_lock(&h->mu);
        kinbox__http_route_fn fn = h->route_fn;
        void *op = h->route_opaque;
        pthread_mutex_unlock(&h->mu);
        kinbox__http_ans_t a = {.code = MHD_HTTP_NOT_FOUND,
                                .ctype = "text/plain"};
        rq->conn = conn;
        req_peer(conn, rq);
        fn(rq, &a, op);
        struct MHD_Response *r = MHD_create_response_from_buffer(
            a.body ? a.len : 0, a.body ? a.body : (char *)"",
            a.body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
        if (!r) {
                free(a.body);
                return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", a.ctype);
        for (int i = 0; i < 12 && a.hdr[i][0]; i++)
                MHD_add_response_header(r, a.hdr[i][0], a.hdr[i][1]);
        enum MHD_Result ret = MHD_queue_response(conn, a.code, r);
        MHD_destroy_response(r);
        return ret;
}

/* A request for the route: GET/HEAD at once, POST once its body is in. */
static enum MHD_Result
route(kinbox__http_t *h, struct MHD_Connection *conn, const char *url,
      const char *method, const char *upload, size_t *upload_size,
      void **state)
{
        kinbox__http_req_t rq = {.method = method, .url = url};
        if (strcmp(method, "POST"))
                return route_reply(h, conn, &rq);
        struct rstate *rs = *state != h ? *state : NULL;
        if (!rs) {
                if (!(rs = calloc(1, sizeof(*rs))))
                        return MHD_NO;
                *state = rs;
                return MHD_YES;
        }
        if (*upload_size) {
                size_t n = *upload_size;
                *upload_size = 0;
                if (rs->big || rs->n + n > ROUTE_BODY_MAX) {
                        rs->big = true;
                        return MHD_YES;
                }
                char *nb = realloc(rs->body, rs->n + n + 1);
                if (!nb)
                        return MHD_NO;
                memcpy(nb + rs->n, upload, n);
                rs->body = nb;
                rs->n += n;
                rs->body[rs->n] = '\0';
                return MHD_YES;
        }
        if (rs->big)
                return reply(conn, MHD_HTTP_CONTENT_TOO_LARGE, "text/plain",
                             "request body too large\n", false);
        rq.body = rs->body ? rs->body : "";
        rq.body_len = rs->n;
        return route_reply(h, conn, &rq);
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url,
           const char *method, const char *version, const char *upload,
           size_t *upload_size, void **state)
{
        kinbox__http_t *h = cls;
        KINBOX__UNUSED(version);
        KINBOX__UNUSED(upload);
        KINBOX__UNUSED(upload_size);
        if (!*state) {
                /* The first call of a request: its head is complete. */
                *state = h;
                conn_mark(h, conn, true);
        }
        if (*state != h || routed(h, url))
                return route(h, conn, url, method, upload, upload_size, state);
        if (strcmp(method, "GET") && strcmp(method, "HEAD"))
                return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                             "method not allowed\n", false);
        if (!strcmp(url, "/metrics")) {
                ask_collect(h);
                char *text = kinbox__metrics_render();
                if (!text)
                        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                                     "text/plain", "out of memory\n", false);
                return reply(conn, MHD_HTTP_OK,
                             "text/plain; version=0.0.4; charset=utf-8", text,
                             true);
        }
        if (!strcmp(url, "/healthz"))
                return reply(conn, MHD_HTTP_OK, "text/plain", "ok\n", false);
        if (!strcmp(url, "/readyz")) {
                char why[512] = "";
                if (ask_ready(h, why, sizeof(why))) {
                        char body[600];
                        snprintf(body, sizeof(body), "not ready: %s\n", why);
                        return reply(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                                     "text/plain", body, false);
                }
                return reply(conn, MHD_HTTP_OK, "text/plain", "ready\n",
                             false);
        }
        return reply(conn, MHD_HTTP_NOT_FOUND, "text/plain",
                     "not found: try /metrics, /healthz or /readyz\n", false);
}

/* "host:port" or "[v6]:port" or ":port" (loopback). */
static int
parse_listen(const char *listen, struct sockaddr_storage *ss, socklen_t *len,
             char *errstr, size_t sz)
{
        char host[128];
        const char *colon = strrchr(listen, ':');
        if (!colon || !colon[1]) {
                kinbox__errstr(errstr, sz,
                               "metrics listen \"%s\": expected HOST:PORT",
                               listen);
                return -1;
        }
        size_t hl = (size_t)(colon - listen);
        if (hl >= sizeof(host)) {
                kinbox__errstr(errstr, sz, "metrics listen: host too long");
                return -1;
        }
        memcpy(host, listen, hl);
        host[hl] = '\0';
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port < 0 || port > 65535) {
                kinbox__errstr(errstr, sz, "metrics listen \"%s\": bad port",
                               listen);
                return -1;
        }
        memset(ss, 0, sizeof(*ss));
        if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
                host[hl - 1] = '\0';
                struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
                a->sin6_family = AF_INET6;
                a->sin6_port = htons((uint16_t)port);
                if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
                        goto bad;
                *len = sizeof(*a);
                return 0;
        }
        struct sockaddr_in *a = (struct sockaddr_in *)ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)port);
        if (!host[0] || !strcmp(host, "localhost"))
                a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        else if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
                goto bad;
        *len = sizeof(*a);
        return 0;
bad:
        kinbox__errstr(errstr, sz,
                       "metrics listen \"%s\": \"%s\" is not an IP address",
                       listen, host);
        return -1;
}

/* MHD_OPTION_EXTERNAL_LOGGER: one kinbox log line per message, rate
 * limited (any client can provoke these). Runs on MHD's thread. */
static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
        kinbox__http_t *h = cls;
        if (h->lg.level < KINBOX_LOG_DEBUG)
                return;
        char msg[512];
        vsnprintf(msg, sizeof(msg), fmt, ap);
        msg[strcspn(msg, "\r\n")] = '\0';
        int64_t now = kinbox__now_ms();
        unsigned suppressed = 0;
        bool emit;
        pthread_mutex_lock(&h->log_lock);
        if (now - h->log_window_start >= HTTP_LOG_WINDOW_MS) {
                suppressed = h->log_suppressed;
                h->log_window_start = now;
                h->log_count = 0;
                h->log_suppressed = 0;
        }
        emit = h->log_count < HTTP_LOG_BURST;
        if (emit)
                h->log_count++;
        else
                h->log_suppressed++;
        pthread_mutex_unlock(&h->log_lock);
        if (suppressed)
                kinbox__log(&h->lg, KINBOX_LOG_DEBUG, "http",
                            "%u libmicrohttpd messages suppressed",
                            suppressed);
        if (emit)
                kinbox__log(&h->lg, KINBOX_LOG_DEBUG, "http", "%s", msg);
}

/* Stop the probe thread (h->d stopped or never started) and free. */
static void
http_free(kinbox__http_t *h)
{
        if (h->probe_started) {
                pthread_mutex_lock(&h->mu);
                h->stop = true;
                pthread_cond_broadcast(&h->cv);
                pthread_mutex_unlock(&h->mu);
                pthread_join(h->probe, NULL);
        }
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        pthread_mutex_destroy(&h->log_lock);
        free(h);
}

kinbox__http_t *
kinbox__http_start(const char *listen, const kinbox_conf_t *conf,
                   kinbox__ready_fn ready, kinbox__collect_fn collect,
                   void *opaque, char *errstr, size_t errstr_size)
{
        struct sockaddr_storage ss;
        socklen_t len = 0;
        if (!listen || parse_listen(listen, &ss, &len, errstr, errstr_size))
                return NULL;
        kinbox__http_t *h = kinbox__calloc(1, sizeof(*h));
        if (!h) {
                kinbox__errstr(errstr, errstr_size, "out of memory");
                return NULL;
        }
        h->ready = ready;
        h->collect = collect;
        h->opaque = opaque;
        if (conf) {
                kinbox__conf_logger(conf, &h->lg);
        } else {
                h->lg.level = KINBOX_LOG_INFO;
        }
        pthread_mutex_init(&h->log_lock, NULL);
        h->log_window_start = kinbox__now_ms();
        pthread_mutex_init(&h->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&h->cv, &ca);
        pthread_condattr_destroy(&ca);
        if (pthread_create(&h->probe, NULL, probe_main, h)) {
                kinbox__errstr(errstr, errstr_size,
                               "metrics listen: cannot start a thread");
                http_free(h);
                return NULL;
        }
        h->probe_started = true;
        /* A thread per connection (poll, not select(): a descriptor above
         * FD_SETSIZE must not stop the server). */
        unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD |
                         MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO |
                         MHD_USE_ERROR_LOG;
        if (ss.ss_family == AF_INET6)
                flags |= MHD_USE_IPv6;
        uint16_t port = ss.ss_family == AF_INET6
                            ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        h->d = MHD_start_daemon(
            /* The logger first: libmicrohttpd warns (on stderr) when an
             * option before it could already have logged. */
            flags, port, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER,
            mhd_log, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_TIMEOUT_S,
            MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)HTTP_MAX_PER_IP,
            MHD_OPTION_NOTIFY_CONNECTION, on_conn, h,
            MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
        if (!h->d) {
                kinbox__errstr(errstr, errstr_size,
                               "metrics listen \"%s\": cannot listen (address "
                               "in use or not local?)",
                               listen);
                http_free(h);
                return NULL;
        }
        const union MHD_DaemonInfo *info =
            MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
        h->port = info ? (int)info->port : (int)port;
        return h;
}

int
kinbox__http_port(const kinbox__http_t *h)
{
        return h ? h->port : 0;
}

void
kinbox__http_stop(kinbox__http_t *h)
{
        if (!h)
                return;
        /* Requests waiting for the probe answer at once ("stopping"); then
         * the connection threads end, then the probe thread (after a ready
         * or collect callback in progress returns). */
        pthread_mutex_lock(&h->mu);
        h->stop = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        MHD_stop_daemon(h->d);
        h->d = NULL;
        http_free(h);
}
