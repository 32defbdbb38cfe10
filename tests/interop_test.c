/*
 * interop_test.c -- kinbox and Apache Kafka's Java client on one real
 * broker (KT_BROKER=kafka; ctest interop_test@kafka, label kafka). The Java
 * side is tests/java/KinboxInterop.java, run by tests/java/interop on the
 * kafka-clients jars scripts/setup fetched from Maven Central.
 *
 *   interop/same_partition      a Java producer and the relay write the same
 *                               keys: every key on one partition, the one
 *                               Kafka's Java partitioner computes; with
 *                               kafka.partitioner = consistent_random the
 *                               relay keeps librdkafka's old CRC32 mapping
 *   interop/java_reads_relay    a Java consumer reads the relay's output:
 *                               key, value, every stored header and
 *                               message_id byte-exact, per-aggregate order
 *   interop/java_feeds_consumer a Java producer feeds a kinbox consumer:
 *                               re-sends and business duplicates, ids and
 *                               totals exact, offsets committed to the end
 *   interop/cloudevents         the relay in CloudEvents binary mode read by
 *                               Java; a Java CloudEvents producer feeding a
 *                               consumer with message_id = header:ce_id
 */
#include "harness.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../handlers/points/points.h"
#include "db.h"

/* ------------------------------------------------------------ the Java side */

static void
hexenc(const void *p, size_t n, char *out)
{
        static const char d[] = "0123456789abcdef";
        const unsigned char *b = p;
        for (size_t i = 0; i < n; i++) {
                out[2 * i] = d[b[i] >> 4];
                out[2 * i + 1] = d[b[i] & 15];
        }
        out[2 * n] = '\0';
}

/* Append "HEX" of a string (or "-" for NULL) to f. */
static void
put_hex(FILE *f, const void *p, size_t n)
{
        if (!p) {
                fputs("-", f);
                return;
        }
        char *h = malloc(2 * n + 1);
        hexenc(p, n, h);
        fputs(h, f);
        free(h);
}

/* Run tests/java/interop ARGS with stdin from in_path (or /dev/null);
 * returns its stdout, failing the test with its stderr on a non-zero
 * exit. */
static char *java(const char *in_path, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static char *
java(const char *in_path, const char *fmt, ...)
{
        char *args = NULL, *cmd = NULL;
        va_list ap;
        va_start(ap, fmt);
        cr_assert(vasprintf(&args, fmt, ap) >= 0);
        va_end(ap);
        char *out = kt_tmp("java.out"), *err = kt_tmp("java.err");
        cr_assert(asprintf(&cmd, "%s/tests/java/interop %s < %s > %s 2> %s",
                           KINBOX_SOURCE_DIR, args,
                           in_path ? in_path : "/dev/null", out, err) >= 0);
        int st = system(cmd);
        char *o = kt_slurp(out), *e = kt_slurp(err);
        int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        cr_assert(ok, "java %s: exit %d:\n%s", args, st, e ? e : "");
        free(e);
        free(cmd);
        free(args);
        return o ? o : strdup("");
}

/* One record as the Java consumer printed it (hex fields). */
typedef struct jrec {
        int partition;
        long long offset;
        char *key, *value, *headers; /* hex / "-"; headers NAME=HEX,... */
} jrec_t;

typedef struct jrecs {
        jrec_t *v;
        size_t n;
        char *text;
} jrecs_t;

/* Read n records of topic from the beginning with the Java consumer. */
static void
java_consume(const char *topic, size_t n, jrecs_t *out)
{
        out->text = java(NULL, "consume %s %s %zu 60000",
                         kt_env("KINBOX_BOOTSTRAP"), topic, n);
        out->v = calloc(n + 1, sizeof(jrec_t));
        out->n = 0;
        char *save = NULL;
        for (char *l = strtok_r(out->text, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save)) {
                cr_assert(out->n < n + 1, "more records than asked for");
                jrec_t *r = &out->v[out->n++];
                char *f[5], *s2 = NULL;
                int k = 0;
                for (char *t = strtok_r(l, "\t", &s2); t && k < 5;
                     t = strtok_r(NULL, "\t", &s2))
                        f[k++] = t;
                cr_assert(eq(int, k, 5), "bad consumer line");
                r->partition = atoi(f[0]);
                r->offset = atoll(f[1]);
                r->key = f[2];
                r->value = f[3];
                r->headers = f[4];
        }
        cr_assert(eq(sz, out->n, n));
}

static void
jrecs_free(jrecs_t *r)
{
        free(r->v);
        free(r->text);
}

/* The partition Kafka's Java producer picks for each of n keys among
 * parts partitions (KinboxInterop partition-of: the client's own murmur2). */
static void
java_partitions(int parts, char **keys, int n, int *out)
{
        char *args = malloc((size_t)n * 32 + 32);
        size_t o = (size_t)sprintf(args, "partition-of %d", parts);
        for (int i = 0; i < n; i++)
                o += (size_t)sprintf(args + o, " %s", keys[i]);
        char *res = java(NULL, "%s", args);
        char *save = NULL;
        int i = 0;
        for (char *l = strtok_r(res, "\n", &save); l && i < n;
             l = strtok_r(NULL, "\n", &save))
                out[i++] = atoi(l);
        cr_assert(eq(int, i, n));
        free(res);
        free(args);
}

/* librdkafka's consistent_random for a non-empty key: CRC32 (IEEE, zlib's)
 * of the key modulo the partition count. Computed here bit by bit. */
static int
crc32_partition(const char *key, int parts)
{
        uint32_t c = 0xffffffffu;
        for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
                c ^= *p;
                for (int k = 0; k < 8; k++)
                        c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1)));
        }
        return (int)((c ^ 0xffffffffu) % (uint32_t)parts);
}

