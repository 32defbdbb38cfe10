/*
 * kinbox-devbroker: runs librdkafka's in-process mock Kafka cluster as a
 * standalone process, for development and tests.
 *
 *   kinbox-devbroker [--brokers N] [--topic NAME:PARTITIONS]...
 *                    [--control PATH] [--bootstrap-file FILE] [--rtt MS]
 *   kinbox-devbroker ctl --control PATH COMMAND [ARGS...]
 *
 * Once the cluster is up it prints "bootstrap.servers=HOST:PORT,..." on
 * stdout.  It runs until SIGTERM/SIGINT.
 *
 * Control protocol (unix stream socket): one command per line, one reply
 * line per command: "ok", "ok <data>" or "err <reason>".  A connection may
 * send several commands; several clients may be connected at once.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, SOCK_CLOEXEC */
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define PROG "kinbox-devbroker"
#define MAX_CLIENTS 16
#define LINE_MAX_LEN 4096
#define MAX_ARGS 64
#define MAX_PUSH_ERRORS 1000

static volatile sig_atomic_t g_stop = 0;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

/* ------------------------------------------------------------------ */
/* small parsing helpers                                              */
/* ------------------------------------------------------------------ */

static int parse_long(const char *s, long min, long max, long *out) {
    char *end = NULL;
    long v;
    if (s == NULL || *s == '\0')
        return -1;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Kafka protocol ApiKey names accepted in addition to numbers. */
static const struct {
    const char *name;
    int key;
} api_keys[] = {
    {"Produce", 0},
    {"Fetch", 1},
    {"ListOffsets", 2},
    {"Metadata", 3},
    {"OffsetCommit", 8},
    {"OffsetFetch", 9},
    {"FindCoordinator", 10},
    {"JoinGroup", 11},
    {"Heartbeat", 12},
    {"LeaveGroup", 13},
    {"SyncGroup", 14},
    {"DescribeGroups", 15},
    {"ListGroups", 16},
    {"SaslHandshake", 17},
    {"ApiVersions", 18},
    {"CreateTopics", 19},
    {"DeleteTopics", 20},
    {"DeleteRecords", 21},
    {"InitProducerId", 22},
    {"OffsetForLeaderEpoch", 23},
    {"AddPartitionsToTxn", 24},
    {"AddOffsetsToTxn", 25},
    {"EndTxn", 26},
    {"TxnOffsetCommit", 28},
    {"DescribeConfigs", 32},
    {"AlterConfigs", 33},
    {"SaslAuthenticate", 36},
    {"CreatePartitions", 37},
    {"DeleteGroups", 42},
    {"IncrementalAlterConfigs", 44},
    {"OffsetDelete", 47},
};

static int parse_api_key(const char *s, int16_t *out) {
    long v;
    size_t i;
    if (parse_long(s, 0, INT16_MAX, &v) == 0) {
        *out = (int16_t)v;
        return 0;
    }
    for (i = 0; i < sizeof(api_keys) / sizeof(api_keys[0]); i++) {
        if (strcasecmp(s, api_keys[i].name) == 0) {
            *out = (int16_t)api_keys[i].key;
            return 0;
        }
    }
    return -1;
}

/* Numeric code, or a librdkafka error name with or without the
 * "RD_KAFKA_RESP_ERR_" prefix (e.g. NOT_COORDINATOR, _TRANSPORT). */
static int parse_err_code(const char *s, rd_kafka_resp_err_t *out) {
    const struct rd_kafka_err_desc *descs = NULL;
    size_t cnt = 0, i;
    long v;
    const char *prefix = "RD_KAFKA_RESP_ERR_";

    if (parse_long(s, -300, 32767, &v) == 0) {
        *out = (rd_kafka_resp_err_t)v;
        return 0;
    }
    if (strncasecmp(s, prefix, strlen(prefix)) == 0)
        s += strlen(prefix);
    if (*s == '\0')
        return -1;
    rd_kafka_get_err_descs(&descs, &cnt);
    for (i = 0; i < cnt; i++) {
        if (descs[i].name != NULL && strcasecmp(descs[i].name, s) == 0) {
            *out = descs[i].code;
            return 0;
        }
    }
    return -1;
}

static int split_args(char *line, char **argv, int max) {
    int n = 0;
    char *save = NULL;
    char *tok = strtok_r(line, " \t\r\n", &save);
    while (tok != NULL && n < max) {
        argv[n++] = tok;
        tok = strtok_r(NULL, " \t\r\n", &save);
    }
    if (tok != NULL)
        return -1;
    return n;
}

/* ------------------------------------------------------------------ */
/* control commands                                                   */
/* ------------------------------------------------------------------ */

struct devbroker {
    rd_kafka_t *rk;
    rd_kafka_mock_cluster_t *mcluster;
    int broker_cnt;
    const char *bootstraps;
};

static void reply_set(char *reply, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reply, size, fmt, ap);
    va_end(ap);
}

