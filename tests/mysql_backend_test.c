/*
 * mysql_backend_test.c -- the MySQL/MariaDB backend (src/db/mysql.c)
 * against a live server.
 *
 * The server comes from KINBOX_MYSQL_URL (mysql://user:pw@host:port/db, the
 * user may create databases). Unset or unreachable is a failure, not a
 * skip: a green run must mean the backend was exercised. Every test works
 * in a database of its own, dropped at the end.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "internal.h"

#include <mysql.h>

#ifndef KINBOX_SOURCE_DIR
/* The test is compiled from <src>/tests/, so __FILE__ locates the tree. */
#define KINBOX_SOURCE_DIR NULL
#endif

static kinbox__db_t *g_admin; /* creates and drops the test database */
static char g_dbname[64];
static char g_url[1024];

#define OK_OR_FAIL(db, expr)                                                  \
        do {                                                                  \
                int rc_ = (expr);                                             \
                cr_assert(eq(int, rc_, KINBOX_OK), "%s -> %d: %s", #expr,     \
                          rc_, (db)->err.msg);                                \
        } while (0)

static void
url_add_enc(char *out, size_t cap, const char *s)
{
        size_t l = strlen(out);
        for (; *s && l + 4 < cap; s++) {
                unsigned char c = (unsigned char)*s;
                if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.')
                        out[l++] = (char)c;
                else
                        l += (size_t)snprintf(out + l, cap - l, "%%%02X", c);
        }
        out[l] = '\0';
}

static kinbox__db_t *
open_url(const char *url)
{
        char err[256] = "";
        kinbox__db_t *db = kinbox__db_new(url, NULL, err, sizeof(err));
        cr_assert(db != NULL, "db_new: %s", err);
        cr_assert(eq(int, (int)db->backend, (int)KINBOX_BACKEND_MYSQL));
        int rc = db->ops->connect(db);
        cr_assert(eq(int, rc, KINBOX_OK), "connect to KINBOX_MYSQL_URL: %s",
                  db->err.msg);
        return db;
}

/* A connection to this test's own database. */
static kinbox__db_t *
open_db(void)
{
        return open_url(g_url);
}

static void
setup(void)
{
        const char *url = getenv("KINBOX_MYSQL_URL");
        cr_assert(url != NULL && *url,
                  "KINBOX_MYSQL_URL is not set (mysql://user:pw@host:port/db; "
                  "scripts/services start prints one)");
        g_admin = open_url(url);

        snprintf(g_dbname, sizeof(g_dbname), "kbt_my_%ld_%ld", (long)getpid(),
                 (long)(kinbox__wall_ms() % 1000000));
        char sql[160];
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s", g_dbname);
        OK_OR_FAIL(g_admin, g_admin->ops->script(g_admin, sql));

        kinbox__dburl_t u;
        char err[256];
        cr_assert(eq(int, kinbox__dburl_parse(url, &u, err, sizeof(err)), 0),
                  "%s", err);
        snprintf(g_url, sizeof(g_url), "mysql://");
        if (u.user) {
                url_add_enc(g_url, sizeof(g_url), u.user);
                if (u.password) {
                        strcat(g_url, ":");
                        url_add_enc(g_url, sizeof(g_url), u.password);
                }
                strcat(g_url, "@");
        }
        size_t l = strlen(g_url);
        snprintf(g_url + l, sizeof(g_url) - l, "%s:%d/%s",
                 u.host ? u.host : "127.0.0.1", u.port ? u.port : 3306,
                 g_dbname);
        kinbox__dburl_free(&u);
}

static void
teardown(void)
{
        if (!g_admin)
                return;
        if (!g_admin->native)
                g_admin->ops->connect(g_admin);
        if (g_dbname[0]) {
                char sql[160];
                snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s",
                         g_dbname);
                g_admin->ops->script(g_admin, sql);
        }
        kinbox__db_destroy(g_admin);
        g_admin = NULL;
}

TestSuite(mysql, .init = setup, .fini = teardown, .timeout = 60);

static char *
read_file(const char *path)
{
        FILE *f = fopen(path, "rb");
        cr_assert(f != NULL, "cannot open %s", path);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *s = malloc((size_t)n + 1);
        cr_assert(s != NULL);
        cr_assert(eq(sz, fread(s, 1, (size_t)n, f), (size_t)n));
        s[n] = '\0';
        fclose(f);
        return s;
}

static void
migrate_file(kinbox__db_t *db, const char *name)
{
        char path[1024];
        const char *dir = KINBOX_SOURCE_DIR;
        if (dir) {
                snprintf(path, sizeof(path), "%s/migrations/mysql/%s", dir,
                         name);
        } else {
                snprintf(path, sizeof(path), "%s", __FILE__);
                char *slash = strrchr(path, '/');
                if (slash)
                        *slash = '\0';
                else
                        snprintf(path, sizeof(path), ".");
                size_t l = strlen(path);
                snprintf(path + l, sizeof(path) - l, "/../migrations/mysql/%s",
                         name);
        }
        char *sql = read_file(path);
        OK_OR_FAIL(db, db->ops->script(db, sql));
        /* Running it again must be harmless (DDL is not transactional on
         * MySQL, so a half-applied run gets repeated). */
        OK_OR_FAIL(db, db->ops->script(db, sql));
        free(sql);
}

/* The inbox as the backend's insert expects it: 0001, 0008 and 0009 (the
 * watermark's record identity). */
static void
migrate(kinbox__db_t *db)
{
        migrate_file(db, "0001_inbox.sql");
        migrate_file(db, "0008_inbox_time.sql");
        migrate_file(db, "0009_offsets_identity.sql");
}

/* Single-value query helper: returns a malloc'ed copy or NULL for NULL. */
static char *
scalar(kinbox__db_t *db, const char *sql)
{
        struct kinbox_rows_s *r = NULL;
        OK_OR_FAIL(db, db->ops->query(db, sql, 0, NULL, -1, &r));
        cr_assert(eq(sz, r->nrows, (size_t)1), "%s", sql);
        char *v = r->values[0] ? strdup(r->values[0]) : NULL;
        kinbox_rows_destroy(r);
        return v;
}