/* ------------------------------------------------------------ kinbox side */

static void
append(kinbox__db_t *db, const kinbox_outbox_msg_t *m)
{
        char e[512];
        bool down = false;
        struct pg_conn *pg = kinbox__db_pgconn(db, &down);
        kinbox_err_t rc;
        if (pg) {
                rc = kinbox_outbox_append_pg(pg, m, NULL, e, sizeof(e));
        } else {
                struct st_mysql *my = kinbox__db_mysql(db, &down);
                cr_assert(my != NULL, "no database connection");
                rc = kinbox_outbox_append_mysql(my, m, NULL, e, sizeof(e));
        }
        cr_assert(rc == KINBOX_OK, "append %s: %s: %s", m->idem_key,
                  kinbox_err_name(rc), e);
}

static kinbox__db_t *
db_open(const char *url)
{
        char e[512];
        kinbox__db_t *db = kinbox__db_new(url, NULL, e, sizeof(e));
        cr_assert(db != NULL, "%s", e);
        cr_assert(kinbox__db_connect(db) == 0, "%s", db->err.msg);
        return db;
}

/* Run a relay on url (extra settings k1=v1, k2=v2 ... NULL) until every
 * row is sent, then stop it. */
static void
relay_drain(const char *url, long long rows, ...)
{
        kinbox_conf_t *c = kinbox_conf_new();
        kt_set(c, "name", "interop-test");
        kt_set(c, "database.url", url);
        kt_set(c, "kafka.bootstrap.servers", kt_env("KINBOX_BOOTSTRAP"));
        kt_set(c, "relay.poll.ms", "100");
        va_list ap;
        va_start(ap, rows);
        for (const char *k; (k = va_arg(ap, const char *));)
                kt_set(c, k, va_arg(ap, const char *));
        va_end(ap);
        kt_relay_t *t = kt_relay_start(c);
        long long sent = kt_wait_qint(
            url, "SELECT count(*) FROM kinbox_outbox WHERE status = 'sent'",
            rows, 90);
        kt_relay_stop(t);
        cr_assert(eq(i64, sent, rows), "rows sent by the relay");
}

/* The hex of a string. */
static char *
hx(const char *s)
{
        char *h = malloc(2 * strlen(s) + 1);
        hexenc(s, strlen(s), h);
        return h;
}

