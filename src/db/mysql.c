/*
 * mysql.c -- MySQL / MariaDB backend over the libmysqlclient C API: the
 * ops (begin, exec, exec_values, query, commit, rollback, savepoints,
 * script, the inbox insert), the dialect table and the ops table. The
 * other files are listed in mysql_int.h.
 *
 * Deferral: inside a transaction, exec() does not talk to the server. The
 * statement is rendered (placeholders replaced by escaped literals,
 * mysql_render.c) and appended to a per-transaction queue together with
 * its tag (mysql_trip.c). flush(), query(), commit() and inbox_insert()
 * send the queue -- and their own statement -- as ONE multi-statement
 * round trip. BEGIN is deferred the same way: "START TRANSACTION" is the
 * first queued statement, and a transaction that never queued anything
 * costs no round trip at all.
 */
#include "mysql_int.h"
#include "opsql.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

#include <inttypes.h>

/* Column widths the migration declares; checked before sending so a long
 * id is rejected with a clear message instead of a truncation or 1406. */
#define MY_ID_MAX 255
#define MY_NAME_MAX 200 /* kinbox_inbox.consumer, characters */
#define MY_TOPIC_MAX 249 /* kinbox_inbox.topic, characters */

/* Characters in a UTF-8 string (bytes that do not continue one). */
static size_t
utf8_chars(const char *p)
{
        size_t n = 0;
        for (; *p; p++)
                if (((unsigned char)*p & 0xC0) != 0x80)
                        n++;
        return n;
}

static int
my_begin(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return kinbox__my_down_err(db);
        if (db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: begin inside a transaction");
                return KINBOX_ERR_STATE;
        }
        kinbox__my_q_reset(s);
        s->nsent = s->nran = 0;
        if (db->attr)
                db->attr->rows_queued = false;
        s->tx_sent = false;
        kinbox__my_m_begin(s->merge);
        int rc = kinbox__my_q_append(db, "START TRANSACTION", 17, -1, 1);
        if (rc)
                return rc;
        s->begin_queued = true;
        db->in_tx = true;
        return KINBOX_OK;
}

/* Render sql into s->tmp; reports INVALID with the statement's tag. */
static int
my_render(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
          int tag, int *count)
{
        struct mystate *s = st_get(db);
        char err[200];
        kinbox__buf_reset(&s->tmp);
        if (!sql) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, tag,
                                  "MySQL: NULL statement");
                return KINBOX_ERR_INVALID;
        }
        if (n < 0 || (n > 0 && !p)) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, tag,
                                  "MySQL: bad parameter list");
                return KINBOX_ERR_INVALID;
        }
        int rc = kinbox__my_render(db->native, &s->tmp, sql, n, p, count, err,
                                   sizeof(err));
        if (rc) {
                kinbox__db_seterr(db, rc, "", 0, tag, "MySQL: %s", err);
                return rc;
        }
        if (s->tmp.oom) {
                kinbox__buf_free(&s->tmp);
                kinbox__buf_init(&s->tmp);
                return kinbox__my_oom(db);
        }
        return KINBOX_OK;
}

/* Outside a transaction: run the rendered statement(s) in s->tmp now. */
static int
run_tmp(kinbox__db_t *db, int tag, int count, struct kinbox_rows_s **out)
{
        struct mystate *s = st_get(db);
        int small[16] = {0};
        int *tags = count <= 16 ? small : malloc((size_t)count * sizeof(int));
        if (!tags)
                return kinbox__my_oom(db);
        for (int k = 0; k < count; k++)
                tags[k] = tag;
        int rc = kinbox__my_roundtrip(db, s->tmp.p, s->tmp.len, tags,
                                      (size_t)count, out, false);
        if (tags != small)
                free(tags);
        return rc;
}

static int
my_flush(kinbox__db_t *db)
{
        if (!db->native || !db->impl)
                return kinbox__my_down_err(db);
        return kinbox__my_q_send(db, NULL, false);
}

static int
my_exec(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
        int tag)
{
        struct mystate *s = st_get(db);
        int count = 0, rc;
        if (!db->native || !s)
                return kinbox__my_down_err(db);
        if (db->in_tx && db->coalesce &&
            (rc = kinbox__my_m_try(db, sql, n, p, tag)) != M_NOT_MERGED)
                return rc == M_SEND_NOW ? kinbox__my_q_send(db, NULL, false)
                                        : rc;
        if ((rc = my_render(db, sql, n, p, tag, &count)))
                return rc;
        if (!db->in_tx) /* autocommit: nothing to batch with */
                return run_tmp(db, tag, count, NULL);
        /* Keep each packet well under max_allowed_packet. */
        if (s->ntags && s->q.len + s->tmp.len + 2 > s->flush_at &&
            (rc = kinbox__my_q_send(db, NULL, false)))
                return rc;
        return kinbox__my_q_append(db, s->tmp.p, s->tmp.len, tag, count);
}