static long
scalar_long(kinbox__db_t *db, const char *sql)
{
        char *v = scalar(db, sql);
        cr_assert(v != NULL, "%s returned NULL", sql);
        long n = strtol(v, NULL, 10);
        free(v);
        return n;
}

/* ------------------------------------------------------------ placeholders */

Test(mysql, placeholders_roundtrip_bytes_exactly)
{
        kinbox__db_t *db = open_db();
        static const char quoted[] =
            "it's a \"quote\" \\ back\\slash \\' $1 ;";
        static const char nul[] = {'a', '\0', 'b', '\'', '\\', '\0'};
        /* Broken multibyte leads before quote/backslash must not hide
         * them from the escaper (or from the server's lexer). */
        static const char tricky[] = "\xf0'\xc3\\\xe2\x82'\x1a\r\n\"";
        char bin[256];
        for (int i = 0; i < 256; i++)
                bin[i] = (char)i;
        kinbox__param_t p[5] = {
            {quoted, 0, 0},
            {nul, 5, 0},
            {bin, sizeof(bin), 1},
            {NULL, 0, 0},
            {tricky, sizeof(tricky) - 1, 1},
        };
        struct kinbox_rows_s *r = NULL;
        OK_OR_FAIL(db,
                   db->ops->query(db,
                                  "SELECT $1 AS a, $2 AS b, $3 AS c, $4 AS d, "
                                  "'$1' AS lit, \"$2\" AS dq, 'v' AS `x$1`, "
                                  "$2 = $2 AS rep, $5 AS t /* $9 */ -- $9 ;\n"
                                  "# $9 too\n",
                                  5, p, -1, &r));
        /* `x$1` is a quoted identifier (a column alias): not a
         * placeholder. */
        cr_assert(eq(sz, r->nrows, (size_t)1));
        cr_assert(eq(int, r->ncols, 9));
        cr_assert(eq(str, r->names[0], "a"));
        cr_assert(eq(str, r->names[6], "x$1"));
        cr_assert(eq(str, r->values[0], (char *)quoted));
        cr_assert(eq(sz, r->lens[1], (size_t)5));
        cr_assert(eq(int, memcmp(r->values[1], nul, 5), 0));
        cr_assert(eq(sz, r->lens[2], sizeof(bin)));
        cr_assert(eq(int, memcmp(r->values[2], bin, sizeof(bin)), 0));
        cr_assert(r->values[3] == NULL, "NULL param must be SQL NULL");
        cr_assert(eq(str, r->values[4], "$1"));
        cr_assert(eq(str, r->values[5], "$2"));
        cr_assert(eq(str, r->values[7], "1"));
        cr_assert(eq(sz, r->lens[8], sizeof(tricky) - 1));
        cr_assert(
            eq(int, memcmp(r->values[8], tricky, sizeof(tricky) - 1), 0));
        kinbox_rows_destroy(r);

        /* The same bytes stored in and read back from a blob column. */
        OK_OR_FAIL(db, db->ops->script(db, "CREATE TABLE bb (b LONGBLOB)"));
        OK_OR_FAIL(db, db->ops->query(db, "INSERT INTO bb VALUES ($1), ($3)",
                                      3, &p[2], -1, NULL));
        OK_OR_FAIL(db, db->ops->query(db,
                                      "SELECT b FROM bb ORDER BY "
                                      "LENGTH(b) DESC",
                                      0, NULL, -1, &r));
        cr_assert(eq(int, memcmp(r->values[0], bin, sizeof(bin)), 0));
        cr_assert(eq(sz, r->lens[1], sizeof(tricky) - 1));
        cr_assert(
            eq(int, memcmp(r->values[1], tricky, sizeof(tricky) - 1), 0));
        kinbox_rows_destroy(r);

        /* Still exact if a handler switched on NO_BACKSLASH_ESCAPES
         * through the native handle (quotes are doubled then, or hex on
         * Oracle's client). */
        MYSQL *m = db->ops->native(db);
        cr_assert(m != NULL);
        cr_assert(eq(int,
                     mysql_query(m, "SET SESSION sql_mode = CONCAT("
                                    "@@sql_mode, ',NO_BACKSLASH_ESCAPES')"),
                     0));
        OK_OR_FAIL(db, db->ops->query(db, "SELECT $1, $2, $3", 3,
                                      (kinbox__param_t[3]){p[0], p[4], p[1]},
                                      -1, &r));
        cr_assert(eq(str, r->values[0], (char *)quoted));
        cr_assert(
            eq(int, memcmp(r->values[1], tricky, sizeof(tricky) - 1), 0));
        cr_assert(eq(int, memcmp(r->values[2], nul, 5), 0));
        kinbox_rows_destroy(r);

        /* Repeated and out of order, and integers after LIMIT. */
        kinbox__param_t q[2] = {{"b", 0, 0}, {"2", 0, 0}};
        OK_OR_FAIL(db, db->ops->query(db,
                                      "SELECT CONCAT($2, $1, $2, $1) AS s "
                                      "UNION ALL SELECT 'x' LIMIT $2",
                                      2, q, -1, &r));
        cr_assert(eq(sz, r->nrows, (size_t)2));
        cr_assert(eq(str, r->values[0], "2b2b"));
        kinbox_rows_destroy(r);

        /* A placeholder with no parameter is refused before sending. */
        int rc = db->ops->query(db, "SELECT $3", 2, q, 4, &r);
        cr_assert(eq(int, rc, KINBOX_ERR_INVALID));
        cr_assert(eq(int, db->err.tag, 4));
        cr_assert(r == NULL);
        rc = db->ops->query(db, "SELECT $0", 2, q, -1, NULL);
        cr_assert(eq(int, rc, KINBOX_ERR_INVALID));
        rc = db->ops->query(db, " ; ", 0, NULL, -1, NULL);
        cr_assert(eq(int, rc, KINBOX_ERR_INVALID));
        /* Still usable afterwards. */
        char *v = scalar(db, "SELECT 1;  ");
        cr_assert(eq(str, v, "1"));
        free(v);
        kinbox__db_destroy(db);
}