/* ------------------------------------------------------------ tests */

/*
 * 200 aggregates, 3 rows each, relayed to a topic of 6 partitions, and the
 * same 200 keys produced once each by the Java client: every key's records
 * are on one partition, the one the Java producer chose (it reports it) and
 * the one its partitioner computes. Then a relay with kafka.partitioner =
 * consistent_random on a second topic: each key where CRC32 puts it.
 */
KT_BACKENDS_PARAMS(interop, same_partition)
ParameterizedTest(int *bidx, interop, same_partition, .timeout = 300)
{
        enum { AGGS = 200, ROWS = 3, PARTS = 6 };
        char *url = kt_fresh_db(kt_backend(*bidx));
        char *topic = kt_unique("iop_keys"), *old = kt_unique("iop_crc");
        kt_topic(topic, PARTS);
        kt_topic(old, PARTS);
        char *keys[AGGS];
        kinbox__db_t *db = db_open(url);
        for (int i = 0; i < AGGS; i++) {
                keys[i] = malloc(16);
                snprintf(keys[i], 16, "agg-%03d", i);
                for (int j = 0; j < ROWS; j++) {
                        char idem[32], pay[16];
                        snprintf(idem, sizeof(idem), "%s-%d", keys[i], j);
                        snprintf(pay, sizeof(pay), "%d", j);
                        kinbox_outbox_msg_t m = {.destination = topic,
                                                 .idem_key = idem,
                                                 .aggregate_id = keys[i],
                                                 .payload = pay,
                                                 .payload_size = strlen(pay)};
                        append(db, &m);
                        if (j == 0) {
                                m.destination = old;
                                append(db, &m);
                        }
                }
        }
        kinbox__db_destroy(db);
        relay_drain(url, AGGS * ROWS + AGGS, NULL);

        /* The Java producer: the same keys, value "java". */
        char *in = kt_tmp("java-keys.in");
        FILE *f = fopen(in, "w");
        cr_assert(f != NULL);
        for (int i = 0; i < AGGS; i++) {
                put_hex(f, keys[i], strlen(keys[i]));
                fputs("\t", f);
                put_hex(f, "java", 4);
                fputs("\t-\n", f);
        }
        fclose(f);
        char *jres =
            java(in, "produce %s %s", kt_env("KINBOX_BOOTSTRAP"), topic);
        int jpart[AGGS], calc[AGGS];
        {
                char *save = NULL;
                int i = 0;
                for (char *l = strtok_r(jres, "\n", &save); l && i < AGGS;
                     l = strtok_r(NULL, "\n", &save))
                        jpart[i++] = atoi(l);
                cr_assert(eq(int, i, AGGS));
        }
        free(jres);
        java_partitions(PARTS, keys, AGGS, calc);

        jrecs_t got;
        java_consume(topic, AGGS * ROWS + AGGS, &got);
        int on_java = 0, elsewhere = 0, java_calc_differs = 0;
        for (int i = 0; i < AGGS; i++)
                java_calc_differs += jpart[i] != calc[i];
        for (size_t k = 0; k < got.n; k++) {
                int i = -1;
                for (int a = 0; a < AGGS && i < 0; a++) {
                        char h[32];
                        hexenc(keys[a], strlen(keys[a]), h);
                        if (!strcmp(h, got.v[k].key))
                                i = a;
                }
                cr_assert(i >= 0, "a record with an unknown key %s",
                          got.v[k].key);
                if (got.v[k].partition == jpart[i])
                        on_java++;
                else
                        elsewhere++;
        }
        jrecs_free(&got);
        cr_assert(eq(int, java_calc_differs, 0),
                  "the Java producer's own choice and its partitioner "
                  "differ");
        cr_assert(eq(int, elsewhere, 0),
                  "%d of %d records off their key's Java partition", elsewhere,
                  on_java + elsewhere);
        cr_assert(eq(int, on_java, AGGS *ROWS + AGGS));

        /* The old mapping, kept by configuration. */
        kt_exec(url, "DELETE FROM kinbox_outbox");
        db = db_open(url);
        for (int i = 0; i < AGGS; i++) {
                char idem[32];
                snprintf(idem, sizeof(idem), "%s-crc", keys[i]);
                kinbox_outbox_msg_t m = {.destination = old,
                                         .idem_key = idem,
                                         .aggregate_id = keys[i],
                                         .payload = "c",
                                         .payload_size = 1};
                append(db, &m);
        }
        kinbox__db_destroy(db);
        relay_drain(url, AGGS, "kafka.partitioner", "consistent_random", NULL);
        java_consume(old, 2 * AGGS, &got);
        int moved = 0;
        for (size_t k = 0; k < got.n; k++) {
                int i = -1;
                for (int a = 0; a < AGGS && i < 0; a++) {
                        char h[32];
                        hexenc(keys[a], strlen(keys[a]), h);
                        if (!strcmp(h, got.v[k].key))
                                i = a;
                }
                cr_assert(i >= 0);
                /* The first 200 records: the default (Java's mapping); the
                 * rest: CRC32's. */
                bool crc = !strcmp(got.v[k].value, "63");
                int want = crc ? crc32_partition(keys[i], PARTS) : calc[i];
                cr_assert(eq(int, got.v[k].partition, want),
                          "key %s (%s) on partition %d, expected %d", keys[i],
                          crc ? "consistent_random" : "default",
                          got.v[k].partition, want);
                moved += crc && want != calc[i];
        }
        jrecs_free(&got);
        /* The two mappings really differ (else the test proves nothing). */
        cr_assert(moved > AGGS / 2, "only %d of %d keys differ", moved, AGGS);
        for (int i = 0; i < AGGS; i++)
                free(keys[i]);
}