/* Render one piece of an exec_values() statement into b: blank pieces
 * are skipped; a piece must not hold a ';'. */
static int
values_piece(kinbox__db_t *db, kinbox__buf_t *b, const char *sql, int n,
             const kinbox__param_t *p, int tag)
{
        if (!sql[strspn(sql, " \t\r\n")])
                return KINBOX_OK;
        char err[200];
        int count = 0;
        int rc = kinbox__my_render(db->native, b, sql, n, p, &count, err,
                                   sizeof(err));
        if (!rc && count != 1)
                rc = KINBOX_ERR_INVALID,
                kinbox__errstr(err, sizeof(err), "a ';' in a values piece");
        if (rc)
                kinbox__db_seterr(db, rc, "", 0, tag, "MySQL: %s", err);
        return rc;
}

/* Render head, the rows and tail into s->tmp and note where the rows are
 * (rm->rs/rl, head_len, tail_off). */
static int
values_render(kinbox__db_t *db, const kinbox__values_t *v, int tag,
              struct rowmap *rm)
{
        struct mystate *s = st_get(db);
        kinbox__buf_t *b = &s->tmp;
        kinbox__buf_reset(b);
        int rc = values_piece(db, b, v->head, 0, NULL, tag);
        rm->head_len = b->len;
        for (size_t r = 0; !rc && r < v->nrows; r++) {
                if (r)
                        kinbox__buf_add(b, ", ", 2);
                rm->rs[r] = b->len;
                rc = values_piece(db, b, v->tuple, v->nper,
                                  v->p + r * (size_t)v->nper, tag);
                rm->rl[r] = b->len - rm->rs[r];
        }
        rm->tail_off = b->len;
        if (!rc)
                rc = values_piece(db, b, v->tail, 0, NULL, tag);
        if (!rc && b->oom)
                rc = kinbox__my_oom(db);
        return rc;
}

/* A query that starts with SELECT (after blanks and an opening '('). */
static bool
is_select(const char *sql)
{
        while (*sql == ' ' || *sql == '\t' || *sql == '\n' || *sql == '\r' ||
               *sql == '(')
                sql++;
        return !strncasecmp(sql, "SELECT", 6) &&
               !isalnum((unsigned char)sql[6]) && sql[6] != '_';
}

/* exec_values(): one multi-row INSERT whose rows keep their owners (never
 * merged); see rm_pin() and rm_drop(). */
static int
my_exec_values(kinbox__db_t *db, const kinbox__values_t *v, int tag)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return kinbox__my_down_err(db);
        struct rowmap rm = {.tag = tag, .n = v->nrows};
        rm.rs = malloc(v->nrows * sizeof(*rm.rs));
        rm.rl = malloc(v->nrows * sizeof(*rm.rl));
        rm.tags = malloc(v->nrows * sizeof(*rm.tags));
        int rc = KINBOX_OK;
        if (!rm.rs || !rm.rl || !rm.tags || !v->nrows) {
                rc = v->nrows ? kinbox__my_oom(db) : KINBOX_ERR_INVALID;
                if (rc == KINBOX_ERR_INVALID)
                        kinbox__db_seterr(db, rc, "", 0, tag,
                                          "MySQL: a values statement "
                                          "without rows");
                goto out;
        }
        if ((rc = values_render(db, v, tag, &rm)))
                goto out;
        if (!db->in_tx) {
                rc = run_tmp(db, tag, 1, NULL);
                goto out;
        }
        if (s->ntags && s->q.len + s->tmp.len + 2 > s->flush_at &&
            (rc = kinbox__my_q_send(db, NULL, false)))
                goto out;
        if (!v->row_tags) { /* no owners to keep: a plain statement */
                rc = kinbox__my_q_append(db, s->tmp.p, s->tmp.len, tag, 1);
                goto out;
        }
        if (kinbox__grow(&s->rmaps, &s->caprmaps, s->nrmaps + 1,
                         sizeof(*s->rmaps))) {
                rc = kinbox__my_oom(db);
                goto out;
        }
        rm.text = malloc(s->tmp.len ? s->tmp.len : 1);
        if (!rm.text) {
                rc = kinbox__my_oom(db);
                goto out;
        }
        memcpy(rm.text, s->tmp.p, s->tmp.len);
        rm.len = s->tmp.len;
        memcpy(rm.tags, v->row_tags, v->nrows * sizeof(*rm.tags));
        s->next_flags = ST_EFF | ST_VALUES;
        if ((rc = kinbox__my_q_append(db, s->tmp.p, s->tmp.len, tag, 1)))
                goto out;
        rm.stmt = s->ntags - 1;
        s->rmaps[s->nrmaps++] = rm;
        if (db->attr)
                db->attr->rows_queued = true;
        return KINBOX_OK;