Test(mysql, rows_have_names_lengths_and_nulls)
{
        kinbox__db_t *db = open_db();
        OK_OR_FAIL(
            db, db->ops->script(db, "CREATE TABLE r (id INT PRIMARY KEY, "
                                    "t VARCHAR(20), b BLOB);"
                                    "INSERT INTO r VALUES (1, '', X'00FF'), "
                                    "(2, NULL, NULL), (3, 'é', '')"));
        struct kinbox_rows_s *r = NULL;
        OK_OR_FAIL(db, db->ops->query(db, "SELECT id, t, b FROM r ORDER BY id",
                                      0, NULL, -1, &r));
        cr_assert(eq(sz, r->nrows, (size_t)3));
        cr_assert(eq(str, r->names[2], "b"));
        cr_assert(eq(str, r->values[1], ""));
        cr_assert(eq(sz, r->lens[2], (size_t)2));
        cr_assert(eq(int, (unsigned char)r->values[2][1], 0xFF));
        cr_assert(r->values[4] == NULL && r->values[5] == NULL);
        cr_assert(eq(str, r->values[7], "é"));
        cr_assert(eq(sz, r->lens[7], (size_t)2));
        kinbox_rows_destroy(r);
        /* A statement without a result set yields zero rows, not NULL. */
        OK_OR_FAIL(db, db->ops->query(db, "UPDATE r SET t = 'x' WHERE id = 9",
                                      0, NULL, -1, &r));
        cr_assert(r != NULL);
        cr_assert(eq(sz, r->nrows, (size_t)0));
        kinbox_rows_destroy(r);
        kinbox__db_destroy(db);
}

/* ------------------------------------------------------- deferral / errors */

static void
exec1(kinbox__db_t *db, const char *sql, const char *v, int tag)
{
        kinbox__param_t p = {v, 0, 0};
        OK_OR_FAIL(db, db->ops->exec(db, sql, v ? 1 : 0, v ? &p : NULL, tag));
}

Test(mysql, deferred_exec_error_names_the_right_tag)
{
        kinbox__db_t *db = open_db();
        kinbox__db_t *other = open_db();
        OK_OR_FAIL(db, db->ops->script(db, "CREATE TABLE t (id INT PRIMARY "
                                           "KEY, v VARCHAR(10))"));
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO t VALUES ($1, 'a')", "1", 0);
        /* Two statements in one exec keep the tag mapping straight. */
        exec1(db,
              "INSERT INTO t VALUES ($1, 'b'); INSERT INTO t VALUES (3, "
              "'c');",
              "2", 1);
        /* Deferred: the syntax error is not seen yet... */
        exec1(db, "INSERT INTO t VALUES ($1, 'd') garbage", "4", 2);
        exec1(db, "INSERT INTO t VALUES ($1, 'e')", "5", 3);
        /* ...and nothing reached the server: no round trip happened. */
        cr_assert(eq(long, scalar_long(other, "SELECT COUNT(*) FROM t"), 0L));

        int rc = db->ops->flush(db);
        cr_assert(eq(int, rc, KINBOX_ERR_DB));
        cr_assert(eq(int, db->err.tag, 2), "%s", db->err.msg);
        cr_assert(eq(int, db->err.vendor, 1064));
        cr_assert(strncmp(db->err.msg, "MySQL 1064 (42000): ", 20) == 0, "%s",
                  db->err.msg);
        cr_assert(strchr(db->err.msg, '\n') == NULL);
        db->ops->rollback(db);
        cr_assert(eq(int, db->in_tx, 0));
        cr_assert(eq(long, scalar_long(db, "SELECT COUNT(*) FROM t"), 0L));

        /* A column too long (strict mode): error 1406 on the right tag. */
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO t VALUES (1, $1)", "short", 10);
        exec1(db, "INSERT INTO t VALUES (2, $1)", "far too long for ten", 11);
        rc = db->ops->commit(db);
        cr_assert(eq(int, rc, KINBOX_ERR_DB));
        cr_assert(eq(int, db->err.tag, 11));
        cr_assert(eq(int, db->err.vendor, 1406));
        db->ops->rollback(db);
        cr_assert(eq(long, scalar_long(other, "SELECT COUNT(*) FROM t"), 0L));
        kinbox__db_destroy(other);
        kinbox__db_destroy(db);
}

Test(mysql, big_batches_are_split_below_max_allowed_packet)
{
        kinbox__db_t *db = open_db();
        OK_OR_FAIL(db, db->ops->script(db, "CREATE TABLE big (id INT PRIMARY "
                                           "KEY, b LONGBLOB)"));
        /* 5 x 3 MiB is more than one packet may carry on a default server
         * (16 MiB); the queue must be sent in pieces, in order. */
        const size_t sz = 3u << 20;
        char *blob = malloc(sz);
        cr_assert(blob != NULL);
        memset(blob, 'q', sz);
        OK_OR_FAIL(db, db->ops->begin(db));
        for (int i = 0; i < 5; i++) {
                char id[8];
                snprintf(id, sizeof(id), "%d", i);
                kinbox__param_t p[2] = {{id, 0, 0}, {blob, sz, 1}};
                OK_OR_FAIL(db, db->ops->exec(db,
                                             "INSERT INTO big VALUES ($1, "
                                             "$2)",
                                             2, p, i));
        }
        OK_OR_FAIL(db, db->ops->commit(db));
        cr_assert(eq(long, scalar_long(db, "SELECT SUM(LENGTH(b)) FROM big"),
                     (long)(5 * sz)));

        /* An error in an earlier piece surfaces from the exec() that sent
         * it, still naming the statement's own tag. */
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO big VALUES ($1, NULL)", "0", 7);
        int rc = KINBOX_OK;
        for (int i = 0; i < 5 && rc == KINBOX_OK; i++) {
                kinbox__param_t p[2] = {{"100", 0, 0}, {blob, sz, 1}};
                p[0].v = i == 0   ? "100"
                         : i == 1 ? "101"
                         : i == 2 ? "102"
                         : i == 3 ? "103"
                                  : "104";
                rc = db->ops->exec(db, "INSERT INTO big VALUES ($1, $2)", 2, p,
                                   20 + i);
        }
        cr_assert(eq(int, rc, KINBOX_ERR_DUPLICATE), "%s", db->err.msg);
        cr_assert(eq(int, db->err.tag, 7));
        db->ops->rollback(db);
        cr_assert(eq(long, scalar_long(db, "SELECT COUNT(*) FROM big"), 5L));
        free(blob);
        kinbox__db_destroy(db);
}