/*
 * The relay's output read by the Java consumer: 20 aggregates x 10 rows in
 * order, binary payloads with every byte value, stored headers (a null one,
 * a binary one, a repeated name) and a row without an aggregate (null key)
 * and one with a null payload. Every field byte-exact, message_id after the
 * stored headers, each aggregate's rows in order.
 */
KT_BACKENDS_PARAMS(interop, java_reads_relay)
ParameterizedTest(int *bidx, interop, java_reads_relay, .timeout = 300)
{
        enum { AGGS = 20, ROWS = 10, N = AGGS * ROWS + 2 };
        char *url = kt_fresh_db(kt_backend(*bidx));
        char *topic = kt_unique("iop_read");
        kt_topic(topic, 4);
        typedef struct want {
                char key[2 * 16 + 1], value[2 * 300 + 1], headers[1024];
        } want_t;
        want_t *w = calloc(N, sizeof(*w));
        kinbox__db_t *db = db_open(url);
        unsigned char bin[3] = {0x00, 0xff, 0x7f};
        for (int n = 0; n < N; n++) {
                char agg[16], idem[32];
                unsigned char pay[300];
                size_t plen = 0;
                snprintf(agg, sizeof(agg), "acc-%02d", n % AGGS);
                snprintf(idem, sizeof(idem), "ev-%03d", n);
                /* Sequence number within the aggregate, then every byte
                 * value once (NUL included). */
                int seq = n / AGGS;
                pay[plen++] = (unsigned char)seq;
                for (int b = 0; b < 256 && n % 7 == 0; b++)
                        pay[plen++] = (unsigned char)(b + n);
                char trace[40];
                snprintf(trace, sizeof(trace), "t-%d", n);
                kinbox_header_t hs[4] = {
                    {"trace", trace, strlen(trace)},
                    {"bin", bin, sizeof(bin)},
                    {"nil", NULL, 0},
                    {"trace", "again", 5},
                };
                kinbox_outbox_msg_t m = {.destination = topic,
                                         .idem_key = idem,
                                         .aggregate_id = agg,
                                         .payload = pay,
                                         .payload_size = plen,
                                         .headers = hs,
                                         .header_count = 4};
                if (n == N - 2)
                        m.aggregate_id = NULL; /* null key */
                if (n == N - 1) {
                        m.payload = NULL; /* a tombstone */
                        m.payload_size = 0;
                }
                append(db, &m);
                if (m.aggregate_id)
                        hexenc(agg, strlen(agg), w[n].key);
                else
                        strcpy(w[n].key, "-");
                if (m.payload)
                        hexenc(pay, plen, w[n].value);
                else
                        strcpy(w[n].value, "-");
                char h1[80], h2[8], h3[16], id[200], idh[400];
                hexenc(trace, strlen(trace), h1);
                hexenc(bin, sizeof(bin), h2);
                hexenc("again", 5, h3);
                snprintf(id, sizeof(id), "%s:%s", topic, idem);
                hexenc(id, strlen(id), idh);
                /* A null header value: the Java client hands back null,
                 * printed "-". */
                snprintf(w[n].headers, sizeof(w[n].headers),
                         "trace=%s,bin=%s,nil=-,trace=%s,message_id=%s", h1,
                         h2, h3, idh);
        }
        kinbox__db_destroy(db);
        relay_drain(url, N, NULL);
        jrecs_t got;
        java_consume(topic, N, &got);
        int last_seq[AGGS], last_part[AGGS];
        for (int a = 0; a < AGGS; a++)
                last_seq[a] = -1, last_part[a] = -1;
        bool seen[N] = {false};
        /* Records come partition by partition, each in offset order. */
        for (size_t k = 0; k < got.n; k++) {
                jrec_t *r = &got.v[k];
                int n = -1;
                for (int i = 0; i < N && n < 0; i++)
                        if (!seen[i] && !strcmp(w[i].headers, r->headers) &&
                            !strcmp(w[i].key, r->key))
                                n = i;
                cr_assert(n >= 0,
                          "record at %d/%lld matches no row: "
                          "key %s headers %s",
                          r->partition, r->offset, r->key, r->headers);
                seen[n] = true;
                cr_assert(eq(str, r->value, w[n].value),
                          "row %d's value differs", n);
                if (n >= AGGS * ROWS)
                        continue;
                int a = n % AGGS, seq = n / AGGS;
                if (last_part[a] >= 0)
                        cr_assert(eq(int, r->partition, last_part[a]),
                                  "aggregate %d on two partitions", a);
                cr_assert(eq(int, seq, last_seq[a] + 1),
                          "aggregate %d: row %d after %d", a, seq,
                          last_seq[a]);
                last_seq[a] = seq;
                last_part[a] = r->partition;
        }
        for (int a = 0; a < AGGS; a++)
                cr_assert(eq(int, last_seq[a], ROWS - 1));
        jrecs_free(&got);
        free(w);
}