static int reply_rkerr(char *reply, size_t size, rd_kafka_resp_err_t err) {
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
        reply_set(reply, size, "ok");
    else
        reply_set(reply, size, "err %s: %s", rd_kafka_err2name(err),
                  rd_kafka_err2str(err));
    return err == RD_KAFKA_RESP_ERR_NO_ERROR ? 0 : -1;
}

/* Broker ids of the mock cluster are 1..broker_cnt. */
static int parse_broker_id(const struct devbroker *db, const char *s,
                           int allow_all, int32_t *out) {
    long v;
    if (allow_all && strcmp(s, "all") == 0) {
        *out = -1;
        return 0;
    }
    if (parse_long(s, 1, db->broker_cnt, &v) != 0)
        return -1;
    *out = (int32_t)v;
    return 0;
}

static int valid_topic_name(const char *s) {
    size_t len = strlen(s), i;
    if (len == 0 || len > 249 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return 0;
    for (i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int create_topic(struct devbroker *db, const char *name, long parts,
                        char *reply, size_t size) {
    if (!valid_topic_name(name)) {
        reply_set(reply, size, "err invalid topic name");
        return -1;
    }
    return reply_rkerr(reply, size,
                       rd_kafka_mock_topic_create(db->mcluster, name,
                                                  (int)parts, 1));
}

static int handle_command(struct devbroker *db, char *line, char *reply,
                          size_t size) {
    char *argv[MAX_ARGS];
    int argc = split_args(line, argv, MAX_ARGS);
    const char *cmd;
    long v;
    int32_t broker;

    if (argc < 0) {
        reply_set(reply, size, "err too many arguments");
        return -1;
    }
    if (argc == 0) {
        reply_set(reply, size, "err empty command");
        return -1;
    }
    cmd = argv[0];

#define NEED_ARGS(n, usage)                                                    \
    do {                                                                       \
        if (argc != (n)) {                                                     \
            reply_set(reply, size, "err usage: %s", usage);                    \
            return -1;                                                         \
        }                                                                      \
    } while (0)

    if (strcmp(cmd, "ping") == 0) {
        NEED_ARGS(1, "ping");
        reply_set(reply, size, "ok pong");
        return 0;
    }
    if (strcmp(cmd, "bootstrap") == 0) {
        NEED_ARGS(1, "bootstrap");
        reply_set(reply, size, "ok %s", db->bootstraps);
        return 0;
    }
    if (strcmp(cmd, "topic") == 0) {
        NEED_ARGS(3, "topic NAME PARTITIONS");
        if (parse_long(argv[2], 1, 100000, &v) != 0) {
            reply_set(reply, size, "err invalid partition count");
            return -1;
        }
        return create_topic(db, argv[1], v, reply, size);
    }
    if (strcmp(cmd, "broker-down") == 0 || strcmp(cmd, "broker-up") == 0) {
        int down = strcmp(cmd, "broker-down") == 0;
        NEED_ARGS(2, down ? "broker-down ID|all" : "broker-up ID|all");
        if (parse_broker_id(db, argv[1], 1, &broker) != 0) {
            reply_set(reply, size, "err invalid broker id (1..%d or all)",
                      db->broker_cnt);
            return -1;
        }
        return reply_rkerr(reply, size,
                           down ? rd_kafka_mock_broker_set_down(db->mcluster,
                                                                broker)
                                : rd_kafka_mock_broker_set_up(db->mcluster,
                                                              broker));
    }
    if (strcmp(cmd, "rtt") == 0) {
        NEED_ARGS(3, "rtt ID|all MS");
        if (parse_broker_id(db, argv[1], 1, &broker) != 0) {
            reply_set(reply, size, "err invalid broker id (1..%d or all)",
                      db->broker_cnt);
            return -1;
        }
        if (parse_long(argv[2], 0, INT_MAX, &v) != 0) {
            reply_set(reply, size, "err invalid rtt");
            return -1;
        }
        return reply_rkerr(reply, size,
                           rd_kafka_mock_broker_set_rtt(db->mcluster, broker,
                                                        (int)v));
    }
    if (strcmp(cmd, "push-errors") == 0) {
        rd_kafka_resp_err_t errs[MAX_ARGS];
        int16_t api_key;
        int i;
        if (argc < 3) {
            reply_set(reply, size,
                      "err usage: push-errors APIKEY ERRCODE [ERRCODE...]");
            return -1;
        }
        if (parse_api_key(argv[1], &api_key) != 0) {
            reply_set(reply, size, "err invalid api key '%s'", argv[1]);
            return -1;
        }
        for (i = 2; i < argc; i++) {
            if (parse_err_code(argv[i], &errs[i - 2]) != 0) {
                reply_set(reply, size, "err unknown error code '%s'", argv[i]);
                return -1;
            }
        }
        rd_kafka_mock_push_request_errors_array(db->mcluster, api_key,
                                                (size_t)(argc - 2), errs);
        reply_set(reply, size, "ok %d", argc - 2);
        return 0;
    }
    if (strcmp(cmd, "clear-errors") == 0) {
        int16_t api_key;
        NEED_ARGS(2, "clear-errors APIKEY");
        if (parse_api_key(argv[1], &api_key) != 0) {
            reply_set(reply, size, "err invalid api key '%s'", argv[1]);
            return -1;
        }
        rd_kafka_mock_clear_request_errors(db->mcluster, api_key);
        reply_set(reply, size, "ok");
        return 0;
    }
    if (strcmp(cmd, "coordinator") == 0) {
        const char *type;
        long bid;
        NEED_ARGS(4, "coordinator group|txn KEY BROKERID");
        if (strcmp(argv[1], "group") == 0)
            type = "group";
        else if (strcmp(argv[1], "txn") == 0 ||
                 strcmp(argv[1], "transaction") == 0)
            type = "transaction";
        else {
            reply_set(reply, size, "err coordinator type must be group|txn");
            return -1;
        }
        if (parse_long(argv[3], 1, db->broker_cnt, &bid) != 0) {
            reply_set(reply, size, "err invalid broker id (1..%d)",
                      db->broker_cnt);
            return -1;
        }
        return reply_rkerr(reply, size,
                           rd_kafka_mock_coordinator_set(db->mcluster, type,
                                                         argv[2],
                                                         (int32_t)bid));
    }
    if (strcmp(cmd, "leader") == 0) {
        long part, bid;
        NEED_ARGS(4, "leader TOPIC PARTITION BROKERID");
        if (!valid_topic_name(argv[1])) {
            reply_set(reply, size, "err invalid topic name");
            return -1;
        }
        if (parse_long(argv[2], 0, INT32_MAX, &part) != 0) {
            reply_set(reply, size, "err invalid partition");
            return -1;
        }
        /* -1 makes the partition leader-less */
        if (parse_long(argv[3], -1, db->broker_cnt, &bid) != 0 || bid == 0) {
            reply_set(reply, size, "err invalid broker id (1..%d or -1)",
                      db->broker_cnt);
            return -1;
        }
        return reply_rkerr(reply, size,
                           rd_kafka_mock_partition_set_leader(
                               db->mcluster, argv[1], (int32_t)part,
                               (int32_t)bid));
    }
#undef NEED_ARGS

    reply_set(reply, size, "err unknown command '%s'", cmd);
    return -1;
}

/* ------------------------------------------------------------------ */
/* control socket                                                     */
/* ------------------------------------------------------------------ */

struct client {
    int fd;
    size_t len;
    char buf[LINE_MAX_LEN];
};

static int fill_sockaddr(const char *path, struct sockaddr_un *sa) {
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa->sun_path)) {
        fprintf(stderr, PROG ": control socket path too long: %s\n", path);
        return -1;
    }
    strcpy(sa->sun_path, path);
    return 0;
}

static int listen_control(const char *path) {
    struct sockaddr_un sa;
    struct stat st;
    int fd;

    if (fill_sockaddr(path, &sa) != 0)
        return -1;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            fprintf(stderr, PROG ": %s exists and is not a socket\n", path);
            return -1;
        }
        /* refuse to steal the socket of a live devbroker */
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0) {
            if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
                close(fd);
                fprintf(stderr, PROG ": %s is in use by another process\n",
                        path);
                return -1;
            }
            close(fd);
        }
        unlink(path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        perror(PROG ": socket");
        return -1;
    }
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(fd, 16) != 0) {
        fprintf(stderr, PROG ": bind/listen %s: %s\n", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                struct pollfd p = {.fd = fd, .events = POLLOUT, .revents = 0};
                if (poll(&p, 1, 1000) <= 0)
                    return -1;
                continue;
            }
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads what is available; handles complete lines.  Returns -1 when the
 * client should be dropped. */
static int client_readable(struct devbroker *db, struct client *c) {
    for (;;) {
        ssize_t n;
        char *nl;
        if (c->len >= sizeof(c->buf) - 1) {
            static const char msg[] = "err line too long\n";
            (void)write_all(c->fd, msg, sizeof(msg) - 1);
            return -1;
        }
        n = read(c->fd, c->buf + c->len, sizeof(c->buf) - 1 - c->len);
        if (n == 0)
            return -1;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->len += (size_t)n;
        while ((nl = memchr(c->buf, '\n', c->len)) != NULL) {
            char reply[LINE_MAX_LEN + 64];
            size_t linelen = (size_t)(nl - c->buf);
            size_t rlen;
            *nl = '\0';
            handle_command(db, c->buf, reply, sizeof(reply) - 1);
            rlen = strlen(reply);
            reply[rlen++] = '\n';
            if (write_all(c->fd, reply, rlen) != 0)
                return -1;
            memmove(c->buf, nl + 1, c->len - linelen - 1);
            c->len -= linelen + 1;
        }
    }
}

static int write_bootstrap_file(const char *path, const char *bootstraps) {
    char tmp[PATH_MAX];
    FILE *f;
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path,
                         (long)getpid()) >= sizeof(tmp)) {
        fprintf(stderr, PROG ": bootstrap file path too long\n");
        return -1;
    }
    f = fopen(tmp, "w");
    if (f == NULL) {
        fprintf(stderr, PROG ": %s: %s\n", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "%s\n", bootstraps);
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        fprintf(stderr, PROG ": writing %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* client mode                                                        */
/* ------------------------------------------------------------------ */

static int run_ctl(int argc, char **argv) {
    const char *path = getenv("KINBOX_DEVBROKER_CONTROL");
    char line[LINE_MAX_LEN];
    char reply[LINE_MAX_LEN + 64];
    size_t len = 0, rlen = 0;
    struct sockaddr_un sa;
    int i = 0, fd;

    while (i < argc && argv[i][0] == '-') {
        if ((strcmp(argv[i], "--control") == 0 || strcmp(argv[i], "-c") == 0) &&
            i + 1 < argc) {
            path = argv[i + 1];
            i += 2;
        } else if (strncmp(argv[i], "--control=", 10) == 0) {
            path = argv[i] + 10;
            i++;
        } else if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else {
            fprintf(stderr, PROG " ctl: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (path == NULL || *path == '\0') {
        fprintf(stderr, PROG " ctl: --control PATH is required\n");
        return 2;
    }
    if (i >= argc) {
        fprintf(stderr, PROG " ctl: missing command\n");
        return 2;
    }
    for (; i < argc; i++) {
        size_t al = strlen(argv[i]);
        if (len + al + 2 >= sizeof(line)) {
            fprintf(stderr, PROG " ctl: command too long\n");
            return 2;
        }
        if (len > 0)
            line[len++] = ' ';
        memcpy(line + len, argv[i], al);
        len += al;
    }
    line[len++] = '\n';

    if (fill_sockaddr(path, &sa) != 0)
        return 2;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        fprintf(stderr, PROG " ctl: connect %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return 2;
    }
    if (write_all(fd, line, len) != 0) {
        fprintf(stderr, PROG " ctl: write: %s\n", strerror(errno));
        close(fd);
        return 2;
    }
    shutdown(fd, SHUT_WR);
    for (;;) {
        ssize_t n;
        if (rlen >= sizeof(reply) - 1)
            break;
        n = read(fd, reply + rlen, sizeof(reply) - 1 - rlen);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        rlen += (size_t)n;
        if (memchr(reply, '\n', rlen) != NULL)
            break;
    }
    close(fd);
    reply[rlen] = '\0';
    {
        char *nl = strchr(reply, '\n');
        if (nl != NULL)
            *nl = '\0';
    }
    if (rlen == 0) {
        fprintf(stderr, PROG " ctl: no reply\n");
        return 2;
    }
    printf("%s\n", reply);
    fflush(stdout);
    return (strcmp(reply, "ok") == 0 || strncmp(reply, "ok ", 3) == 0) ? 0
                                                                       : 1;
}

/* ------------------------------------------------------------------ */
/* server mode                                                        */
/* ------------------------------------------------------------------ */

static void usage(FILE *out) {
    fprintf(out,
            "usage: " PROG " [options]\n"
            "       " PROG " ctl --control PATH COMMAND [ARGS...]\n"
            "\n"
            "Runs a librdkafka mock Kafka cluster until SIGTERM/SIGINT and\n"
            "prints 'bootstrap.servers=HOST:PORT,...' on stdout when ready.\n"
            "\n"
            "options:\n"
            "  --brokers N              number of brokers (default 3, ids 1..N)\n"
            "  --topic NAME:PARTITIONS  create a topic (repeatable, replication 1)\n"
            "  --control PATH           serve the control protocol on a unix socket\n"
            "  --bootstrap-file FILE    write the bootstrap list to FILE\n"
            "  --rtt MS                 round-trip delay for all brokers\n"
            "  -h, --help               this help\n"
            "\n"
            "control commands (one line each; reply 'ok [data]' or 'err reason'):\n"
            "  ping                                  -> ok pong\n"
            "  bootstrap                             -> ok HOST:PORT,...\n"
            "  topic NAME PARTITIONS\n"
            "  broker-down ID|all,  broker-up ID|all\n"
            "  rtt ID|all MS\n"
            "  push-errors APIKEY ERRCODE [ERRCODE...]  (APIKEY number or name,\n"
            "        e.g. 8 or OffsetCommit; ERRCODE number or name, e.g. 27 or\n"
            "        REBALANCE_IN_PROGRESS or _TRANSPORT)\n"
            "  clear-errors APIKEY\n"
            "  coordinator group|txn KEY BROKERID\n"
            "  leader TOPIC PARTITION BROKERID      (BROKERID -1: no leader)\n"
            "\n"
            "ctl mode: sends one command, prints the reply; exit 0 on ok, 1 on err,\n"
            "2 on usage/connection errors.  PATH defaults to\n"
            "$KINBOX_DEVBROKER_CONTROL.\n");
}

#define MAX_TOPICS 256

/*
 * The mock cluster's listening sockets are created inside librdkafka with
 * Nagle's algorithm on; a response written in two pieces then waits for
 * the client's delayed ACK (~40 ms a round trip), which no real broker
 * does. Sockets accepted later inherit TCP_NODELAY from their listener,
 * so set it on every listening TCP socket of this process.
 */
static void listeners_nodelay(void) {
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    if (d == NULL)
        return;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        int on = 0, type = 0, one = 1;
        socklen_t len = sizeof(on);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (*end != '\0' || fd < 0 || fd == dirfd(d))
            continue;
        if (getsockopt((int)fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) != 0 ||
            !on)
            continue;
        len = sizeof(type);
        if (getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
            type != SOCK_STREAM)
            continue;
        if (getsockname((int)fd, (struct sockaddr *)&ss, &sl) != 0 ||
            (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
            continue;
        (void)setsockopt((int)fd, IPPROTO_TCP, TCP_NODELAY, &one,
                         sizeof(one));
    }
    closedir(d);
}

int main(int argc, char **argv) {
    long brokers = 3, rtt = -1, v;
    const char *control = NULL, *bootstrap_file = NULL;
    const char *topics[MAX_TOPICS];
    int topic_cnt = 0, i, listen_fd = -1, rc = 0;
    char errstr[512];
    rd_kafka_conf_t *conf;
    struct devbroker db;
    struct client clients[MAX_CLIENTS];
    struct sigaction sa;

    if (argc >= 2 && strcmp(argv[1], "ctl") == 0)
        return run_ctl(argc - 2, argv + 2);

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        const char *eq = NULL;
        char optname[64];

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, PROG ": unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        eq = strchr(a, '=');
        if (eq != NULL) {
            size_t nl = (size_t)(eq - a);
            if (nl >= sizeof(optname))
                nl = sizeof(optname) - 1;
            memcpy(optname, a, nl);
            optname[nl] = '\0';
            val = eq + 1;
        } else {
            snprintf(optname, sizeof(optname), "%s", a);
            if (i + 1 >= argc) {
                fprintf(stderr, PROG ": option %s needs a value\n", a);
                return 2;
            }
            val = argv[++i];
        }

        if (strcmp(optname, "--brokers") == 0) {
            if (parse_long(val, 1, 100, &brokers) != 0) {
                fprintf(stderr, PROG ": invalid --brokers '%s'\n", val);
                return 2;
            }
        } else if (strcmp(optname, "--topic") == 0) {
            if (topic_cnt >= MAX_TOPICS) {
                fprintf(stderr, PROG ": too many --topic options\n");
                return 2;
            }
            topics[topic_cnt++] = val;
        } else if (strcmp(optname, "--control") == 0) {
            control = val;
        } else if (strcmp(optname, "--bootstrap-file") == 0) {
            bootstrap_file = val;
        } else if (strcmp(optname, "--rtt") == 0) {
            if (parse_long(val, 0, INT_MAX, &rtt) != 0) {
                fprintf(stderr, PROG ": invalid --rtt '%s'\n", val);
                return 2;
            }
        } else {
            fprintf(stderr, PROG ": unknown option '%s'\n", optname);
            usage(stderr);
            return 2;
        }
    }

    /* validate topics before starting anything */
    for (i = 0; i < topic_cnt; i++) {
        const char *colon = strrchr(topics[i], ':');
        char name[256];
        size_t nl;
        if (colon == NULL || parse_long(colon + 1, 1, 100000, &v) != 0) {
            fprintf(stderr, PROG ": --topic wants NAME:PARTITIONS, got '%s'\n",
                    topics[i]);
            return 2;
        }
        nl = (size_t)(colon - topics[i]);
        if (nl >= sizeof(name)) {
            fprintf(stderr, PROG ": topic name too long\n");
            return 2;
        }
        memcpy(name, topics[i], nl);
        name[nl] = '\0';
        if (!valid_topic_name(name)) {
            fprintf(stderr, PROG ": invalid topic name '%s'\n", name);
            return 2;
        }
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: poll() must return EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    conf = rd_kafka_conf_new();
    /* log_level 4: hide the "no bootstrap.servers" notice of the handle
     * that only hosts the mock cluster */
    if (rd_kafka_conf_set(conf, "client.id", PROG, errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK ||
        rd_kafka_conf_set(conf, "log_level", "4", errstr, sizeof(errstr)) !=
            RD_KAFKA_CONF_OK) {
        fprintf(stderr, PROG ": %s\n", errstr);
        rd_kafka_conf_destroy(conf);
        return 1;
    }
    memset(&db, 0, sizeof(db));
    db.rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    if (db.rk == NULL) {
        fprintf(stderr, PROG ": rd_kafka_new: %s\n", errstr);
        return 1;
    }
    db.broker_cnt = (int)brokers;
    db.mcluster = rd_kafka_mock_cluster_new(db.rk, db.broker_cnt);
    if (db.mcluster == NULL) {
        fprintf(stderr, PROG ": rd_kafka_mock_cluster_new failed\n");
        rd_kafka_destroy(db.rk);
        return 1;
    }
    db.bootstraps = rd_kafka_mock_cluster_bootstraps(db.mcluster);
    listeners_nodelay();

    for (i = 0; i < topic_cnt; i++) {
        const char *colon = strrchr(topics[i], ':');
        char name[256];
        size_t nl = (size_t)(colon - topics[i]);
        rd_kafka_resp_err_t err;
        memcpy(name, topics[i], nl);
        name[nl] = '\0';
        (void)parse_long(colon + 1, 1, 100000, &v);
        err = rd_kafka_mock_topic_create(db.mcluster, name, (int)v, 1);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, PROG ": creating topic %s: %s\n", name,
                    rd_kafka_err2str(err));
            rc = 1;
            goto out;
        }
    }
    if (rtt >= 0) {
        rd_kafka_resp_err_t err =
            rd_kafka_mock_broker_set_rtt(db.mcluster, -1, (int)rtt);
        if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
            fprintf(stderr, PROG ": setting rtt: %s\n", rd_kafka_err2str(err));
            rc = 1;
            goto out;
        }
    }
    if (control != NULL) {
        listen_fd = listen_control(control);
        if (listen_fd < 0) {
            rc = 1;
            goto out;
        }
    }
    if (bootstrap_file != NULL &&
        write_bootstrap_file(bootstrap_file, db.bootstraps) != 0) {
        rc = 1;
        goto out;
    }

    printf("bootstrap.servers=%s\n", db.bootstraps);
    fflush(stdout);

    for (i = 0; i < MAX_CLIENTS; i++)
        clients[i].fd = -1;

    while (!g_stop) {
        struct pollfd pfds[1 + MAX_CLIENTS];
        int map[1 + MAX_CLIENTS];
        int n = 0, r, k;

        if (listen_fd >= 0) {
            pfds[n].fd = listen_fd;
            pfds[n].events = POLLIN;
            pfds[n].revents = 0;
            map[n++] = -1;
        }
        for (k = 0; k < MAX_CLIENTS; k++) {
            if (clients[k].fd < 0)
                continue;
            pfds[n].fd = clients[k].fd;
            pfds[n].events = POLLIN;
            pfds[n].revents = 0;
            map[n++] = k;
        }
        r = poll(pfds, (nfds_t)n, 500);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            perror(PROG ": poll");
            rc = 1;
            break;
        }
        for (k = 0; k < n && r > 0; k++) {
            if (pfds[k].revents == 0)
                continue;
            if (map[k] < 0) {
                int cfd = accept4(listen_fd, NULL, NULL,
                                  SOCK_CLOEXEC | SOCK_NONBLOCK);
                int slot;
                if (cfd < 0)
                    continue;
                for (slot = 0; slot < MAX_CLIENTS; slot++)
                    if (clients[slot].fd < 0)
                        break;
                if (slot == MAX_CLIENTS) {
                    static const char msg[] = "err too many clients\n";
                    (void)write_all(cfd, msg, sizeof(msg) - 1);
                    close(cfd);
                    continue;
                }
                clients[slot].fd = cfd;
                clients[slot].len = 0;
            } else {
                struct client *c = &clients[map[k]];
                if (client_readable(&db, c) != 0) {
                    close(c->fd);
                    c->fd = -1;
                }
            }
        }
    }

    for (i = 0; i < MAX_CLIENTS; i++)
        if (clients[i].fd >= 0)
            close(clients[i].fd);

out:
    if (listen_fd >= 0) {
        close(listen_fd);
        unlink(control);
    }
    rd_kafka_mock_cluster_destroy(db.mcluster);
    rd_kafka_destroy(db.rk);
    return rc;
}