out:
        kinbox__my_rm_free(&rm);
        return rc;
}

static int
my_query(kinbox__db_t *db, const char *sql, int n, const kinbox__param_t *p,
         int tag, struct kinbox_rows_s **out)
{
        struct mystate *s = st_get(db);
        struct kinbox_rows_s *r = NULL;
        int count = 0, rc;
        if (out)
                *out = NULL;
        if (!db->native || !s)
                return kinbox__my_down_err(db);
        if ((rc = my_render(db, sql, n, p, tag, &count)))
                return rc;
        if (!db->in_tx) {
                rc = run_tmp(db, tag, count, out ? &r : NULL);
        } else {
                /* Queued statements and this one share the round trip. */
                if (s->ntags && s->q.len + s->tmp.len + 2 > s->flush_at &&
                    (rc = kinbox__my_q_send(db, NULL, false)))
                        return rc;
                /* A SELECT changes nothing a dropped row could need
                 * undone (rm_can_drop()). */
                if (is_select(sql))
                        s->next_flags = 0;
                if ((rc = kinbox__my_q_append(db, s->tmp.p, s->tmp.len, tag,
                                              count)))
                        return rc;
                rc = kinbox__my_q_send(db, out ? &r : NULL, false);
        }
        if (rc) {
                kinbox_rows_destroy(r);
                return rc;
        }
        if (out)
                *out = r;
        else
                kinbox_rows_destroy(r);
        return KINBOX_OK;
}

static int
my_commit(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        if (!db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: commit without a transaction");
                return KINBOX_ERR_STATE;
        }
        if (!db->native || !s) {
                /* The connection died earlier: the server rolled back. */
                db->in_tx = false;
                return kinbox__my_down_err(db);
        }
        int rc0 = kinbox__my_m_flush(db);
        if (rc0)
                return rc0;
        if (s->begin_queued && s->ntags == 1) {
                /* Nothing was ever written: nothing to send. */
                kinbox__my_q_reset(s);
                db->in_tx = false;
                return KINBOX_OK;
        }
        int rc = kinbox__my_q_append(db, "COMMIT", 6, -1, 1);
        if (rc)
                return rc;
        rc = kinbox__my_q_send(db, NULL, true);
        if (rc == KINBOX_OK || !db->native) {
                db->in_tx = false;
                if (db->impl)
                        st_get(db)->tx_sent = false;
        }
        return rc;
}

static void
my_rollback(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        db->in_tx = false;
        if (!db->native || !s)
                return;
        bool sent = s->tx_sent;
        kinbox__my_q_reset(s);
        s->nsent = s->nran = 0;
        if (db->attr)
                db->attr->rows_queued = false;
        s->tx_sent = false;
        if (!sent)
                return;
        if (mysql_real_query(db->native, "ROLLBACK", 8)) {
                /* We cannot tell what the session holds now: closing it is
                 * the one sure way to end the transaction. */
                kinbox__my_mark_down(db);
                return;
        }
        MYSQL_RES *res = mysql_store_result(db->native);
        if (res)
                mysql_free_result(res);
}

static int
my_savepoint(kinbox__db_t *db, const char *name)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return kinbox__my_down_err(db);
        char sql[96];
        int n = snprintf(sql, sizeof(sql), "SAVEPOINT %s", name);
        int rc = kinbox__my_q_append(db, sql, (size_t)n, -1, 1);
        if (!rc) {
                /* Rolling back to it before it was sent is a truncation. */
                s->sp_len = s->q.len;
                s->sp_ntags = s->ntags;
                snprintf(s->sp_name, sizeof(s->sp_name), "%s", name);
        }
        return rc;
}