/* Write the Java producer's input for points grants: n events m-<i> (or,
 * with ce, CloudEvents headers and the id in ce_id), key u<user>; every
 * 10th re-sent with the same id under another key; every 20th a business
 * duplicate (new id, same order). Returns the expected total points;
 * *ids, *orders: distinct ids and orders. */
static long long
grants_input(const char *path, int n, bool ce, long long *ids,
             long long *orders)
{
        FILE *f = fopen(path, "w");
        cr_assert(f != NULL);
        long long total = 0;
        *ids = 0;
        *orders = 0;
        for (int i = 0; i < n; i++) {
                int user = i % 97 + 1, pts = i % 13 + 1;
                char key[16], pay[160], id[32];
                snprintf(key, sizeof(key), "u%d", user);
                snprintf(pay, sizeof(pay),
                         "{\"order_id\":\"jo-%d\",\"user_id\":%d,"
                         "\"grant_points\":%d}",
                         i, user, pts);
                total += pts;
                (*orders)++;
                for (int copy = 0; copy < 3; copy++) {
                        if (copy == 1 && i % 10)
                                continue;
                        if (copy == 2 && i % 20)
                                continue;
                        /* copy 1: a re-send (same id); copy 2: a business
                         * duplicate (new id). */
                        snprintf(id, sizeof(id), copy == 2 ? "jb-%d" : "j-%d",
                                 i);
                        if (copy != 1)
                                (*ids)++;
                        const char *k = copy == 1 ? "resend" : key;
                        put_hex(f, k, strlen(k));
                        fputs("\t", f);
                        put_hex(f, pay, strlen(pay));
                        fputs("\t", f);
                        char *hid = hx(id);
                        if (ce) {
                                char *src = hx("/java-orders"),
                                     *ty = hx("com.example.order.rewarded"),
                                     *ct = hx("application/json");
                                fprintf(f,
                                        "ce_specversion=%s,ce_id=%s,"
                                        "ce_source=%s,ce_type=%s,"
                                        "content-type=%s\n",
                                        "312e30", hid, src, ty, ct);
                                free(src);
                                free(ty);
                                free(ct);
                        } else {
                                fprintf(f, "message_id=%s\n", hid);
                        }
                        free(hid);
                }
        }
        fclose(f);
        return total;
}

