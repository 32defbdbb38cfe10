/*
 * kinbox-points-producer -- produce points-grant events for demos and
 * benchmarks, with re-sent duplicates mixed in, and write the balances a
 * correct consumer must end with.
 *
 * usage: kinbox-points-producer -b BOOTSTRAP -t TOPIC -n COUNT
 *            [-d DUP_PERCENT] [-u USERS] [-s START] [-e EXPECTED_FILE]
 *            [-B BAD_COUNT] [-K] [-z BIZDUP_PERMILLE] [-p POISON_PERMILLE]
 *            [-I MAX_IN_FLIGHT]
 *
 * Message i has header message_id = m-<i>, key = user, payload
 * {"order_id":"o-<i>","user_id":U,"grant_points":P}. DUP_PERCENT % of the
 * messages are sent a second time with the same id: by default with
 * another key (so another partition and offset: the hard case, two
 * consumers may see the two copies at once); with -K with the same key
 * (the same partition, later offset: what a producer retry or an outbox
 * relay's re-publish looks like). BAD_COUNT malformed messages are added
 * (they must end in the dead-letter table). EXPECTED_FILE gets one
 * "user_id points" line per user, sorted by user id as text.
 *
 * -z: that many per mille of the events are followed by a *business
 * duplicate*: a new message id (bd-<i>) carrying the order of an event
 * shortly before it, with that event's user as key (the same partition,
 * behind the original): a correct consumer grants the order once.
 * -p: that many per mille of the events are *poison* (message id px-<i>,
 * order px-<i>): a grant of 5,000,000 points, which the handler accepts
 * and a `CHECK (points_delta <= 1000000)` on user_points_flow (added by
 * bench/run) rejects in SQL; they must end in the dead-letter table.
 * -I: max.in.flight.requests.per.connection (librdkafka's default: 5).
 * scripts/chaos passes 1: the dev broker (librdkafka's mock cluster) does
 * not check an idempotent producer's sequence numbers, so with a request
 * failing under injected errors while a later one of the same partition
 * succeeds, librdkafka takes the failed one's messages as written
 * (implicitly acknowledged) although the mock never stored them. A real
 * broker rejects the later request (OUT_OF_ORDER_SEQUENCE_NUMBER).
 */
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void
produce(rd_kafka_t *rk, const char *topic, const char *key,
        const char *payload, const char *id)
{
        rd_kafka_headers_t *h = rd_kafka_headers_new(1);
        if (id)
                rd_kafka_header_add(h, "message_id", -1, id, -1);
        for (;;) {
                rd_kafka_resp_err_t e = rd_kafka_producev(
                    rk, RD_KAFKA_V_TOPIC(topic),
                    RD_KAFKA_V_KEY(key, strlen(key)),
                    RD_KAFKA_V_VALUE((void *)payload, strlen(payload)),
                    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                    RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
                if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
                        rd_kafka_poll(rk, 20);
                        continue;
                }
                if (e) {
                        fprintf(stderr, "produce: %s\n", rd_kafka_err2str(e));
                        exit(1);
                }
                break;
        }
        rd_kafka_poll(rk, 0);
}

static int delivery_errors;

static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        (void)rk;
        (void)opaque;
        if (m->err)
                delivery_errors++;
}

/* An idempotent producer for bootstrap, or NULL (reason on stderr). */
static rd_kafka_t *
producer_new(const char *bootstrap, const char *in_flight)
{
        char err[256];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        if (rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err,
                              sizeof(err)) ||
            rd_kafka_conf_set(conf, "enable.idempotence", "true", err,
                              sizeof(err)) ||
            rd_kafka_conf_set(conf, "linger.ms", "10", err, sizeof(err)) ||
            (in_flight &&
             rd_kafka_conf_set(conf, "max.in.flight.requests.per.connection",
                               in_flight, err, sizeof(err)))) {
                fprintf(stderr, "%s\n", err);
                rd_kafka_conf_destroy(conf);
                return NULL;
        }
        rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);
        rd_kafka_t *rk =
            rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
        if (!rk) {
                fprintf(stderr, "%s\n", err);
                return NULL;
        }
        return rk;
}

/* "user_id points" per user with a balance, for the audit. */
static int
write_expected(const char *expected, const long long *bal, long users)
{

        FILE *fp = fopen(expected, "w");
        if (!fp) {
                perror(expected);
                return 1;
        }
        for (long u = 1; u <= users; u++)
                if (bal[u])
                        fprintf(fp, "%ld %lld\n", u, bal[u]);
        fclose(fp);
        return 0;
}

/* The command line. */
typedef struct opts {
        const char *bootstrap, *topic, *expected, *in_flight;
        long n, dup, users, start, bad, biz, poison;
        int same_key;
} opts_t;

static void
usage(FILE *fp, const char *argv0)
{
        fprintf(fp,
                "usage: %s -b BOOTSTRAP -t TOPIC -n COUNT [-d DUP_PERCENT] "
                "[-u USERS] [-s START] [-e EXPECTED_FILE] [-B BAD_COUNT] "
                "[-K] [-z BIZDUP_PERMILLE] [-p POISON_PERMILLE] "
                "[-I MAX_IN_FLIGHT]\n",
                argv0);
        if (fp != stdout)
                return;
        fputs("Produce COUNT points grants (header message_id = m-<i>, key = "
              "user,\npayload {\"order_id\":\"o-<i>\",\"user_id\":U,"
              "\"grant_points\":P}) to TOPIC.\n"
              "  -d  percent of the messages sent twice with the same id\n"
              "  -K  the re-sends with the same key (same partition)\n"
              "  -u  number of users (default 100)\n"
              "  -s  first message number\n"
              "  -e  write the expected \"user_id points\" lines to this "
              "file\n"
              "  -B  malformed messages to add (they end as dead letters)\n"
              "  -z  per mille of business duplicates (new id, same order)\n"
              "  -p  per mille of poison grants (rejected by a CHECK)\n"
              "  -I  max.in.flight.requests.per.connection\n"
              "  -h, --help  this help\n",
              fp);
}