/*
 * A failed statement ends a multi-statement round trip and rolls back only
 * itself (InnoDB), so the transaction is alive: drop what is queued and
 * roll back on the server. When the savepoint itself is still unsent, the
 * queue is cut right after it instead (nothing to undo on the server).
 */
static int
my_rollback_to(kinbox__db_t *db, const char *name)
{
        struct mystate *s = st_get(db);
        if (!db->native || !s)
                return kinbox__my_down_err(db);
        kinbox__my_m_drop(s->merge);
        /* What ran after the savepoint is undone; what ran before it
         * belongs to calls that are over. */
        s->nsent = s->nran = 0;
        if (s->sp_len && s->sp_len <= s->q.len && !strcmp(s->sp_name, name)) {
                s->q.len = s->sp_len;
                s->q.p[s->q.len] = '\0';
                s->ntags = s->sp_ntags;
                kinbox__my_rm_cut(s, s->ntags);
                db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
                return KINBOX_OK;
        }
        int rc = KINBOX_OK;
        if (s->ntags)
                (void)kinbox__my_q_send(db, NULL,
                                        false); /* statements before it */
        if (!db->native)
                return db->err.code ? db->err.code : kinbox__my_down_err(db);
        char sql[96];
        int n = snprintf(sql, sizeof(sql), "ROLLBACK TO SAVEPOINT %s", name);
        if (mysql_real_query(db->native, sql, (unsigned long)n))
                return kinbox__my_fail(db, -1, false, "rollback to savepoint");
        MYSQL_RES *res = mysql_store_result(db->native);
        if (res)
                mysql_free_result(res);
        db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        return rc;
}

static void *
my_native(kinbox__db_t *db)
{
        if (!db->native || !db->impl)
                return NULL;
        if (kinbox__my_q_send(db, NULL, false))
                return NULL;
        return db->native;
}

static int
my_script(kinbox__db_t *db, const char *sql)
{
        if (!db->native || !db->impl)
                return kinbox__my_down_err(db);
        if (db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: script inside a transaction");
                return KINBOX_ERR_STATE;
        }
        MYSQL *m = db->native;
        char what[32];
        int idx = 1;
        if (mysql_real_query(m, sql, (unsigned long)strlen(sql)))
                return kinbox__my_fail(db, -1, false, "statement 1");
        for (;;) {
                MYSQL_RES *res = mysql_store_result(m);
                if (res) {
                        mysql_free_result(res);
                } else if (mysql_field_count(m) != 0) {
                        snprintf(what, sizeof(what), "statement %d", idx);
                        return kinbox__my_fail(db, -1, false, what);
                }
                int st = mysql_next_result(m);
                if (st < 0)
                        break;
                idx++;
                if (st > 0) {
                        snprintf(what, sizeof(what), "statement %d", idx);
                        return kinbox__my_fail(db, -1, false, what);
                }
        }
        return KINBOX_OK;
}

/* 128 random bits as 32 hex digits: the row marker of one inbox_insert. */
static int
make_token(char out[33])
{
        unsigned char r[16];
        size_t got = 0;
        while (got < sizeof(r)) {
                ssize_t k = getrandom(r + got, sizeof(r) - got, 0);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -1;
                }
                got += (size_t)k;
        }
        static const char hx[] = "0123456789abcdef";
        for (size_t i = 0; i < sizeof(r); i++) {
                out[2 * i] = hx[r[i] >> 4];
                out[2 * i + 1] = hx[r[i] & 15];
        }
        out[32] = '\0';
        return 0;
}

/* The ids, the consumer's and the topics' names fit their columns:
 * checked here so that INSERT IGNORE (below) can only ignore duplicates,
 * never truncate a value. */
static int
inbox_check(kinbox__db_t *db, const char *consumer, size_t n,
            const struct kinbox__inbox_row *rows)
{
        for (size_t i = 0; i < n; i++) {
                size_t l = rows[i].id ? strlen(rows[i].id) : 0;
                if (!rows[i].id || l > MY_ID_MAX) {
                        kinbox__db_seterr(
                            db, KINBOX_ERR_INVALID, "", 0, (int)i,
                            "MySQL: message id %s (%zu bytes) at offset "
                            "%lld: the inbox holds at most %d bytes",
                            rows[i].id ? "too long" : "missing", l,
                            (long long)rows[i].offset, MY_ID_MAX);
                        return KINBOX_ERR_INVALID;
                }
        }
        if (utf8_chars(consumer) > MY_NAME_MAX) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1,
                                  "MySQL: consumer name longer than %d "
                                  "characters",
                                  MY_NAME_MAX);
                return KINBOX_ERR_INVALID;
        }
        for (size_t i = 0; i < n; i++)
                if (rows[i].topic &&
                    utf8_chars(rows[i].topic) > MY_TOPIC_MAX) {
                        kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0,
                                          (int)i,
                                          "MySQL: topic name longer than "
                                          "%d characters",
                                          MY_TOPIC_MAX);
                        return KINBOX_ERR_INVALID;
                }
        return KINBOX_OK;
}

