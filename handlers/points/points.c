/*
 * points -- the points-grant handler: one source file, both backends.
 *
 * Payload: {"order_id": "o-1", "user_id": 42, "grant_points": 10}
 * Effect, in the inbox transaction: a user_points_flow row (unique per
 * order and business type) and the points added to user_account (created
 * on the first grant). Malformed JSON or a missing/ill-typed field is a
 * REJECT whose reason names the field.
 *
 * A grant for an order that already has its flow row (a business
 * duplicate: the same order re-sent under a new message id) is "already
 * done": counted as a duplicate, the account is not credited again. The
 * per-message handler claims the order with kinbox_tx_exec_claim() (one
 * CTE on PostgreSQL, a ROW_COUNT()-guarded credit on MySQL); the batch
 * handler claims its orders with kinbox_tx_exec_claims() (one CTE with ON
 * CONFLICT DO NOTHING, PostgreSQL) or looks the orders up first (MySQL),
 * and credits only the rows it inserted.
 *
 * It ships both handler shapes: `handle` (per message, statements pipelined
 * by kinbox) and `handle_batch` (two set-based statements per batch), and
 * uses only the public API.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kinbox/kinbox.h>

#include "points.h"

typedef struct grant {
        char order_id[256];
        long long user_id;
        long long points;
} grant_t;

/* Parse and validate; on failure fill why naming the field. */
static int
parse(const kinbox_msg_t *msg, grant_t *g, char *why, size_t wsz)
{
        size_t len;
        const char *p = kinbox_msg_payload(msg, &len);
        json_error_t jerr;
        json_t *root = p ? json_loadb(p, len, 0, &jerr) : NULL;
        if (!root) {
                snprintf(why, wsz, "payload is not valid JSON: %s",
                         p ? jerr.text : "empty payload");
                return -1;
        }
        int rc = -1;
        json_t *o = json_object_get(root, "order_id");
        json_t *u = json_object_get(root, "user_id");
        json_t *n = json_object_get(root, "grant_points");
        if (!json_is_object(root))
                snprintf(why, wsz, "payload is not a JSON object");
        else if (!json_is_string(o) || !json_string_length(o) ||
                 json_string_length(o) >= sizeof(g->order_id))
                snprintf(why, wsz,
                         "field order_id: missing or not a non-empty string "
                         "(at most 255 bytes)");
        else if (!json_is_integer(u) || json_integer_value(u) <= 0)
                snprintf(why, wsz,
                         "field user_id: missing or not a positive integer");
        else if (!json_is_integer(n) || json_integer_value(n) < 0 ||
                 json_integer_value(n) > 1000000000)
                snprintf(why, wsz,
                         "field grant_points: missing or not an integer in "
                         "[0, 1000000000]");
        else {
                snprintf(g->order_id, sizeof(g->order_id), "%s",
                         json_string_value(o));
                g->user_id = (long long)json_integer_value(u);
                g->points = (long long)json_integer_value(n);
                rc = 0;
        }
        json_decref(root);
        return rc;
}

static kinbox_result_t
points_handle(kinbox_tx_t *tx, const kinbox_msg_t *msg, void *opaque)
{
        (void)opaque;
        grant_t g;
        char why[256];
        if (parse(msg, &g, why, sizeof(why))) {
                kinbox_tx_set_error(tx, "%s", why);
                return KINBOX_RESULT_REJECT;
        }
        char uid[24], pts[24];
        snprintf(uid, sizeof(uid), "%lld", g.user_id);
        snprintf(pts, sizeof(pts), "%lld", g.points);
        const char *flow[3] = {uid, g.order_id, pts};
        /* The flow row's unique key is the business idempotency check: a
         * taken key inserts nothing and credits nothing, and the claim's
         * empty row count counts the message as a business duplicate. */
        if (kinbox_tx_backend(tx) == KINBOX_BACKEND_POSTGRESQL)
                return kinbox_tx_exec_claim(
                           tx,
                           "WITH f AS (INSERT INTO user_points_flow (user_id, "
                           "order_id, biz_type, points_delta) VALUES ($1, $2, "
                           "'ORDER_REWARD', $3) ON CONFLICT (order_id, "
                           "biz_type) DO NOTHING RETURNING user_id, "
                           "points_delta) INSERT INTO user_account (user_id, "
                           "points) SELECT user_id, points_delta FROM f ON "
                           "CONFLICT (user_id) DO UPDATE SET points = "
                           "user_account.points + EXCLUDED.points",
                           3, flow)
                           ? KINBOX_RESULT_RETRY
                           : KINBOX_RESULT_OK;
        const char *acct[2] = {uid, pts};
        if (kinbox_tx_exec_claim(tx,
                                 "INSERT INTO user_points_flow (user_id, "
                                 "order_id, biz_type, points_delta) VALUES "
                                 "($1, $2, 'ORDER_REWARD', $3) ON DUPLICATE "
                                 "KEY UPDATE order_id = order_id",
                                 3, flow) ||
            kinbox_tx_exec(tx,
                           "INSERT INTO user_account (user_id, points) "
                           "SELECT $1, $2 FROM DUAL WHERE ROW_COUNT() > 0 "
                           "ON DUPLICATE KEY UPDATE points = points + "
                           "VALUES(points)",
                           2, acct))
                return KINBOX_RESULT_RETRY;
        return KINBOX_RESULT_OK;
}

