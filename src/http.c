/*
 * http.c -- /metrics, /healthz and /readyz on libmicrohttpd.
 *
 * One internal polling thread; requests are answered one at a time, so the
 * caller's ready and collect callbacks never run concurrently with each
 * other (they still run concurrently with the rest of the process).
 */
#include "internal.h"

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

/* Held connections must not exhaust the process's descriptors (database
 * and broker connections need them) nor starve /healthz: a bounded number
 * of connections, fewer per client address, idle ones closed. Over the
 * limits, libmicrohttpd accepts and closes at once. */
#define HTTP_MAX_CONNECTIONS 256
#define HTTP_MAX_PER_IP 64
#define HTTP_IDLE_TIMEOUT_S 5
/* libmicrohttpd's own messages (bad requests, limits reached) go to the
 * kinbox logger at debug level, at most this many per window. */
#define HTTP_LOG_BURST 10
#define HTTP_LOG_WINDOW_MS 60000

struct kinbox_http_s {
        struct MHD_Daemon *d;
        kinbox__log_t lg;
        pthread_mutex_t log_lock;
        int64_t log_window_start;
        unsigned log_count, log_suppressed;
        kinbox_ready_fn ready;
        kinbox_collect_fn collect;
        void *opaque;
        int port;
};

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

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url,
           const char *method, const char *version, const char *upload,
           size_t *upload_size, void **state)
{
        kinbox_http_t *h = cls;
        KINBOX__UNUSED(version);
        KINBOX__UNUSED(upload);
        KINBOX__UNUSED(upload_size);
        KINBOX__UNUSED(state);
        if (strcmp(method, "GET") && strcmp(method, "HEAD"))
                return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                             "method not allowed\n", false);
        if (!strcmp(url, "/metrics")) {
                if (h->collect)
                        h->collect(h->opaque);
                char *text = kinbox_metrics_render();
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
                if (h->ready && h->ready(why, sizeof(why), h->opaque)) {
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
        kinbox_http_t *h = cls;
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

kinbox_http_t *
kinbox_http_start(const char *listen, kinbox_ready_fn ready,
                  kinbox_collect_fn collect, void *opaque, char *errstr,
                  size_t errstr_size)
{
        return kinbox_http_start_logged(listen, NULL, ready, collect, opaque,
                                        errstr, errstr_size);
}

kinbox_http_t *
kinbox_http_start_logged(const char *listen, const kinbox_conf_t *conf,
                         kinbox_ready_fn ready, kinbox_collect_fn collect,
                         void *opaque, char *errstr, size_t errstr_size)
{
        struct sockaddr_storage ss;
        socklen_t len = 0;
        if (!listen || parse_listen(listen, &ss, &len, errstr, errstr_size))
                return NULL;
        kinbox_http_t *h = kinbox__calloc(1, sizeof(*h));
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
        /* poll/epoll, not select(): a descriptor above FD_SETSIZE must not
         * stop the server. */
        unsigned flags =
            MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
        if (ss.ss_family == AF_INET6)
                flags |= MHD_USE_IPv6;
        uint16_t port = ss.ss_family == AF_INET6
                            ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                            : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        h->d = MHD_start_daemon(
            /* The logger first: libmicrohttpd warns (on stderr) when an
             * option before it could already have logged. */
            flags, port, NULL, NULL, on_request, h,
            MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, MHD_OPTION_SOCK_ADDR,
            (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_TIMEOUT,
            (unsigned)HTTP_IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_LIMIT,
            (unsigned)HTTP_MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
            (unsigned)HTTP_MAX_PER_IP, MHD_OPTION_END);
        if (!h->d) {
                pthread_mutex_destroy(&h->log_lock);
                kinbox__errstr(errstr, errstr_size,
                               "metrics listen \"%s\": cannot listen (address "
                               "in use or not local?)",
                               listen);
                free(h);
                return NULL;
        }
        const union MHD_DaemonInfo *info =
            MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
        h->port = info ? (int)info->port : (int)port;
        return h;
}

int
kinbox_http_port(const kinbox_http_t *h)
{
        return h ? h->port : 0;
}

void
kinbox_http_stop(kinbox_http_t *h)
{
        if (!h)
                return;
        MHD_stop_daemon(h->d);
        pthread_mutex_destroy(&h->log_lock);
        free(h);
}
