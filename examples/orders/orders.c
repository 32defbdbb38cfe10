/*
 * orders -- the classic order service on the transactional outbox.
 *
 * Placing an order is ONE local transaction on the service's own
 * connection:
 *   1. record the order (a retried request for the same order id is a
 *      no-op: the order is already placed),
 *   2. deduct stock with a conditional UPDATE (... WHERE stock >= qty): no
 *      overselling, even with concurrent orders, without SELECT ... FOR
 *      UPDATE,
 *   3. append the "grant points" event to the outbox (topic order.paid by
 *      default, key = order id, idempotency key = "order-<id>-points").
 * Insufficient stock rolls back all three. A kinbox relay publishes the
 * event after COMMIT; the points consumer (handlers/points) applies it
 * exactly once.
 *
 *   orders URL stock SKU QTY
 *   orders URL place ORDER_ID USER_ID SKU QTY POINTS [TOPIC]
 *
 * URL: postgresql://user@host:port/db or mysql://user:pass@host:port/db.
 * TRACEPARENT in the environment (a W3C traceparent): the event carries
 * it, so the relay's and the consumers' spans join the caller's trace.
 * Exit status: 0 placed (or already placed), 2 insufficient stock, 1 error.
 * Uses only the public kinbox API plus libpq / the MySQL C API.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>
#include <libpq-fe.h>
#include <mysql.h>

typedef struct conn {
        PGconn *pg;
        MYSQL *my;
} conn_t;

/* mysql://user[:pass]@host[:port]/db -- enough for the example. */
static int
my_open(conn_t *c, const char *url)
{
        char buf[512], *user, *pass = NULL, *host, *port = NULL, *db;
        snprintf(buf, sizeof(buf), "%s", url + strlen("mysql://"));
        char *at = strrchr(buf, '@');
        if (!at)
                return -1;
        *at = '\0';
        user = buf;
        host = at + 1;
        if ((pass = strchr(user, ':')))
                *pass++ = '\0';
        if (!(db = strchr(host, '/')))
                return -1;
        *db++ = '\0';
        char *qm = strchr(db, '?');
        if (qm)
                *qm = '\0';
        if ((port = strchr(host, ':')))
                *port++ = '\0';
        c->my = mysql_init(NULL);
        if (!c->my ||
            !mysql_real_connect(c->my, host, user, pass, db,
                                port ? (unsigned)strtoul(port, NULL, 10) : 0,
                                NULL, 0)) {
                fprintf(stderr, "connect: %s\n",
                        c->my ? mysql_error(c->my) : "out of memory");
                return -1;
        }
        return 0;
}

static int
open_conn(conn_t *c, const char *url)
{
        memset(c, 0, sizeof(*c));
        if (!strncmp(url, "mysql://", 8))
                return my_open(c, url);
        c->pg = PQconnectdb(url);
        if (PQstatus(c->pg) != CONNECTION_OK) {
                fprintf(stderr, "connect: %s", PQerrorMessage(c->pg));
                return -1;
        }
        return 0;
}

static void
close_conn(conn_t *c)
{
        if (c->pg)
                PQfinish(c->pg);
        if (c->my)
                mysql_close(c->my);
}

/*
 * Run a statement with text parameters ($1..$n on PostgreSQL; on MySQL the
 * caller passes SQL with the values already escaped). Returns the number of
 * rows affected, -1 on error.
 */
static long long
pg_run(PGconn *pg, const char *sql, int n, const char *const *v)
{
        PGresult *r = PQexecParams(pg, sql, n, NULL, v, NULL, NULL, 0);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
                fprintf(stderr, "%s: %s", sql, PQresultErrorMessage(r));
                PQclear(r);
                return -1;
        }
        long long k = strtoll(PQcmdTuples(r), NULL, 10);
        PQclear(r);
        return k;
}

static long long
my_run(MYSQL *m, const char *sql)
{
        if (mysql_query(m, sql)) {
                fprintf(stderr, "%s: %s\n", sql, mysql_error(m));
                return -1;
        }
        return (long long)mysql_affected_rows(m);
}

/* Quote s for MySQL into out ('...'). */
static void
my_quote(MYSQL *m, char *out, size_t size, const char *s)
{
        size_t n = strlen(s);
        if (2 * n + 3 > size) {
                out[0] = '\0';
                return;
        }
        out[0] = '\'';
        unsigned long k =
            mysql_real_escape_string(m, out + 1, s, (unsigned long)n);
        out[k + 1] = '\'';
        out[k + 2] = '\0';
}

static int
tx(conn_t *c, const char *what)
{
        if (c->pg)
                return pg_run(c->pg, what, 0, NULL) < 0 ? -1 : 0;
        return my_run(c->my, what) < 0 ? -1 : 0;
}

static int
cmd_stock(conn_t *c, const char *sku, const char *qty)
{
        if (c->pg) {
                const char *v[2] = {sku, qty};
                return pg_run(c->pg,
                              "INSERT INTO inventory (sku, stock) VALUES "
                              "($1, $2::integer) ON CONFLICT (sku) DO UPDATE "
                              "SET stock = EXCLUDED.stock",
                              2, v) < 0;
        }
        char q[600], sql[1024];
        my_quote(c->my, q, sizeof(q), sku);
        snprintf(sql, sizeof(sql),
                 "INSERT INTO inventory (sku, stock) VALUES (%s, %d) "
                 "ON DUPLICATE KEY UPDATE stock = VALUES(stock)",
                 q, atoi(qty));
        return my_run(c->my, sql) < 0;
}