/* One account row of a batch; sorted by user, then batch position. */
typedef struct {
        long long user_id, points;
        size_t i;
} acct_row_t;

static int
acct_cmp(const void *a, const void *b)
{
        const acct_row_t *x = a, *y = b;
        if (x->user_id != y->user_id)
                return x->user_id < y->user_id ? -1 : 1;
        return x->i < y->i ? -1 : x->i > y->i;
}

/* Append s as a PostgreSQL array element. */
static void
arr_add(char **buf, size_t *len, size_t *cap, const char *s, int quote)
{
        size_t need = *len + 2 * strlen(s) + 4;
        if (need > *cap) {
                size_t nc = *cap ? *cap : 1024;
                while (nc < need)
                        nc *= 2;
                char *n = realloc(*buf, nc);
                if (!n)
                        return;
                *buf = n;
                *cap = nc;
        }
        char *o = *buf + *len;
        if (*len > 1)
                *o++ = ',';
        if (quote)
                *o++ = '"';
        for (; *s; s++) {
                if (quote && (*s == '"' || *s == '\\'))
                        *o++ = '\\';
                *o++ = *s;
        }
        if (quote)
                *o++ = '"';
        *o = '\0';
        *len = (size_t)(o - *buf);
}

typedef struct sbuf {
        char *p;
        size_t len, cap;
} sbuf_t;

static void
sb_init(sbuf_t *b, const char *start)
{
        b->p = NULL;
        b->len = b->cap = 0;
        size_t n = strlen(start);
        b->cap = 1024;
        b->p = malloc(b->cap);
        if (b->p) {
                memcpy(b->p, start, n + 1);
                b->len = n;
        }
}

static void
sb_add(sbuf_t *b, const char *s)
{
        size_t n = strlen(s);
        if (!b->p)
                return;
        if (b->len + n + 1 > b->cap) {
                size_t nc = b->cap * 2;
                while (nc < b->len + n + 1)
                        nc *= 2;
                char *q = realloc(b->p, nc);
                if (!q) {
                        free(b->p);
                        b->p = NULL;
                        return;
                }
                b->p = q;
                b->cap = nc;
        }
        memcpy(b->p + b->len, s, n + 1);
        b->len += n;
}

/* MySQL string literal for an order id (ids are validated JSON strings). */
static void
sb_add_quoted(sbuf_t *b, const char *s)
{
        sb_add(b, "'");
        char ch[3] = {0};
        for (; *s; s++) {
                if (*s == '\'' || *s == '\\') {
                        ch[0] = '\\';
                        ch[1] = *s;
                } else {
                        ch[0] = *s;
                        ch[1] = 0;
                }
                sb_add(b, ch);
        }
        sb_add(b, "'");
}

/* An order id of the batch and the message it came from. */
typedef struct oref {
        const char *order_id;
        size_t i;
} oref_t;

static int
oref_cmp(const void *a, const void *b)
{
        const oref_t *x = a, *y = b;
        int c = strcmp(x->order_id, y->order_id);
        if (c)
                return c;
        return x->i < y->i ? -1 : x->i > y->i;
}