/* Render the inbox insert of puts (db/inbox.c) into b; tok is the row
 * marker when the server has no RETURNING. Returns the number of
 * statements. */
static int
inbox_render(kinbox__buf_t *b, MYSQL *m, bool returning, const char *consumer,
             const struct kinbox__inbox_row *rows,
             const kinbox__inbox_put_t *puts, size_t np, const char *tok)
{
        kinbox__buf_reset(b);
        kinbox__buf_adds(b, returning ? "INSERT IGNORE" : "INSERT");
        kinbox__buf_adds(b, " INTO kinbox_inbox (consumer, message_id, "
                            "topic, kafka_partition, kafka_offset, msg_at, "
                            "part_at, shadow, ");
        kinbox__buf_adds(b, returning ? "processed_at) VALUES "
                                      : "tx_token, processed_at) VALUES ");
        for (size_t k = 0; k < np; k++) {
                const struct kinbox__inbox_row *r = &rows[puts[k].row];
                kinbox__buf_adds(b, k ? ",\n(" : "\n(");
                kinbox__my_append_literal(m, b, consumer, strlen(consumer),
                                          false);
                kinbox__buf_add(b, ",", 1);
                /* Binary: message_id is VARBINARY and ids are bytes; a
                 * text literal would go through charset validation. */
                kinbox__my_append_literal(m, b, r->id, strlen(r->id), true);
                kinbox__buf_add(b, ",", 1);
                kinbox__my_append_literal(
                    m, b, r->topic, r->topic ? strlen(r->topic) : 0, false);
                char msg[32], part[32];
                int64_t ms = puts[k].msg_ms;
                kinbox__utc_text(msg, ms / 1000, (int)(ms % 1000));
                kinbox__utc_text(part, puts[k].part_s, -1);
                kinbox__buf_printf(b, ",%ld,%lld,'%s','%s',%d,",
                                   (long)r->partition, (long long)r->offset,
                                   msg, part, puts[k].shadow ? 1 : 0);
                if (!returning)
                        kinbox__buf_printf(b, "'%s',", tok);
                kinbox__buf_adds(b, "CURRENT_TIMESTAMP(6))");
        }
        if (returning) {
                kinbox__buf_adds(b, "\nRETURNING message_id, topic, "
                                    "kafka_partition, kafka_offset, shadow");
                return 1;
        }
        kinbox__buf_adds(b, "\nON DUPLICATE KEY UPDATE message_id "
                            "= message_id;\nSELECT message_id, topic, "
                            "kafka_partition, kafka_offset, shadow "
                            "FROM kinbox_inbox WHERE consumer = ");
        kinbox__my_append_literal(m, b, consumer, strlen(consumer), false);
        kinbox__buf_printf(b, " AND tx_token = '%s'", tok);
        return 2;
}

/*
 * One round trip for the whole batch:
 *
 *   [queued statements;]
 *   INSERT INTO kinbox_inbox (...) VALUES (...), ... , tx_token = T
 *     ON DUPLICATE KEY UPDATE message_id = message_id;
 *   SELECT message_id FROM kinbox_inbox WHERE consumer = C AND tx_token = T
 *
 * A row that already existed keeps its old token (the no-op update does
 * not touch it), and a second occurrence inside the batch hits the row the
 * first one just inserted, so exactly the ids inserted by this call come
 * back, each naming its put (db/inbox.c).
 * Unlike INSERT IGNORE, any other error (bad data, lock wait, deadlock)
 * still fails the statement.
 *
 * MariaDB 10.5+ has RETURNING, which returns only the rows an INSERT
 * IGNORE really inserted: one statement, no token to write or index.
 * IGNORE would also turn a too-long value into a truncated one, so every
 * value is checked against its column first; the ints and timestamps
 * cannot fail, and lock waits and deadlocks are never ignored.
 */