Test(mysql, duplicate_key_maps_to_duplicate)
{
        kinbox__db_t *db = open_db();
        OK_OR_FAIL(db, db->ops->script(db, "CREATE TABLE d (id INT PRIMARY "
                                           "KEY)"));
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO d VALUES ($1)", "1", 0);
        exec1(db, "INSERT INTO d VALUES ($1)", "1", 5);
        int rc = db->ops->commit(db);
        cr_assert(eq(int, rc, KINBOX_ERR_DUPLICATE));
        cr_assert(eq(int, db->err.tag, 5));
        cr_assert(eq(int, db->err.vendor, 1062));
        db->ops->rollback(db);
        cr_assert(eq(long, scalar_long(db, "SELECT COUNT(*) FROM d"), 0L));

        /* Through query() too, with autocommit. */
        OK_OR_FAIL(db, db->ops->query(db, "INSERT INTO d VALUES (7)", 0, NULL,
                                      -1, NULL));
        rc = db->ops->query(db, "INSERT INTO d VALUES (7)", 0, NULL, 3, NULL);
        cr_assert(eq(int, rc, KINBOX_ERR_DUPLICATE));
        cr_assert(eq(int, db->err.tag, 3));
        kinbox__db_destroy(db);
}

Test(mysql, commit_and_rollback_visibility)
{
        kinbox__db_t *db = open_db();
        kinbox__db_t *other = open_db();
        OK_OR_FAIL(db, db->ops->script(db, "CREATE TABLE c (id INT PRIMARY "
                                           "KEY)"));

        /* An empty transaction costs nothing and commits fine. */
        OK_OR_FAIL(db, db->ops->begin(db));
        OK_OR_FAIL(db, db->ops->commit(db));
        OK_OR_FAIL(db, db->ops->begin(db));
        db->ops->rollback(db);

        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO c VALUES ($1)", "1", 0);
        /* query() flushes first, so the transaction reads its own write. */
        cr_assert(eq(long, scalar_long(db, "SELECT COUNT(*) FROM c"), 1L));
        /* READ COMMITTED: the other session does not see it yet. */
        cr_assert(eq(long, scalar_long(other, "SELECT COUNT(*) FROM c"), 0L));
        exec1(db, "INSERT INTO c VALUES ($1)", "2", 1);
        OK_OR_FAIL(db, db->ops->commit(db));
        cr_assert(eq(int, db->in_tx, 0));
        cr_assert(eq(long, scalar_long(other, "SELECT COUNT(*) FROM c"), 2L));

        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO c VALUES ($1)", "3", 0);
        OK_OR_FAIL(db, db->ops->flush(db));
        db->ops->rollback(db);
        exec1(db, "INSERT INTO c VALUES ($1)", "4", 0); /* autocommit */
        cr_assert(eq(long, scalar_long(other, "SELECT COUNT(*) FROM c"), 3L));
        cr_assert(eq(long,
                     scalar_long(other, "SELECT COUNT(*) FROM c WHERE id = 3"),
                     0L));

        /* native() flushes (and so starts the transaction) first. */
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO c VALUES ($1)", "5", 0);
        MYSQL *m = db->ops->native(db);
        cr_assert(m != NULL);
        cr_assert(eq(int, mysql_query(m, "INSERT INTO c VALUES (6)"), 0));
        db->ops->rollback(db);
        cr_assert(eq(
            long, scalar_long(other, "SELECT COUNT(*) FROM c WHERE id >= 5"),
            0L));

        /* The session settings the backend promises. */
        /* transaction_isolation on MySQL 8 and MariaDB 11.1+,
         * tx_isolation before. */
        struct kinbox_rows_s *ir = NULL;
        const char *isosql =
            db->ops->query(db, "SELECT @@SESSION.transaction_isolation", 0,
                           NULL, -1, &ir) == KINBOX_OK
                ? "SELECT @@SESSION.transaction_isolation"
                : "SELECT @@SESSION.tx_isolation";
        kinbox_rows_destroy(ir);
        char *iso = scalar(db, isosql);
        cr_assert(eq(str, iso, "READ-COMMITTED"));
        free(iso);
        char *mode = scalar(db, "SELECT @@SESSION.sql_mode");
        cr_assert(strstr(mode, "STRICT_ALL_TABLES") != NULL, "%s", mode);
        free(mode);
        char *cs = scalar(db, "SELECT @@character_set_client");
        cr_assert(eq(str, cs, "utf8mb4"));
        free(cs);
        kinbox__db_destroy(other);
        kinbox__db_destroy(db);
}

/* ------------------------------------------------------------------ inbox */

/* url_suffix "" uses INSERT IGNORE ... RETURNING (MariaDB 10.5+);
 * "?inbox_returning=0" the token path MySQL 8 needs. */