static int
str_cmp(const void *a, const void *b)
{
        return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * Business duplicates of a MySQL batch: orders[0..n) sorted by (order id,
 * batch position); known[0..nk) the sorted order ids already granted.
 * Every message of a known order is a duplicate; of the other orders the
 * first message is kept and the rest are duplicates.
 */
static void
mark_duplicates(const oref_t *orders, size_t n, char **known, size_t nk,
                kinbox_result_t *results)
{
        for (size_t a = 0; a < n;) {
                size_t b = a + 1;
                while (b < n &&
                       !strcmp(orders[b].order_id, orders[a].order_id))
                        b++;
                const char *key = orders[a].order_id;
                bool found = nk && bsearch(&key, known, nk, sizeof(*known),
                                           str_cmp) != NULL;
                for (size_t k = a; k < b; k++)
                        if (k > a || found)
                                results[orders[k].i] = KINBOX_RESULT_DUPLICATE;
                a = b;
        }
}

/* The column 0 values of rows, sorted (pointers into rows). */
static char **
sorted_values(kinbox_rows_t *rows, size_t *np)
{
        size_t n = kinbox_rows_count(rows);
        char **v = malloc((n ? n : 1) * sizeof(*v));
        if (!v)
                return NULL;
        size_t k = 0;
        for (size_t r = 0; r < n; r++) {
                const char *x = kinbox_rows_value(rows, r, 0, NULL);
                if (x)
                        v[k++] = (char *)x;
        }
        qsort(v, k, sizeof(*v), str_cmp);
        *np = k;
        return v;
}

/* PostgreSQL: one statement inserts the flow rows (a granted order is
 * skipped), credits the summed grants of the rows it inserted and returns
 * their order ids: kinbox counts a message whose order it did not return
 * as a business duplicate, without the handler waiting for the rows. */
static kinbox_result_t
batch_pg(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, const grant_t *g,
         size_t count, const kinbox_result_t *results)
{
        char num[32];
        char *uids = NULL, *oids = NULL, *pts = NULL;
        size_t ul = 0, uc = 0, ol = 0, oc = 0, pl = 0, pc = 0;
        arr_add(&uids, &ul, &uc, "{", 0);
        arr_add(&oids, &ol, &oc, "{", 0);
        arr_add(&pts, &pl, &pc, "{", 0);
        /* Each flow row's owner and order id, in batch order: the order id
         * is the key the statement returns for a row it inserted, and the
         * value a row the server rejects (a CHECK the handler does not
         * know) shows, a hint kinbox narrows the failure with. */
        const kinbox_msg_t **own = malloc((count ? count : 1) * sizeof(*own));
        const char **keys = malloc((count ? count : 1) * sizeof(*keys));
        size_t nrows = 0;
        for (size_t i = 0; own && keys && i < count; i++) {
                if (results[i] != KINBOX_RESULT_OK)
                        continue;
                own[nrows] = msgs[i];
                keys[nrows++] = g[i].order_id;
                snprintf(num, sizeof(num), "%lld", g[i].user_id);
                arr_add(&uids, &ul, &uc, num, 0);
                arr_add(&oids, &ol, &oc, g[i].order_id, 1);
                snprintf(num, sizeof(num), "%lld", g[i].points);
                arr_add(&pts, &pl, &pc, num, 0);
        }
        kinbox_result_t ret = KINBOX_RESULT_RETRY;
        if (!uids || !oids || !pts || !own || !keys)
                goto out;
        strcat(uids, "}");
        strcat(oids, "}");
        strcat(pts, "}");
        const char *p[3] = {uids, oids, pts};
        if (!kinbox_tx_exec_claims(
                tx,
                "WITH f AS (INSERT INTO user_points_flow (user_id, order_id, "
                "biz_type, points_delta) SELECT u, o, 'ORDER_REWARD', p FROM "
                "unnest($1::bigint[], $2::text[], $3::bigint[]) WITH "
                "ORDINALITY AS t(u, o, p, n) ORDER BY n "
                "ON CONFLICT (order_id, biz_type) DO NOTHING "
                "RETURNING user_id, order_id, points_delta), "
                "a AS (INSERT INTO user_account (user_id, points) SELECT "
                "user_id, sum(points_delta) FROM f GROUP BY user_id ORDER BY "
                "user_id ON CONFLICT (user_id) DO UPDATE SET points = "
                "user_account.points + EXCLUDED.points) "
                "SELECT order_id FROM f",
                3, p, own, keys, nrows))
                ret = KINBOX_RESULT_OK;
out:
        free(own);
        free(keys);
        free(uids);
        free(oids);
        free(pts);
        return ret;
}

/* MySQL: the batch's orders already granted, in one query. */
static kinbox_rows_t *
granted_orders(kinbox_tx_t *tx, const oref_t *orders, size_t n)
{
        sbuf_t q;
        sb_init(&q, "SELECT order_id FROM user_points_flow WHERE biz_type "
                    "= 'ORDER_REWARD' AND order_id IN (");
        for (size_t k = 0; k < n; k++) {
                if (k)
                        sb_add(&q, ",");
                sb_add_quoted(&q, orders[k].order_id);
        }
        sb_add(&q, ")");
        kinbox_rows_t *rows = NULL;
        if (!q.p || kinbox_tx_query(tx, q.p, 0, NULL, &rows))
                rows = NULL;
        free(q.p);
        return rows;
}

/* Rows per INSERT of the MySQL batch path: a row the server rejects
 * costs the rows before it in its statement (inserted, then undone), so
 * statements stay short; they still share one round trip. */
#define VALUES_ROWS 64

/* MySQL: look the orders up, insert the new ones' flow rows and credit
 * each grant, one row per message in kinbox_tx_exec_values() statements:
 * a row the server rejects (a CHECK the handler does not know, a twin's
 * unique key inserted meanwhile by another worker) is charged to its own
 * message, whose rows kinbox then takes out of both statements. */
static kinbox_result_t
batch_mysql(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs, const grant_t *g,
            size_t count, kinbox_result_t *results, const oref_t *orders,
            size_t n)
{
        kinbox_rows_t *rows = granted_orders(tx, orders, n);
        if (!rows)
                return KINBOX_RESULT_RETRY;
        size_t nk = 0;
        char **known = sorted_values(rows, &nk);
        if (known)
                mark_duplicates(orders, n, known, nk, results);
        free(known);
        kinbox_rows_destroy(rows);
        if (!known)
                return KINBOX_RESULT_RETRY;
        size_t cap = count ? count : 1;
        char(*uid)[24] = malloc(cap * sizeof(*uid));
        char(*pts)[24] = malloc(cap * sizeof(*pts));
        const char **fp = malloc(3 * cap * sizeof(*fp));
        const char **ap = malloc(2 * cap * sizeof(*ap));
        const kinbox_msg_t **fo = malloc(cap * sizeof(*fo));
        const kinbox_msg_t **ao = malloc(cap * sizeof(*ao));
        /* Credits in user order: two consumers whose batches share users
         * lock the rows in the same order. */
        acct_row_t *ord = malloc(cap * sizeof(*ord));
        kinbox_result_t ret = KINBOX_RESULT_RETRY;
        if (!uid || !pts || !fp || !ap || !fo || !ao || !ord)
                goto out;
        size_t nf = 0;
        for (size_t i = 0; i < count; i++) {
                if (results[i] != KINBOX_RESULT_OK)
                        continue;
                snprintf(uid[i], sizeof(uid[i]), "%lld", g[i].user_id);
                snprintf(pts[i], sizeof(pts[i]), "%lld", g[i].points);
                fp[3 * nf] = uid[i];
                fp[3 * nf + 1] = g[i].order_id;
                fp[3 * nf + 2] = pts[i];
                fo[nf] = msgs[i];
                ord[nf++] = (acct_row_t){g[i].user_id, g[i].points, i};
        }
        qsort(ord, nf, sizeof(*ord), acct_cmp);
        for (size_t k = 0; k < nf; k++) {
                ap[2 * k] = uid[ord[k].i];
                ap[2 * k + 1] = pts[ord[k].i];
                ao[k] = msgs[ord[k].i];
        }
        ret = KINBOX_RESULT_OK;
        for (size_t k = 0; k < nf && ret == KINBOX_RESULT_OK;
             k += VALUES_ROWS) {
                size_t m = nf - k < VALUES_ROWS ? nf - k : VALUES_ROWS;
                if (kinbox_tx_exec_values_unique(
                        tx, NULL,
                        "INSERT INTO user_points_flow (user_id, order_id, "
                        "biz_type, points_delta) VALUES ",
                        "($1, $2, 'ORDER_REWARD', $3)", "", 3, fp + 3 * k,
                        fo + k, m))
                        ret = KINBOX_RESULT_RETRY;
        }
        for (size_t k = 0; k < nf && ret == KINBOX_RESULT_OK;
             k += VALUES_ROWS) {
                size_t m = nf - k < VALUES_ROWS ? nf - k : VALUES_ROWS;
                if (kinbox_tx_exec_values(
                        tx,
                        "INSERT INTO user_account (user_id, points) VALUES ",
                        "($1, $2)",
                        " ON DUPLICATE KEY UPDATE points = points + "
                        "VALUES(points)",
                        2, ap + 2 * k, ao + k, m))
                        ret = KINBOX_RESULT_RETRY;
        }
out:
        free(uid);
        free(pts);
        free(fp);
        free(ap);
        free(fo);
        free(ao);
        free(ord);
        return ret;
}

static kinbox_result_t
points_handle_batch(kinbox_tx_t *tx, const kinbox_msg_t *const *msgs,
                    size_t count, kinbox_result_t *results, void *opaque)
{
        (void)opaque;
        grant_t *g = calloc(count ? count : 1, sizeof(*g));
        oref_t *orders = calloc(count ? count : 1, sizeof(*orders));
        if (!g || !orders) {
                free(g);
                free(orders);
                return KINBOX_RESULT_RETRY;
        }
        if (count == 1) {
                /* kinbox narrows a failing set-based statement down one
                 * message at a time: the per-message statement then needs
                 * no round trip (its claim counts a business duplicate). */
                free(g);
                free(orders);
                kinbox_result_t r = points_handle(tx, msgs[0], opaque);
                if (r == KINBOX_RESULT_REJECT) {
                        results[0] = r;
                        return KINBOX_RESULT_OK;
                }
                return r;
        }
        size_t n = 0;
        char why[256];
        for (size_t i = 0; i < count; i++) {
                if (parse(msgs[i], &g[i], why, sizeof(why))) {
                        results[i] = KINBOX_RESULT_REJECT;
                        kinbox_tx_set_msg_error(tx, msgs[i], "%s", why);
                } else {
                        orders[n++] = (oref_t){g[i].order_id, i};
                }
        }
        kinbox_result_t ret = KINBOX_RESULT_OK;
        if (n && kinbox_tx_backend(tx) == KINBOX_BACKEND_POSTGRESQL) {
                ret = batch_pg(tx, msgs, g, count, results);
        } else if (n) {
                qsort(orders, n, sizeof(*orders), oref_cmp);
                ret = batch_mysql(tx, msgs, g, count, results, orders, n);
        }
        free(orders);
        free(g);
        return ret;
}

static const char schema_pg[] =
    "CREATE TABLE IF NOT EXISTS user_account ("
    " user_id bigint PRIMARY KEY,"
    " points bigint NOT NULL DEFAULT 0,"
    " updated_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE IF NOT EXISTS user_points_flow ("
    " id bigserial PRIMARY KEY,"
    " user_id bigint NOT NULL,"
    " order_id text NOT NULL,"
    " biz_type text NOT NULL,"
    " points_delta bigint NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now(),"
    " UNIQUE (order_id, biz_type));";

static const char schema_mysql[] =
    "CREATE TABLE IF NOT EXISTS user_account ("
    " user_id BIGINT PRIMARY KEY,"
    " points BIGINT NOT NULL DEFAULT 0,"
    " updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
    ") ENGINE = InnoDB;"
    "CREATE TABLE IF NOT EXISTS user_points_flow ("
    " id BIGINT AUTO_INCREMENT PRIMARY KEY,"
    " user_id BIGINT NOT NULL,"
    " order_id VARBINARY(255) NOT NULL,"
    " biz_type VARBINARY(32) NOT NULL,"
    " points_delta BIGINT NOT NULL,"
    " created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
    " UNIQUE KEY user_points_flow_order (order_id, biz_type)"
    ") ENGINE = InnoDB;"
    /* Schema 2: business keys compare byte for byte (no PAD SPACE). */
    "ALTER TABLE user_points_flow MODIFY order_id VARBINARY(255) NOT NULL, "
    "MODIFY biz_type VARBINARY(32) NOT NULL;";

const kinbox_module_t kinbox_points_module = {
    .abi_version = KINBOX_MODULE_ABI_VERSION,
    .name = "points",
    .schema_version = 2,
    .schema_postgresql = schema_pg,
    .schema_mysql = schema_mysql,
    .handle = points_handle,
    .handle_batch = points_handle_batch,
    .checks = kinbox_points_checks,
};

/* The same handler, per message only (for benchmarks and batch.max=1). */
const kinbox_module_t kinbox_points_single_module = {
    .abi_version = KINBOX_MODULE_ABI_VERSION,
    .name = "points-single",
    .schema_version = 2,
    .schema_postgresql = schema_pg,
    .schema_mysql = schema_mysql,
    .handle = points_handle,
    .checks = kinbox_points_checks,
};