static int
my_inbox_insert(kinbox__db_t *db, const char *consumer, size_t n,
                const struct kinbox__inbox_row *rows, bool *is_new)
{
        struct mystate *s = st_get(db);
        MYSQL *m = db->native;
        char tok[33];
        int rc;

        for (size_t i = 0; i < n; i++)
                is_new[i] = false;
        if (!m || !s)
                return kinbox__my_down_err(db);
        if (!db->in_tx) {
                kinbox__db_seterr(db, KINBOX_ERR_STATE, "", 0, -1,
                                  "MySQL: inbox insert outside a transaction");
                return KINBOX_ERR_STATE;
        }
        if (n == 0)
                return KINBOX_OK;
        if ((rc = inbox_check(db, consumer, n, rows)))
                return rc;
        if (!s->returning && make_token(tok)) {
                kinbox__db_seterr(db, KINBOX_ERR_DB, "", 0, -1,
                                  "MySQL: getrandom failed: %s",
                                  strerror(errno));
                return KINBOX_ERR_DB;
        }

        size_t np = 0;
        kinbox__idref_t *ix = kinbox__inbox_sorted(rows, n);
        kinbox__inbox_put_t *puts =
            ix ? kinbox__inbox_puts(db, rows, ix, n, &np) : NULL;
        if (!puts) {
                free(ix);
                return kinbox__my_oom(db);
        }
        kinbox__buf_t *b = &s->tmp;
        int nstmts =
            inbox_render(b, m, s->returning, consumer, rows, puts, np, tok);
        struct kinbox_rows_s *r = NULL;
        if (b->oom) {
                kinbox__buf_free(b);
                kinbox__buf_init(b);
                rc = kinbox__my_oom(db);
                goto out;
        }
        if (s->ntags && s->q.len + b->len + 2 > s->flush_at &&
            (rc = kinbox__my_q_send(db, NULL, false)))
                goto out;
        if ((rc = kinbox__my_q_append(db, b->p, b->len, -1, nstmts)) ||
            (rc = kinbox__my_q_send(db, &r, false)))
                goto out;
        for (size_t k = 0; k < r->nrows; k++)
                kinbox__inbox_put_back(
                    puts, np, rows,
                    (const char *const *)&r->values[k * (size_t)r->ncols]);
        kinbox__inbox_puts_fold(puts, np, ix, n, is_new);
        rc = kinbox__inbox_undo(db, consumer, rows, puts, np);
out:
        free(puts);
        free(ix);
        kinbox_rows_destroy(r);
        return rc;
}

/*
 * Dialect. outbox_append: MySQL has no RETURNING, so the statement is two
 * statements sent together through query(): the insert, whose affected-
 * row count is 1 for a new row and 0 for a duplicate left untouched by
 * "id = id" (kinbox never sets CLIENT_FOUND_ROWS, which would report 1),
 * then a SELECT that returns LAST_INSERT_ID() only when ROW_COUNT() says a
 * row was inserted. So, as on PostgreSQL: one row (the id) when new, no
 * row for a duplicate. On a caller's own MYSQL * without multi-statements,
 * send the two parts separately in the same session (the SELECT must come
 * directly after the INSERT), or read mysql_affected_rows() == 1 and
 * mysql_insert_id() after the INSERT alone.
 */