static void
inbox_semantics(const char *url_suffix)
{
        char url[1100];
        snprintf(url, sizeof(url), "%s%s", g_url, url_suffix);
        kinbox__db_t *db = open_url(url);
        migrate(db);

        /* "b" is already done from an earlier transaction. */
        kinbox__inbox_row_t first[] = {{"b", "orders", 0, 1, -1}};
        bool n1[1];
        OK_OR_FAIL(db, db->ops->begin(db));
        OK_OR_FAIL(db, db->ops->inbox_insert(db, "points", 1, first, n1));
        cr_assert(n1[0]);
        OK_OR_FAIL(db, db->ops->commit(db));

        OK_OR_FAIL(db, db->ops->script(db, "CREATE TABLE side (v INT)"));
        kinbox__inbox_row_t rows[] = {
            {"a", "orders", 0, 10, -1}, {"b", "orders", 0, 11, -1},
            {"a", "orders", 1, 12, -1}, {"c", "orders", 1, 13, -1},
            {"x", "orders", 2, 14, -1}, {"x ", "orders", 2, 15, -1},
            {"X", "orders", 2, 16, -1}, {"it's\\", "orders", 3, 17, -1},
            {"é", "orders", 3, 18, -1}, {"\xff\xfe", "orders", 3, 19, -1},
        };
        const size_t n = KINBOX__ARRAY_SIZE(rows);
        bool is_new[KINBOX__ARRAY_SIZE(rows)];
        OK_OR_FAIL(db, db->ops->begin(db));
        /* Queued statements travel in the same round trip. */
        exec1(db, "INSERT INTO side VALUES ($1)", "1", 0);
        OK_OR_FAIL(db, db->ops->inbox_insert(db, "points", n, rows, is_new));
        bool want[] = {true, false, false, true, true,
                       true, true,  true,  true, true};
        for (size_t i = 0; i < n; i++)
                cr_assert(eq(int, is_new[i], want[i]), "row %zu (%s)", i,
                          rows[i].id);
        /* Another consumer has its own namespace. */
        bool o[1];
        OK_OR_FAIL(db, db->ops->inbox_insert(db, "ledger", 1, first, o));
        cr_assert(o[0]);
        OK_OR_FAIL(db, db->ops->commit(db));
        cr_assert(eq(long, scalar_long(db, "SELECT COUNT(*) FROM side"), 1L));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT COUNT(*) FROM kinbox_inbox "
                                     "WHERE consumer = 'points'"),
                     9L));
        char *off = scalar(db, "SELECT kafka_offset FROM kinbox_inbox WHERE "
                               "consumer = 'points' AND message_id = 'a'");
        cr_assert(eq(str, off, "10"));
        free(off);

        /* Same batch again: nothing is new; rolled-back inserts vanish. */
        OK_OR_FAIL(db, db->ops->begin(db));
        OK_OR_FAIL(db, db->ops->inbox_insert(db, "points", n, rows, is_new));
        for (size_t i = 0; i < n; i++)
                cr_assert(eq(int, is_new[i], 0), "row %zu", i);
        kinbox__inbox_row_t fresh[] = {{"z", "orders", 0, 20, -1}};
        OK_OR_FAIL(db, db->ops->inbox_insert(db, "points", 1, fresh, o));
        cr_assert(o[0]);
        db->ops->rollback(db);
        OK_OR_FAIL(db, db->ops->begin(db));
        OK_OR_FAIL(db, db->ops->inbox_insert(db, "points", 1, fresh, o));
        cr_assert(o[0], "a rolled-back inbox row must not count");
        OK_OR_FAIL(db, db->ops->commit(db));
        kinbox__db_destroy(db);
}

Test(mysql, inbox_insert_tells_new_from_duplicate)
{
        inbox_semantics("");
}

Test(mysql, inbox_insert_tells_new_from_duplicate_token_path)
{
        inbox_semantics("?inbox_returning=0");
}

Test(mysql, inbox_insert_rejects_long_names)
{
        kinbox__db_t *db = open_db();
        migrate(db);
        char name[202], topic[251];
        memset(name, 'n', 201);
        name[201] = '\0';
        memset(topic, 't', 250);
        topic[250] = '\0';
        kinbox__inbox_row_t rows[] = {{"a", "t", 0, 1, -1}};
        bool is_new[1];
        OK_OR_FAIL(db, db->ops->begin(db));
        cr_assert(eq(int, db->ops->inbox_insert(db, name, 1, rows, is_new),
                     KINBOX_ERR_INVALID));
        cr_assert(strstr(db->err.msg, "consumer name") != NULL, "%s",
                  db->err.msg);
        db->ops->rollback(db);
        rows[0].topic = topic;
        OK_OR_FAIL(db, db->ops->begin(db));
        cr_assert(eq(int, db->ops->inbox_insert(db, "c", 1, rows, is_new),
                     KINBOX_ERR_INVALID));
        cr_assert(strstr(db->err.msg, "topic name") != NULL, "%s",
                  db->err.msg);
        db->ops->rollback(db);
        /* 200 characters of two bytes each fit: characters, not bytes. */
        char wide[401];
        for (int i = 0; i < 200; i++)
                memcpy(wide + 2 * i, "\xc3\xa9", 2);
        wide[400] = '\0';
        rows[0].topic = "t";
        OK_OR_FAIL(db, db->ops->begin(db));
        OK_OR_FAIL(db, db->ops->inbox_insert(db, wide, 1, rows, is_new));
        cr_assert(is_new[0]);
        OK_OR_FAIL(db, db->ops->commit(db));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT CHAR_LENGTH(consumer) FROM "
                                     "kinbox_inbox"),
                     200L));
        kinbox__db_destroy(db);
}

Test(mysql, inbox_insert_rejects_long_ids)
{
        kinbox__db_t *db = open_db();
        migrate(db);
        char ok[256], bad[257];
        memset(ok, 'k', 255);
        ok[255] = '\0';
        memset(bad, 'b', 256);
        bad[256] = '\0';
        kinbox__inbox_row_t rows[] = {{ok, "t", 0, 1, -1},
                                      {bad, "t", 0, 2, -1}};
        bool is_new[2];
        OK_OR_FAIL(db, db->ops->begin(db));
        int rc = db->ops->inbox_insert(db, "c", 2, rows, is_new);
        cr_assert(eq(int, rc, KINBOX_ERR_INVALID));
        cr_assert(eq(int, db->err.tag, 1));
        cr_assert(strstr(db->err.msg, "256") != NULL, "%s", db->err.msg);
        db->ops->rollback(db);
        OK_OR_FAIL(db, db->ops->begin(db));
        OK_OR_FAIL(db, db->ops->inbox_insert(db, "c", 1, rows, is_new));
        cr_assert(is_new[0]);
        OK_OR_FAIL(db, db->ops->commit(db));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT LENGTH(message_id) FROM "
                                     "kinbox_inbox"),
                     255L));
        kinbox__db_destroy(db);
}

/* ---------------------------------------------------------------- dialect */