/* Parse argv into o. Returns -1 to go on, else the exit status. */
static int
parse_args(int argc, char **argv, opts_t *o)
{
        *o = (opts_t){.users = 100};
        for (int i = 1; i < argc; i++)
                if (!strcmp(argv[i], "--help")) {
                        usage(stdout, argv[0]);
                        return 0;
                }
        int ch;
        while ((ch = getopt(argc, argv, "b:t:n:d:u:s:e:B:Kz:p:I:h")) != -1) {
                switch (ch) {
                case 'b':
                        o->bootstrap = optarg;
                        break;
                case 't':
                        o->topic = optarg;
                        break;
                case 'n':
                        o->n = strtol(optarg, NULL, 10);
                        break;
                case 'd':
                        o->dup = strtol(optarg, NULL, 10);
                        break;
                case 'u':
                        o->users = strtol(optarg, NULL, 10);
                        break;
                case 's':
                        o->start = strtol(optarg, NULL, 10);
                        break;
                case 'e':
                        o->expected = optarg;
                        break;
                case 'B':
                        o->bad = strtol(optarg, NULL, 10);
                        break;
                case 'K':
                        o->same_key = 1;
                        break;
                case 'z':
                        o->biz = strtol(optarg, NULL, 10);
                        break;
                case 'p':
                        o->poison = strtol(optarg, NULL, 10);
                        break;
                case 'I':
                        o->in_flight = optarg;
                        break;
                default:
                        usage(ch == 'h' ? stdout : stderr, argv[0]);
                        return ch == 'h' ? 0 : 2;
                }
        }
        if (!o->bootstrap || !o->topic || o->n <= 0 || o->users <= 0 ||
            o->dup < 0 || o->dup > 100) {
                fprintf(stderr, "%s: -b, -t and -n are required (see -h)\n",
                        argv[0]);
                return 2;
        }
        return -1;
}

int
main(int argc, char **argv)
{
        opts_t o;
        int st = parse_args(argc, argv, &o);
        if (st >= 0)
                return st;
        const char *topic = o.topic;
        long n = o.n, dup = o.dup, users = o.users, start = o.start,
             bad = o.bad, biz = o.biz, poison = o.poison;
        int same_key = o.same_key;
        rd_kafka_t *rk = producer_new(o.bootstrap, o.in_flight);
        if (!rk)
                return 1;
        long long *bal = calloc((size_t)users + 1, sizeof(*bal));
        char key[32], id[32], payload[200];
        long dups = 0, bizdups = 0, poisons = 0;
        for (long i = start; i < start + n; i++) {
                long user = i % users + 1, pts = i % 13 + 1;
                snprintf(key, sizeof(key), "u%ld", user);
                snprintf(id, sizeof(id), "m-%ld", i);
                snprintf(payload, sizeof(payload),
                         "{\"order_id\":\"o-%ld\",\"user_id\":%ld,"
                         "\"grant_points\":%ld}",
                         i, user, pts);
                produce(rk, topic, key, payload, id);
                bal[user] += pts;
                if (dup && (i * 7919) % 100 < dup) {
                        if (!same_key)
                                snprintf(key, sizeof(key), "resend-%ld", i);
                        produce(rk, topic, key, payload, id);
                        dups++;
                }
                if (biz && (i * 104729) % 1000 < biz) {
                        long j = i - (i * 31) % 7; /* an order just before */
                        if (j < start)
                                j = i;
                        long ju = j % users + 1;
                        snprintf(key, sizeof(key), "u%ld", ju);
                        snprintf(id, sizeof(id), "bd-%ld", i);
                        snprintf(payload, sizeof(payload),
                                 "{\"order_id\":\"o-%ld\",\"user_id\":%ld,"
                                 "\"grant_points\":%ld}",
                                 j, ju, j % 13 + 1);
                        produce(rk, topic, key, payload, id);
                        bizdups++;
                }
                if (poison && (i * 7907) % 1000 < poison) {
                        snprintf(id, sizeof(id), "px-%ld", i);
                        snprintf(payload, sizeof(payload),
                                 "{\"order_id\":\"px-%ld\",\"user_id\":%ld,"
                                 "\"grant_points\":5000000}",
                                 i, user);
                        snprintf(key, sizeof(key), "u%ld", user);
                        produce(rk, topic, key, payload, id);
                        poisons++;
                }
        }
        for (long i = 0; i < bad; i++) {
                snprintf(id, sizeof(id), "bad-%ld", start + i);
                produce(rk, topic, "bad",
                        i % 2 ? "{\"order_id\":\"x\",\"user_id\":\"seven\"}"
                              : "this is not JSON",
                        id);
        }
        /* Wait as long as librdkafka may keep a message (message.timeout.ms,
         * 300 s by default): a full cluster restart can take a while. */
        if (rd_kafka_flush(rk, 310000) || delivery_errors) {
                fprintf(stderr, "delivery failed (%d errors)\n",
                        delivery_errors);
                return 1;
        }
        rd_kafka_destroy(rk);
        if (o.expected && write_expected(o.expected, bal, users))
                return 1;
        free(bal);
        printf("produced %ld events, %ld re-sent duplicates, %ld business "
               "duplicates, %ld poison, %ld malformed to %s\n",
               n, dups, bizdups, poisons, bad, topic);
        return 0;
}