/* 0 placed, 3 already placed, 2 insufficient stock, 1 error. */
static int
place(conn_t *c, const char *order_id, long long user_id, const char *sku,
      int qty, int points, const char *topic)
{
        long long k;
        char qty_s[16], uid_s[24], pts_s[16];
        snprintf(qty_s, sizeof(qty_s), "%d", qty);
        snprintf(uid_s, sizeof(uid_s), "%lld", user_id);
        snprintf(pts_s, sizeof(pts_s), "%d", points);

        if (tx(c, "BEGIN"))
                return 1;
        /* 1. The order; a retried request finds it and stops here. */
        if (c->pg) {
                const char *v[5] = {order_id, uid_s, sku, qty_s, pts_s};
                k = pg_run(c->pg,
                           "INSERT INTO orders (order_id, user_id, sku, qty, "
                           "points) VALUES ($1, $2::bigint, $3, $4::integer, "
                           "$5::integer) ON CONFLICT (order_id) DO NOTHING",
                           5, v);
        } else {
                char qo[600], qs[600], sql[1600];
                my_quote(c->my, qo, sizeof(qo), order_id);
                my_quote(c->my, qs, sizeof(qs), sku);
                snprintf(sql, sizeof(sql),
                         "INSERT INTO orders (order_id, user_id, sku, qty, "
                         "points) VALUES (%s, %lld, %s, %d, %d) ON DUPLICATE "
                         "KEY UPDATE order_id = order_id",
                         qo, user_id, qs, qty, points);
                k = my_run(c->my, sql);
        }
        if (k < 0)
                goto fail;
        if (k == 0) {
                tx(c, "ROLLBACK");
                return 3;
        }
        /* 2. Conditional deduction: 0 rows = not enough stock. */
        if (c->pg) {
                const char *v[2] = {sku, qty_s};
                k = pg_run(c->pg,
                           "UPDATE inventory SET stock = stock - $2::integer "
                           "WHERE sku = $1 AND stock >= $2::integer",
                           2, v);
        } else {
                char qs[600], sql[1024];
                my_quote(c->my, qs, sizeof(qs), sku);
                snprintf(sql, sizeof(sql),
                         "UPDATE inventory SET stock = stock - %d "
                         "WHERE sku = %s AND stock >= %d",
                         qty, qs, qty);
                k = my_run(c->my, sql);
        }
        if (k < 0)
                goto fail;
        if (k == 0) {
                tx(c, "ROLLBACK"); /* the order row goes too */
                return 2;
        }
        /* 3. The event, in the same transaction. */
        char payload[512], idem[300];
        int plen = snprintf(payload, sizeof(payload),
                            "{\"order_id\":\"%s\",\"user_id\":%lld,"
                            "\"grant_points\":%d}",
                            order_id, user_id, points);
        snprintf(idem, sizeof(idem), "order-%s-points", order_id);
        /* The caller's trace context, if it has one (TRACEPARENT, the
         * environment carrier of W3C trace context), goes with the event:
         * the consumers downstream continue that trace. */
        kinbox_header_t hdr[2] = {{"event_type", "order.paid", 10}};
        size_t nhdr = 1;
        kinbox_trace_t ctx;
        char tp[KINBOX_TRACEPARENT_LEN + 1];
        const char *env_tp = getenv("TRACEPARENT");
        if (env_tp && !kinbox_trace_parse(env_tp, strlen(env_tp), &ctx))
                kinbox_trace_header(&ctx, tp, &hdr[nhdr++]);
        kinbox_outbox_msg_t m = {.destination = topic,
                                 .idem_key = idem,
                                 .aggregate_id = order_id,
                                 .payload = payload,
                                 .payload_size = (size_t)plen,
                                 .headers = hdr,
                                 .header_count = nhdr};
        char err[512];
        kinbox_err_t rc =
            c->pg ? kinbox_outbox_append_pg(c->pg, &m, NULL, err, sizeof(err))
                  : kinbox_outbox_append_mysql(c->my, &m, NULL, err,
                                               sizeof(err));
        if (rc != KINBOX_OK && rc != KINBOX_ERR_DUPLICATE) {
                fprintf(stderr, "outbox append: %s: %s\n", kinbox_err_name(rc),
                        err);
                goto fail;
        }
        if (tx(c, "COMMIT"))
                return 1; /* outcome unknown: a retry with the same order
                             id is safe */
        return 0;
fail:
        tx(c, "ROLLBACK");
        return 1;
}

static void
usage(void)
{
        fprintf(stderr,
                "usage: orders URL stock SKU QTY\n"
                "       orders URL place ORDER_ID USER_ID SKU QTY POINTS "
                "[TOPIC]\n");
}

int
main(int argc, char **argv)
{
        if (argc < 3) {
                usage();
                return 1;
        }
        conn_t c;
        if (open_conn(&c, argv[1])) {
                close_conn(&c);
                return 1;
        }
        int rc = 1;
        if (!strcmp(argv[2], "stock") && argc == 5) {
                rc = cmd_stock(&c, argv[3], argv[4]);
        } else if (!strcmp(argv[2], "place") && (argc == 8 || argc == 9)) {
                int qty = atoi(argv[6]);
                /* The id goes into a JSON string as is: keep it plain. */
                if (qty <= 0 || !*argv[3] || strlen(argv[3]) > 200 ||
                    strpbrk(argv[3], "\"\\\n\r\t")) {
                        usage();
                } else {
                        rc = place(&c, argv[3], strtoll(argv[4], NULL, 10),
                                   argv[5], qty, atoi(argv[7]),
                                   argc == 9 ? argv[8] : "order.paid");
                        if (rc == 2)
                                fprintf(stderr,
                                        "order %s: insufficient "
                                        "stock of %s\n",
                                        argv[3], argv[5]);
                        else if (rc == 3)
                                rc = 0; /* already placed: idempotent */
                }
        } else {
                usage();
        }
        close_conn(&c);
        return rc;
}