Test(mysql, dialect_statements)
{
        kinbox__db_t *db = open_db();
        migrate(db);
        const struct kinbox__sql *d = db->ops->sql;
        struct kinbox_rows_s *r = NULL;

        /* The watermark never moves backwards; the identity of the record
         * at W-1 goes with the watermark that wins. */
        const char *o1[] = {"points", "orders", "3", "10", "111", "-222"};
        const char *o2[] = {"points", "orders", "3", "5", "1", "1"};
        const char *o3[] = {"points", "orders", "3", "20", "333", "444"};
        OK_OR_FAIL(db, kinbox__db_queryv(db, d->offsets_upsert, 6, o1, NULL));
        OK_OR_FAIL(db, kinbox__db_queryv(db, d->offsets_upsert, 6, o2, NULL));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT next_offset FROM "
                                     "kinbox_offsets"),
                     10L));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT last_ts + last_hash FROM "
                                     "kinbox_offsets"),
                     -111L));
        OK_OR_FAIL(db, kinbox__db_queryv(db, d->offsets_upsert, 6, o3, NULL));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT next_offset FROM "
                                     "kinbox_offsets"),
                     20L));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT last_ts + last_hash FROM "
                                     "kinbox_offsets"),
                     777L));

        /* Dead letter keeps the original bytes. */
        static const char key[] = {0, 1, 2, (char)0xff};
        static const char payload[] = {'{', 0, '}'};
        kinbox__param_t dl[10] = {
            {"points", 0, 0},
            {"m-1", 0, 0},
            {"orders", 0, 0},
            {"3", 0, 0},
            {"42", 0, 0},
            {key, sizeof(key), 1},
            {"[[\"h\",\"v\"]]", 0, 0},
            {payload, sizeof(payload), 1},
            {"handler said no", 0, 0},
            {"8", 0, 0},
        };
        OK_OR_FAIL(
            db, db->ops->query(db, d->dead_letter_insert, 10, dl, -1, NULL));
        OK_OR_FAIL(db, db->ops->query(db,
                                      "SELECT msg_key, payload, status, "
                                      "attempts FROM kinbox_dead_letter",
                                      0, NULL, -1, &r));
        cr_assert(eq(sz, r->lens[0], sizeof(key)));
        cr_assert(eq(int, memcmp(r->values[0], key, sizeof(key)), 0));
        cr_assert(eq(sz, r->lens[1], sizeof(payload)));
        cr_assert(eq(int, memcmp(r->values[1], payload, sizeof(payload)), 0));
        cr_assert(eq(str, r->values[2], "dead"));
        cr_assert(eq(str, r->values[3], "8"));
        kinbox_rows_destroy(r);

        /* Outbox append: id row when new, no row (and no abort) when not.
         * The outbox table belongs to a later migration; a minimal one
         * with the columns the statement names is enough here. */
        OK_OR_FAIL(
            db, db->ops->script(db, "CREATE TABLE kinbox_outbox (id BIGINT "
                                    "AUTO_INCREMENT PRIMARY KEY, kind "
                                    "VARCHAR(16), destination VARCHAR(255), "
                                    "idem_key VARCHAR(255), aggregate_id "
                                    "VARCHAR(255), payload LONGBLOB, headers "
                                    "LONGTEXT, max_attempts INT, UNIQUE "
                                    "(destination, idem_key))"));
        kinbox__param_t ob[7] = {
            {"event", 0, 0}, {"order.paid", 0, 0}, {"k1", 0, 0},
            {"agg", 0, 0},   {"\x01\x00", 2, 1},   {NULL, 0, 0},
            {"0", 0, 0},
        };
        OK_OR_FAIL(db, db->ops->begin(db));
        OK_OR_FAIL(db, db->ops->query(db, d->outbox_append, 7, ob, 0, &r));
        cr_assert(eq(sz, r->nrows, (size_t)1));
        cr_assert(eq(str, r->values[0], "1"));
        kinbox_rows_destroy(r);
        OK_OR_FAIL(db, db->ops->query(db, d->outbox_append, 7, ob, 1, &r));
        cr_assert(eq(sz, r->nrows, (size_t)0), "a duplicate returns no row");
        kinbox_rows_destroy(r);
        ob[2].v = "k2";
        OK_OR_FAIL(db, db->ops->exec(db, d->outbox_append, 7, ob, 2));
        OK_OR_FAIL(db, db->ops->commit(db));
        cr_assert(eq(long,
                     scalar_long(db, "SELECT COUNT(*) FROM "
                                     "kinbox_outbox"),
                     2L));

        /* Lock: one holder at a time. */
        kinbox__db_t *other = open_db();
        const char *ln[] = {"kinbox-prune-test"};
        OK_OR_FAIL(db, kinbox__db_queryv(db, d->try_lock, 1, ln, &r));
        cr_assert(eq(str, r->values[0], "1"));
        kinbox_rows_destroy(r);
        OK_OR_FAIL(other, kinbox__db_queryv(other, d->try_lock, 1, ln, &r));
        cr_assert(eq(str, r->values[0], "0"));
        kinbox_rows_destroy(r);
        OK_OR_FAIL(db, kinbox__db_queryv(db, d->unlock, 1, ln, NULL));
        OK_OR_FAIL(other, kinbox__db_queryv(other, d->try_lock, 1, ln, &r));
        cr_assert(eq(str, r->values[0], "1"));
        kinbox_rows_destroy(r);

        /* The dialect's prune count runs (age in microseconds). */
        char sql[256];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        snprintf(sql, sizeof(sql), d->prune_count[0],
                 (int64_t)3600 * 1000 * d->prune_age_scale);
#pragma GCC diagnostic pop
        cr_assert(scalar_long(db, sql) >= 0L);
        kinbox__db_destroy(other);
        kinbox__db_destroy(db);
}