/* A kinbox points consumer (batch handler, 2 workers) on topic until the
 * inbox holds ids rows, then the totals and offsets. */
static void
consume_grants(const char *url, const char *topic, int parts,
               const char *msgid, long long ids, long long total,
               long long orders)
{
        char *group = kt_unique("iop_g");
        kinbox_conf_t *c = kt_conf(url, "points", group, topic);
        kt_set(c, "workers", "2");
        if (msgid)
                kt_set(c, "message_id", msgid);
        kt_run_t *r =
            kt_run_start(c, NULL, kinbox_points_module.handle_batch, NULL);
        long long got =
            kt_wait_qint(url, "SELECT COUNT(*) FROM kinbox_inbox", ids, 120);
        long long high = kt_high_sum(topic, parts);
        long long committed = 0;
        for (int i = 0; i < 120; i++) {
                committed = kt_committed_sum(group, topic, parts);
                if (committed == high)
                        break;
                usleep(250 * 1000);
        }
        kinbox_consumer_stats_t st;
        kt_run_stop_stats(r, &st);
        cr_assert(eq(i64, got, ids), "message ids in the inbox");
        cr_assert(eq(i64, committed, high), "offsets committed to the end");
        /* One flow row per order: business duplicates absorbed. */
        kt_assert_points(url, total, orders);
        cr_assert(eq(i64,
                     kt_qint(url, "SELECT COUNT(*) FROM "
                                  "kinbox_dead_letter"),
                     0));
}

/*
 * A Java producer (byte-array serializers, UTF-8 strings, the message_id
 * header added the Java way) feeding a kinbox consumer: 3,000 grants, 300
 * re-sends under the same id, 150 business duplicates under new ids.
 */
KT_BACKENDS_PARAMS(interop, java_feeds_consumer)
ParameterizedTest(int *bidx, interop, java_feeds_consumer, .timeout = 300)
{
        char *url = kt_fresh_db(kt_backend(*bidx));
        char *topic = kt_unique("iop_feed");
        kt_topic(topic, 6);
        char *in = kt_tmp("grants.in");
        long long ids, orders;
        long long total = grants_input(in, 3000, false, &ids, &orders);
        free(java(in, "produce %s %s", kt_env("KINBOX_BOOTSTRAP"), topic));
        cr_assert(eq(i64, kt_high_sum(topic, 6), 3000 + 300 + 150));
        consume_grants(url, topic, 6, NULL, ids, total, orders);
}

/*
 * CloudEvents, binary mode, both ways. Out: a relay with
 * relay.cloudevents.source publishes rows whose stored headers set nothing,
 * and one that sets its own ce_type; the Java consumer finds ce_specversion
 * 1.0, ce_id = the message id, ce_source, ce_type (the row's, else the
 * relay's), ce_time (the row's created_at, RFC 3339 UTC) and content-type.
 * In: a Java CloudEvents producer (no message_id header) feeds a consumer
 * with message_id = header:ce_id.
 */