static const struct kinbox__sql my_sql = {
    /* The identity first: MariaDB assigns left to right, each assignment
     * seeing the ones before it. */
    .offsets_upsert =
        "INSERT INTO kinbox_offsets (consumer, topic, kafka_partition, "
        "next_offset, last_ts, last_hash, updated_at) VALUES ($1, $2, $3, "
        "$4, $5, $6, CURRENT_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE "
        "last_ts = IF(VALUES(next_offset) >= next_offset, "
        "VALUES(last_ts), last_ts), "
        "last_hash = IF(VALUES(next_offset) >= next_offset, "
        "VALUES(last_hash), last_hash), "
        "next_offset = GREATEST(next_offset, VALUES(next_offset)), "
        "updated_at = CURRENT_TIMESTAMP(6)",
    .dead_letter_insert =
        "INSERT INTO kinbox_dead_letter (consumer, message_id, topic, "
        "kafka_partition, kafka_offset, msg_key, headers, payload, error, "
        "attempts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    .outbox_append =
        "INSERT INTO kinbox_outbox (kind, destination, idem_key, "
        "aggregate_id, payload, headers, max_attempts) VALUES ($1, $2, "
        "$3, $4, $5, $6, $7) ON DUPLICATE KEY UPDATE id = id;\n"
        "SELECT LAST_INSERT_ID() AS id FROM DUAL WHERE ROW_COUNT() = 1",
    .try_lock = "SELECT GET_LOCK($1, 0)",
    .unlock = "SELECT RELEASE_LOCK($1)",
    /* GET_LOCK names are the server's: this database's own. */
    .lock_wait = "SELECT GET_LOCK(CONCAT(DATABASE(), '.', $1), 600)",
    .range_count = "SELECT count(*) FROM %s PARTITION (%s)",
    .migrations_table =
        "CREATE TABLE IF NOT EXISTS kinbox_schema_migrations ("
        " component VARCHAR(200) NOT NULL, version INT NOT NULL,"
        " name VARCHAR(200) NOT NULL,"
        " applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),"
        " PRIMARY KEY (component, version)) ENGINE = InnoDB",
    .migrations_exists =
        "SELECT COUNT(*) FROM information_schema.tables WHERE "
        "table_schema = DATABASE() AND "
        "table_name = 'kinbox_schema_migrations'",
    .script_begin = "",
    .script_commit = "",
    /* INTERVAL in microseconds keeps sub-second ages exact. */
    .prune_count =
        {"SELECT count(*) FROM kinbox_inbox WHERE processed_at < "
         "CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND",
         "SELECT count(*) FROM kinbox_outbox WHERE status = 'sent' AND "
         "sent_at < CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND",
         "SELECT count(*) FROM kinbox_outbox WHERE kind = 'event' AND "
         "status <> 'dead' AND created_at < CURRENT_TIMESTAMP(6) - "
         "INTERVAL %" PRId64 " MICROSECOND"},
    .prune_delete =
        {"DELETE FROM kinbox_inbox WHERE processed_at < "
         "CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND ORDER "
         "BY processed_at LIMIT %" PRId64,
         "DELETE FROM kinbox_outbox WHERE status = 'sent' AND sent_at < "
         "CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64 " MICROSECOND ORDER "
         "BY sent_at LIMIT %" PRId64,
         /* kinbox_outbox_created_at (migration 0013) finds the oldest
          * rows first. */
         "DELETE FROM kinbox_outbox WHERE kind = 'event' AND status <> "
         "'dead' AND created_at < CURRENT_TIMESTAMP(6) - INTERVAL %" PRId64
         " MICROSECOND ORDER BY created_at LIMIT %" PRId64},
    .prune_age_scale = 1000,
    .dead_letter_lock = "SELECT consumer, message_id, topic, kafka_partition, "
                        "kafka_offset, msg_key, headers, payload, status FROM "
                        "kinbox_dead_letter WHERE id = $1 FOR UPDATE",
    .inbox_insert_one =
        "INSERT INTO kinbox_inbox (consumer, message_id, topic, "
        "kafka_partition, kafka_offset, part_at) VALUES ($1, $2, $3, $4, "
        "$5, TIMESTAMP '1970-01-01 00:00:00' + INTERVAL $6 SECOND)",
    .inbox_undo =
        "DELETE FROM kinbox_inbox WHERE consumer = $1 AND message_id = $2 "
        "AND part_at = TIMESTAMP '1970-01-01 00:00:00' + INTERVAL $3 SECOND "
        "AND topic = $4 AND kafka_partition = $5 AND kafka_offset = $6",
    .dead_letter_replayed =
        "UPDATE kinbox_dead_letter SET status = 'replayed' WHERE id = $1",
    .outbox_gauges =
        "SELECT destination, SUM(status = 'pending' AND (kind = 'action'"
        " OR $1 = 0)),"
        " COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN status ="
        " 'pending' AND (kind = 'action' OR $1 = 0) THEN created_at END),"
        " CURRENT_TIMESTAMP(6)) / 1000000, 0), SUM(status = 'dead')"
        " FROM kinbox_outbox WHERE status IN ('pending', 'dead')"
        " GROUP BY destination",
    .outbox_pause =
        "INSERT INTO kinbox_outbox_paused (destination) VALUES ($1) ON "
        "DUPLICATE KEY UPDATE destination = destination",
    .outbox_wake = NULL,
    .outbox_summary =
        "SELECT destination, SUM(status = 'pending' AND (kind = 'action'"
        " OR $1 = 0)),"
        " COALESCE(TIMESTAMPDIFF(SECOND, MIN(CASE WHEN status ="
        " 'pending' AND (kind = 'action' OR $1 = 0) THEN created_at END),"
        " CURRENT_TIMESTAMP(6)), 0),"
        " SUM(status = 'dead'),"
        " SUM(status = 'sent' AND sent_at >= CURRENT_TIMESTAMP(6) -"
        "  INTERVAL 1 HOUR),"
        " EXISTS (SELECT 1 FROM kinbox_outbox_paused z"
        "  WHERE z.destination = o.destination)"
        " FROM kinbox_outbox o GROUP BY destination ORDER BY destination",
    .outbox_stuck =
        "SELECT destination, count(*), min(id),"
        " TIMESTAMPDIFF(SECOND, min(created_at), CURRENT_TIMESTAMP(6))"
        " FROM kinbox_outbox WHERE status = 'pending' AND created_at <"
        " CURRENT_TIMESTAMP(6) - INTERVAL ($1 * 1000) MICROSECOND"
        " AND (kind = 'action' OR $2 = 0)"
        " GROUP BY destination ORDER BY destination",
    .counters_put =
        "INSERT INTO kinbox_consumer_counters (consumer, instance,"
        " duplicates, business_duplicates, updated_at) VALUES ($1, $2,"
        " $3, $4, CURRENT_TIMESTAMP(6)) ON DUPLICATE KEY UPDATE"
        " duplicates = VALUES(duplicates),"
        " business_duplicates = VALUES(business_duplicates),"
        " updated_at = CURRENT_TIMESTAMP(6)",
    .counters_remove =
        "DELETE FROM kinbox_consumer_counters WHERE consumer = $1 AND"
        " (instance = $2 OR updated_at < CURRENT_TIMESTAMP(6) -"
        " INTERVAL 1 HOUR)",
    .counters_read =
        "SELECT COUNT(*), COALESCE(SUM(duplicates), 0),"
        " COALESCE(SUM(business_duplicates), 0)"
        " FROM kinbox_consumer_counters WHERE consumer = $1"
        " AND updated_at > CURRENT_TIMESTAMP(6) - INTERVAL 150 SECOND",
    .dead_letter_gauges =
        "SELECT consumer, COUNT(*), TIMESTAMPDIFF(MICROSECOND, "
        "MIN(dead_at), CURRENT_TIMESTAMP(6)) / 1000000 FROM "
        "kinbox_dead_letter WHERE status = 'dead' GROUP BY consumer",
    .hold_upsert =
        "INSERT INTO kinbox_hold (consumer, topic, kafka_partition, "
        "hold_key, blocker_id) SELECT $1, $2, $3, $4, MAX(id) FROM "
        "kinbox_dead_letter WHERE consumer = $1 AND topic = $2 AND "
        "kafka_partition = $3 AND kafka_offset = $5 ON DUPLICATE KEY "
        "UPDATE blocker_id = kinbox_hold.blocker_id",
    .parked_delete = "DELETE FROM kinbox_parked WHERE id = $1",
    .hold_gauges =
        "SELECT consumer, SUM(parked), SUM(held), MAX(age) FROM ("
        " SELECT consumer, COUNT(*) AS parked, 0 AS held,"
        "  TIMESTAMPDIFF(MICROSECOND, MIN(parked_at), CURRENT_TIMESTAMP(6))"
        "  / 1000000 AS age FROM kinbox_parked GROUP BY consumer"
        " UNION ALL SELECT consumer, 0, COUNT(*), 0 FROM kinbox_hold"
        "  GROUP BY consumer) x GROUP BY consumer",
    KINBOX__OPSQL,
    .console_timeout = "SET SESSION max_statement_time = 5",
};

const struct kinbox__db_ops kinbox__mysql_ops = {
    .name = "mysql",
    .backend = KINBOX_BACKEND_MYSQL,
    .connect = kinbox__my_connect,
    .disconnect = kinbox__my_disconnect,
    .begin = my_begin,
    .exec = my_exec,
    .exec_values = my_exec_values,
    .query = my_query,
    .flush = my_flush,
    .commit = my_commit,
    .rollback = my_rollback,
    .savepoint = my_savepoint,
    .rollback_to = my_rollback_to,
    .native = my_native,
    .script = my_script,
    .inbox_insert = my_inbox_insert,
    .sql = &my_sql,
    .outbox = &kinbox__mysql_outbox_ops,
    .part = &kinbox__mysql_part,
    .opart = &kinbox__mysql_opart,
};