Test(mysql, script_reports_failing_statement)
{
        kinbox__db_t *db = open_db();
        int rc = db->ops->script(db, "CREATE TABLE s1 (id INT);\n"
                                     "CREATE TABLE s2 (id INT);\n"
                                     "CREATE TABLE s1 (id INT);\n"
                                     "CREATE TABLE s3 (id INT);\n");
        cr_assert(eq(int, rc, KINBOX_ERR_DB));
        cr_assert(eq(int, db->err.vendor, 1050));
        cr_assert(strstr(db->err.msg, "statement 3") != NULL, "%s",
                  db->err.msg);
        cr_assert(eq(long,
                     scalar_long(db, "SELECT COUNT(*) FROM "
                                     "information_schema.tables WHERE "
                                     "table_schema = DATABASE()"),
                     2L));
        kinbox__db_destroy(db);
}

/* ------------------------------------------------------- lost connections */

/* Kill the session with this id from a second connection. */
static void
kill_id(long id)
{
        kinbox__db_t *k = open_db();
        char sql[64];
        snprintf(sql, sizeof(sql), "KILL CONNECTION %ld", id);
        OK_OR_FAIL(k, k->ops->query(k, sql, 0, NULL, -1, NULL));
        kinbox__db_destroy(k);
        usleep(100 * 1000);
}

static void
kill_conn(kinbox__db_t *victim)
{
        kill_id(scalar_long(victim, "SELECT CONNECTION_ID()"));
}

Test(mysql, killed_connection_maps_to_db_conn_and_reconnects)
{
        kinbox__db_t *db = open_db();
        OK_OR_FAIL(db, db->ops->script(db, "CREATE TABLE k (id INT PRIMARY "
                                           "KEY)"));
        kill_conn(db);
        int rc = db->ops->query(db, "SELECT 1", 0, NULL, 7, NULL);
        cr_assert(eq(int, rc, KINBOX_ERR_DB_CONN), "%s", db->err.msg);
        cr_assert(db->native == NULL, "a lost connection is marked down");
        cr_assert(eq(int, db->err.tag, -1));
        /* Calls on a down handle fail fast, rollback stays quiet. */
        cr_assert(eq(int, db->ops->begin(db), KINBOX_ERR_DB_CONN));
        db->ops->rollback(db);

        OK_OR_FAIL(db, db->ops->connect(db));
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO k VALUES ($1)", "1", 0);
        OK_OR_FAIL(db, db->ops->commit(db));

        /* Lost before COMMIT returned: the outcome is unknown to us. */
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO k VALUES ($1)", "2", 0);
        OK_OR_FAIL(db, db->ops->flush(db));
        kill_conn(db);
        exec1(db, "INSERT INTO k VALUES ($1)", "3", 1);
        rc = db->ops->commit(db);
        cr_assert(eq(int, rc, KINBOX_ERR_COMMIT_UNKNOWN), "%d: %s", rc,
                  db->err.msg);
        cr_assert(db->native == NULL);
        db->ops->rollback(db);
        OK_OR_FAIL(db, db->ops->connect(db));
        cr_assert(eq(long, scalar_long(db, "SELECT COUNT(*) FROM k"), 1L));

        /* Inside a transaction at flush time: DB_CONN, tag -1. The kill
         * comes while everything is still queued client-side. */
        long id = scalar_long(db, "SELECT CONNECTION_ID()");
        OK_OR_FAIL(db, db->ops->begin(db));
        exec1(db, "INSERT INTO k VALUES ($1)", "4", 3);
        kill_id(id);
        rc = db->ops->flush(db);
        cr_assert(eq(int, rc, KINBOX_ERR_DB_CONN), "%s", db->err.msg);
        cr_assert(eq(int, db->err.tag, -1));
        db->ops->rollback(db);
        cr_assert(eq(int, db->in_tx, 0));
        kinbox__db_destroy(db);
}

Test(mysql, unreachable_server_is_db_conn)
{
        kinbox__dburl_t u;
        char err[256];
        cr_assert(
            eq(int, kinbox__dburl_parse(g_url, &u, err, sizeof(err)), 0));
        char url[512];
        /* Port 1 on loopback: nothing listens there. */
        snprintf(url, sizeof(url),
                 "mysql://%s@127.0.0.1:1/x?connect_timeout=2",
                 u.user ? u.user : "x");
        kinbox__dburl_free(&u);
        kinbox__db_t *db = kinbox__db_new(url, "pw", err, sizeof(err));
        cr_assert(db != NULL);
        int rc = db->ops->connect(db);
        cr_assert(eq(int, rc, KINBOX_ERR_DB_CONN), "%s", db->err.msg);
        cr_assert(eq(int, db->err.vendor, 2002), "%s", db->err.msg);
        cr_assert(db->native == NULL);
        kinbox__db_destroy(db);
}

/* ---------------------------------------------------------- transient */

struct blocker {
        kinbox__db_t *db;
        int rc;
};

static void *
block_update(void *arg)
{
        struct blocker *b = arg;
        b->rc = b->db->ops->query(
            b->db, "UPDATE dl SET v = v + 1 WHERE id = 2", 0, NULL, 1, NULL);
        return NULL;
}