KT_BACKENDS_PARAMS(interop, cloudevents)
ParameterizedTest(int *bidx, interop, cloudevents, .timeout = 300)
{
        char *url = kt_fresh_db(kt_backend(*bidx));
        char *out = kt_unique("iop_ce_out");
        kt_topic(out, 2);
        kinbox__db_t *db = db_open(url);
        time_t before = time(NULL);
        for (int i = 0; i < 10; i++) {
                char idem[16];
                snprintf(idem, sizeof(idem), "ev-%d", i);
                kinbox_header_t own = {"ce_type", "com.example.special", 19};
                kinbox_outbox_msg_t m = {.destination = out,
                                         .idem_key = idem,
                                         .aggregate_id = "acc-1",
                                         .payload = "{}",
                                         .payload_size = 2,
                                         .headers = i == 9 ? &own : NULL,
                                         .header_count = i == 9};
                append(db, &m);
        }
        kinbox__db_destroy(db);
        relay_drain(url, 10, "relay.cloudevents.source", "/points-service",
                    "relay.cloudevents.type", "com.example.points.granted",
                    NULL);
        time_t after = time(NULL);
        jrecs_t got;
        java_consume(out, 10, &got);
        char *src = hx("/points-service"),
             *ty = hx("com.example.points.granted"),
             *sp = hx("com.example.special"), *ct = hx("application/json");
        for (size_t k = 0; k < got.n; k++) {
                const char *h = got.v[k].headers;
                /* ev-N: N from the message id. */
                char *mid = strstr(h, "message_id=");
                cr_assert(mid != NULL, "no message_id: %s", h);
                mid += strlen("message_id=");
                size_t idlen = strcspn(mid, ",");
                char idhex[200];
                snprintf(idhex, sizeof(idhex), "%.*s", (int)idlen, mid);
                char want[2048], tbuf[64];
                char *timeh = strstr(h, "ce_time=");
                cr_assert(timeh != NULL, "no ce_time: %s", h);
                timeh += strlen("ce_time=");
                size_t tl = strcspn(timeh, ",");
                cr_assert(tl / 2 < sizeof(tbuf));
                for (size_t i = 0; i < tl / 2; i++) {
                        unsigned v;
                        sscanf(timeh + 2 * i, "%2x", &v);
                        tbuf[i] = (char)v;
                }
                tbuf[tl / 2] = '\0';
                struct tm tm = {0};
                int ms = -1;
                cr_assert(strptime(tbuf, "%Y-%m-%dT%H:%M:%S", &tm) != NULL &&
                              sscanf(tbuf + 19, ".%3dZ", &ms) == 1 &&
                              strlen(tbuf) == 24,
                          "ce_time %s is not RFC 3339 UTC with milliseconds",
                          tbuf);
                time_t t = timegm(&tm);
                cr_assert(t >= before - 5 && t <= after + 5,
                          "ce_time %s is not the row's created_at", tbuf);
                bool special = strstr(h, sp) != NULL;
                char th[200];
                snprintf(th, sizeof(th), "%.*s", (int)tl, timeh);
                if (special)
                        snprintf(want, sizeof(want),
                                 "ce_type=%s,message_id=%s,ce_specversion="
                                 "312e30,ce_id=%s,ce_source=%s,ce_time=%s,"
                                 "content-type=%s",
                                 sp, idhex, idhex, src, th, ct);
                else
                        snprintf(want, sizeof(want),
                                 "message_id=%s,ce_specversion=312e30,"
                                 "ce_id=%s,ce_source=%s,ce_type=%s,"
                                 "ce_time=%s,content-type=%s",
                                 idhex, idhex, src, ty, th, ct);
                cr_assert(eq(str, (char *)h, want));
        }
        jrecs_free(&got);
        free(src);
        free(ty);
        free(sp);
        free(ct);

        /* In: CloudEvents from Java, the id in ce_id. */
        char *in_topic = kt_unique("iop_ce_in");
        kt_topic(in_topic, 3);
        char *in = kt_tmp("ce-grants.in");
        long long ids, orders;
        long long total = grants_input(in, 1000, true, &ids, &orders);
        free(java(in, "produce %s %s", kt_env("KINBOX_BOOTSTRAP"), in_topic));
        consume_grants(url, in_topic, 3, "header:ce_id", ids, total, orders);
}