Test(mysql, deadlock_and_lock_wait_are_transient)
{
        kinbox__db_t *a = open_db();
        kinbox__db_t *b = open_db();
        OK_OR_FAIL(a,
                   a->ops->script(a, "CREATE TABLE dl (id INT PRIMARY KEY, "
                                     "v INT) ENGINE=InnoDB;"
                                     "INSERT INTO dl VALUES (1, 0), (2, 0)"));
        OK_OR_FAIL(a, a->ops->begin(a));
        OK_OR_FAIL(a, a->ops->query(a, "UPDATE dl SET v = 1 WHERE id = 1", 0,
                                    NULL, 0, NULL));
        OK_OR_FAIL(b, b->ops->begin(b));
        OK_OR_FAIL(b, b->ops->query(b, "UPDATE dl SET v = 1 WHERE id = 2", 0,
                                    NULL, 0, NULL));
        /* a waits for row 2 while b then asks for row 1: a cycle. */
        struct blocker ba = {a, 99};
        pthread_t th;
        cr_assert(eq(int, pthread_create(&th, NULL, block_update, &ba), 0));
        usleep(300 * 1000);
        int rb = b->ops->query(b, "UPDATE dl SET v = v + 1 WHERE id = 1", 0,
                               NULL, 2, NULL);
        if (rb != KINBOX_OK)
                b->ops->rollback(b);
        pthread_join(th, NULL);
        cr_assert(
            eq(int,
               (ba.rc == KINBOX_ERR_TRANSIENT) + (rb == KINBOX_ERR_TRANSIENT),
               1),
            "exactly one deadlock victim: a=%d b=%d (%s / %s)", ba.rc, rb,
            a->err.msg, b->err.msg);
        kinbox__db_t *victim = ba.rc ? a : b;
        cr_assert(eq(int, victim->err.vendor, 1213));
        cr_assert(victim->native != NULL, "a deadlock keeps the connection");
        if (ba.rc)
                a->ops->rollback(a);
        else
                OK_OR_FAIL(a, a->ops->commit(a));
        if (rb == KINBOX_OK)
                OK_OR_FAIL(b, b->ops->commit(b));

        /* Lock wait timeout (1205), shortened for the test. */
        OK_OR_FAIL(a, a->ops->query(a,
                                    "SET SESSION innodb_lock_wait_timeout "
                                    "= 1",
                                    0, NULL, -1, NULL));
        OK_OR_FAIL(b, b->ops->begin(b));
        OK_OR_FAIL(b, b->ops->query(b, "UPDATE dl SET v = 5 WHERE id = 1", 0,
                                    NULL, 0, NULL));
        OK_OR_FAIL(a, a->ops->begin(a));
        exec1(a, "UPDATE dl SET v = 6 WHERE id = $1", "1", 4);
        int rc = a->ops->commit(a);
        cr_assert(eq(int, rc, KINBOX_ERR_TRANSIENT), "%s", a->err.msg);
        cr_assert(eq(int, a->err.vendor, 1205));
        cr_assert(eq(int, a->err.tag, 4));
        a->ops->rollback(a);
        b->ops->rollback(b);
        kinbox__db_destroy(a);
        kinbox__db_destroy(b);
}

/* ---------------------------------------------------- URL parameters, TLS */

/* g_url with "?" + params (g_url has none). */
static char *
url_with(const char *params)
{
        char *u = malloc(strlen(g_url) + strlen(params) + 2);
        sprintf(u, "%s?%s", g_url, params);
        return u;
}

/* Every parameter the backend does not know is refused, naming it (a
 * misspelt TLS parameter must not leave a plaintext connection), and so
 * is a bad value; the known ones are taken. */
Test(mysql, url_parameters_checked)
{
        static const struct {
                const char *params, *named;
        } bad[] = {
            {"sslmode=require", "unknown parameter \"sslmode\""},
            {"ssl-mode=VERIFY_FULL", "ssl-mode \"VERIFY_FULL\" is not one"},
            {"read_timeout=soon", "read_timeout must be seconds"},
            {"connect_timeout=0", "connect_timeout must be seconds"},
            {"inbox_returning=2", "inbox_returning must be 0 or 1"},
            {"ssl-mode=DISABLED&ssl-ca=/x.pem", "ssl-mode=DISABLED with"},
            {"ssl-ca", "needs a value"},
        };
        char err[512];
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                char *u = url_with(bad[i].params);
                err[0] = '\0';
                kinbox__db_t *db = kinbox__db_new(u, NULL, err, sizeof(err));
                cr_assert(db == NULL, "%s accepted", bad[i].params);
                cr_assert(strstr(err, bad[i].named) != NULL, "%s: %s",
                          bad[i].params, err);
                free(u);
        }
        /* Known ones, '_' for '-' too, mode case-insensitive. */
        char *u = url_with("connect_timeout=5&read_timeout=30&ssl_mode="
                           "disabled&inbox_returning=1");
        kinbox__db_t *db = kinbox__db_new(u, NULL, err, sizeof(err));
        cr_assert(db != NULL, "%s", err);
        cr_assert(eq(int, db->ops->connect(db), KINBOX_OK), "%s", db->err.msg);
        kinbox__db_destroy(db);
        free(u);
}

/* The suite's server has no TLS (have_ssl DISABLED): ssl-mode=REQUIRED and
 * VERIFY_IDENTITY fail at connect with an error that says so (never a
 * plaintext connection, never "Access denied"); PREFERRED connects in
 * plaintext. */
Test(mysql, tls_modes_against_a_plaintext_server)
{
        MYSQL *am = g_admin->native;
        cr_assert(mysql_query(am, "SELECT @@have_ssl") == 0);
        MYSQL_RES *res = mysql_store_result(am);
        MYSQL_ROW row = res ? mysql_fetch_row(res) : NULL;
        cr_assert(row && row[0] && !strcmp(row[0], "DISABLED"),
                  "the test server was expected without TLS");
        mysql_free_result(res);
        char err[512];
        char *u = url_with("ssl-mode=REQUIRED");
        kinbox__db_t *db = kinbox__db_new(u, NULL, err, sizeof(err));
        cr_assert(db != NULL, "%s", err);
        cr_assert(eq(int, db->ops->connect(db), KINBOX_ERR_DB));
        cr_assert(strstr(db->err.msg, "did not negotiate TLS") != NULL, "%s",
                  db->err.msg);
        cr_assert(db->native == NULL);
        kinbox__db_destroy(db);
        free(u);

        u = url_with("ssl-mode=VERIFY_IDENTITY&ssl-ca=/etc/ssl/certs/"
                     "ca-certificates.crt");
        db = kinbox__db_new(u, NULL, err, sizeof(err));
        cr_assert(db != NULL, "%s", err);
        cr_assert(ne(int, db->ops->connect(db), KINBOX_OK));
        cr_assert(strstr(db->err.msg, "SSL is required") != NULL, "%s",
                  db->err.msg);
        kinbox__db_destroy(db);
        free(u);

        u = url_with("ssl-mode=PREFERRED");
        db = kinbox__db_new(u, NULL, err, sizeof(err));
        cr_assert(db != NULL, "%s", err);
        cr_assert(eq(int, db->ops->connect(db), KINBOX_OK), "%s", db->err.msg);
        kinbox__db_destroy(db);
        free(u);
}
