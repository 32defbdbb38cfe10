/*
 * mysql_conn.c -- the MySQL / MariaDB session: the mysql:// URL's
 * parameters, TLS, connect and the session's settings, and the
 * classification of the server's and client library's error numbers.
 *
 * Only calls that both Oracle's libmysqlclient and MariaDB Connector/C
 * provide are used, so kinbox builds against either.
 */
#include "mysql_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Defaults (seconds); overridable with ?connect_timeout=&read_timeout=
 * &write_timeout= in the URL. The read timeout must exceed the server's
 * innodb_lock_wait_timeout (50 s by default) or a plain lock wait would be
 * reported as a lost connection instead of the transient 1205. */
#define MY_CONNECT_TIMEOUT 10
#define MY_READ_TIMEOUT 60
#define MY_WRITE_TIMEOUT 30

/* Never let one deferred packet grow past this, whatever the server's
 * max_allowed_packet says: a huge packet just delays the first error. */
#define MY_FLUSH_CAP (8u << 20)

/* The session sql_mode is fixed so the placeholder rewriting is sound:
 * no NO_BACKSLASH_ESCAPES, no ANSI_QUOTES, and strict so over-long values
 * fail instead of being truncated. */
#define MY_SQL_MODE                                                           \
        "STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"                     \
        "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"

static pthread_once_t my_once = PTHREAD_ONCE_INIT;
static int my_lib_rc;

/* mysql_library_init() is not thread-safe; mysql_init() calls it lazily,
 * so do it once before any worker thread connects. */
static void
my_lib_init(void)
{
        my_lib_rc = mysql_library_init(0, NULL, NULL);
}

static void
st_free(kinbox__db_t *db)
{
        struct mystate *s = db->impl;
        if (!s)
                return;
        kinbox__buf_free(&s->q);
        kinbox__buf_free(&s->tmp);
        free(s->tags);
        free(s->offs);
        free(s->flags);
        free(s->sent_tags);
        free(s->ran_owners);
        kinbox__my_rm_cut(s, 0);
        free(s->rmaps);
        kinbox__my_m_free(s->merge);
        free(s);
        db->impl = NULL;
        if (db->attr)
                db->attr->rows_queued = false;
}

/* ------------------------------------------------------------------ errors */

static bool
my_conn_errno(unsigned int e)
{
        switch (e) {
        case 2002: /* CR_CONNECTION_ERROR (socket) */
        case 2003: /* CR_CONN_HOST_ERROR */
        case 2006: /* CR_SERVER_GONE_ERROR */
        case 2013: /* CR_SERVER_LOST */
        case 2014: /* CR_COMMANDS_OUT_OF_SYNC: the handle is unusable */
        case 2026: /* CR_SSL_CONNECTION_ERROR */
        case 2055: /* CR_SERVER_LOST_EXTENDED */
        case 1040: /* ER_CON_COUNT_ERROR (too many connections) */
        case 1053: /* ER_SERVER_SHUTDOWN */
        case 1152: /* ER_ABORTING_CONNECTION */
        case 1927: /* MariaDB ER_CONNECTION_KILLED */
        case 4031: /* MySQL 8 ER_CLIENT_INTERACTION_TIMEOUT */
                return true;
        default:
                return false;
        }
}

/* Errors no retry can fix (see pg.c's permanent()); foreign-key
 * violations (1451/1452) are not among them. */
static bool
my_permanent(unsigned int e)
{
        switch (e) {
        case 1048: /* ER_BAD_NULL_ERROR */
        case 1364: /* ER_NO_DEFAULT_FOR_FIELD */
        case 4025: /* MariaDB ER_CONSTRAINT_FAILED (CHECK) */
        case 3819: /* MySQL ER_CHECK_CONSTRAINT_VIOLATED */
        case 1264: /* ER_WARN_DATA_OUT_OF_RANGE */
        case 1690: /* ER_DATA_OUT_OF_RANGE */
        case 1366: /* ER_TRUNCATED_WRONG_VALUE_FOR_FIELD */
        case 1292: /* ER_TRUNCATED_WRONG_VALUE */
        case 1406: /* ER_DATA_TOO_LONG */
        case 1365: /* ER_DIVISION_BY_ZERO */
        case 1367: /* ER_ILLEGAL_VALUE_FOR_TYPE */
        case 1411: /* ER_WRONG_VALUE_FOR_TYPE */
        case 3140: /* ER_INVALID_JSON_TEXT */
                return true;
        default:
                return false;
        }
}

/* The unique index named by error 1062's text ("Duplicate entry '...' for
 * key 'NAME'", MySQL 8: 'table.NAME'); the session's lc_messages is
 * en_US. The last "for key '" wins: the entry itself may contain it. */
static void
my_dup_key(const char *msg, char *out, size_t sz)
{
        const char *k = NULL;
        for (const char *p = msg; (p = strstr(p, "for key '")); p++)
                k = p + 9;
        out[0] = '\0';
        if (!k)
                return;
        const char *end = strrchr(k, '\'');
        if (!end || end < k)
                return;
        const char *dot = memchr(k, '.', (size_t)(end - k));
        if (dot)
                k = dot + 1;
        snprintf(out, sz, "%.*s", (int)(end - k), k);
}

/* Errors no retry can fix and no message is to blame for (see pg.c's
 * deploy_error()): the statement cannot run against the database as
 * deployed. */
static bool
my_deploy(unsigned int e)
{
        switch (e) {
        case 1044: /* ER_DBACCESS_DENIED_ERROR */
        case 1052: /* ER_NON_UNIQ_ERROR (ambiguous column) */
        case 1054: /* ER_BAD_FIELD_ERROR (unknown column) */
        case 1064: /* ER_PARSE_ERROR */
        case 1109: /* ER_UNKNOWN_TABLE */
        case 1128: /* ER_FUNCTION_NOT_DEFINED */
        case 1136: /* ER_WRONG_VALUE_COUNT_ON_ROW */
        case 1142: /* ER_TABLEACCESS_DENIED_ERROR */
        case 1143: /* ER_COLUMNACCESS_DENIED_ERROR */
        case 1146: /* ER_NO_SUCH_TABLE */
        case 1227: /* ER_SPECIFIC_ACCESS_DENIED_ERROR */
        case 1305: /* ER_SP_DOES_NOT_EXIST (function, procedure) */
        case 1318: /* ER_SP_WRONG_NO_OF_ARGS */
        case 1356: /* ER_VIEW_INVALID */
        case 1370: /* ER_PROCACCESS_DENIED_ERROR */
        case 1582: /* ER_WRONG_PARAMCOUNT_TO_NATIVE_FCT */
        case 1630: /* ER_FUNC_INEXISTENT_NAME_COLLISION */
                return true;
        default:
                return false;
        }
}

static int
my_code(unsigned int e)
{
        if (e == 1062 || e == 1586) /* ER_DUP_ENTRY(_WITH_KEY_NAME) */
                return KINBOX_ERR_DUPLICATE;
        if (e == 1213 || e == 1205 || e == 3572) /* deadlock, lock wait,
                                                    NOWAIT */
                return KINBOX_ERR_TRANSIENT;
        /* Out of disk, memory or another server resource: retried like a
         * deadlock (kinbox__db_resource_error() tells them apart). */
        if (e == 3 || e == 5 || e == 1021 || e == 1037 || e == 1038 ||
            e == 1041 || e == 1114)
                return KINBOX_ERR_TRANSIENT;
        if (my_conn_errno(e))
                return KINBOX_ERR_DB_CONN;
        return KINBOX_ERR_DB;
}

/* Close the handle so the caller's next step is connect(). The queue is
 * dropped with it: the server has rolled the transaction back. */
void
kinbox__my_mark_down(kinbox__db_t *db)
{
        if (db->native)
                mysql_close(db->native);
        db->native = NULL;
        st_free(db);
}

/*
 * Record the handle's current error. tag is the failing statement's tag;
 * connection errors carry -1 because no statement is to blame. in_commit:
 * the round trip held a COMMIT, so a lost connection leaves its outcome
 * unknown. Returns the kinbox code.
 */
int
kinbox__my_fail(kinbox__db_t *db, int tag, bool in_commit, const char *what)
{
        MYSQL *m = db->native;
        unsigned int e = mysql_errno(m);
        int code;
        if (e == 0) /* e.g. out of memory in the client library */
                e = 2008, code = KINBOX_ERR_DB;
        else
                code = my_code(e);
        if (code == KINBOX_ERR_DB_CONN) {
                tag = -1;
                if (in_commit)
                        code = KINBOX_ERR_COMMIT_UNKNOWN;
        }
        kinbox__db_seterr(db, code, "", (int)e, tag, "MySQL %u (%s): %s%s%s",
                          e, mysql_sqlstate(m), what ? what : "",
                          what ? ": " : "", mysql_error(m));
        db->err.permanent = code == KINBOX_ERR_DB && my_permanent(e);
        db->err.deploy = code == KINBOX_ERR_DB && my_deploy(e);
        if (code == KINBOX_ERR_DUPLICATE)
                my_dup_key(mysql_error(m), db->err.constraint,
                           sizeof(db->err.constraint));
        if (tag == KINBOX__TAG_MERGED && db->impl)
                kinbox__my_m_off_next(st_get(db)->merge);
        if (my_conn_errno(e))
                kinbox__my_mark_down(db);
        return code;
}

int
kinbox__my_down_err(kinbox__db_t *db)
{
        kinbox__db_seterr(db, KINBOX_ERR_DB_CONN, "", 0, -1,
                          "MySQL: not connected");
        return KINBOX_ERR_DB_CONN;
}

int
kinbox__my_oom(kinbox__db_t *db)
{
        kinbox__db_seterr(db, KINBOX_ERR_NOMEM, "", 0, -1,
                          "MySQL: out of memory");
        return KINBOX_ERR_NOMEM;
}

void
kinbox__my_disconnect(kinbox__db_t *db)
{
        kinbox__my_mark_down(db);
        db->in_tx = false;
}

/* A mysql:// URL's parameters. */
struct myopts {
        unsigned int ct, rt, wt;
        bool returning;
        int ssl_mode; /* SSL_* below */
        char *ssl[5]; /* ca, capath, cert, key, cipher */
};

enum {
        SSL_DEFAULT,
        SSL_DISABLED,
        SSL_PREFERRED,
        SSL_REQUIRED,
        SSL_VERIFY_CA,
        SSL_VERIFY_IDENTITY
};

static const char *const ssl_keys[5] = {"ssl-ca", "ssl-capath", "ssl-cert",
                                        "ssl-key", "ssl-cipher"};

static void
myopts_free(struct myopts *o)
{
        for (size_t i = 0; i < 5; i++)
                free(o->ssl[i]);
}

/* One parameter key=val of a mysql:// URL into o (key with '-' for '_'
 * where it is an ssl-* one). Returns 0, or -1 with errstr set. */
static int
url_param(const char *key, const char *val, size_t vl, struct myopts *o,
          char *errstr, size_t sz)
{
        char *end = NULL;
        long v = strtol(val, &end, 10);
        bool num = vl && end && !*end;
        unsigned int *dst = !strcmp(key, "connect_timeout") ? &o->ct
                            : !strcmp(key, "read_timeout")  ? &o->rt
                            : !strcmp(key, "write_timeout") ? &o->wt
                                                            : NULL;
        int si = -1;
        for (int i = 0; i < 5; i++)
                if (!strcmp(key, ssl_keys[i]))
                        si = i;
        if (dst) {
                if (!num || v <= 0 || v >= 86400) {
                        kinbox__errstr(errstr, sz,
                                       "database.url: %s must be "
                                       "seconds, 1 to 86399",
                                       key);
                        return -1;
                }
                *dst = (unsigned int)v;
        } else if (!strcmp(key, "inbox_returning")) {
                if (!num || (v != 0 && v != 1)) {
                        kinbox__errstr(errstr, sz,
                                       "database.url: "
                                       "inbox_returning must be 0 "
                                       "or 1");
                        return -1;
                }
                o->returning = v != 0;
        } else if (!strcmp(key, "ssl-mode")) {
                static const char *const modes[] = {"DISABLED", "PREFERRED",
                                                    "REQUIRED", "VERIFY_CA",
                                                    "VERIFY_IDENTITY"};
                o->ssl_mode = SSL_DEFAULT;
                for (int i = 0; i < 5; i++)
                        if (!strcasecmp(val, modes[i]))
                                o->ssl_mode = SSL_DISABLED + i;
                if (o->ssl_mode == SSL_DEFAULT) {
                        /* The value is named only when it looks like a
                         * mode: anything else may be a secret pasted in
                         * the wrong place (URLs are never echoed). */
                        size_t w = strspn(val, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                               "abcdefghijklmnopqrstuvwxyz_");
                        bool shown = vl && w == vl && vl <= 32;
                        kinbox__errstr(errstr, sz,
                                       "database.url: ssl-mode%s%s%s is not "
                                       "one of DISABLED, PREFERRED, "
                                       "REQUIRED, VERIFY_CA, "
                                       "VERIFY_IDENTITY",
                                       shown ? " \"" : "", shown ? val : "",
                                       shown ? "\"" : "");
                        return -1;
                }
        } else if (si >= 0 && vl) {
                free(o->ssl[si]);
                o->ssl[si] = kinbox__strdup(val);
        } else {
                kinbox__errstr(errstr, sz,
                               "database.url: unknown parameter "
                               "\"%s\" for mysql:// (known: "
                               "connect_timeout, read_timeout, "
                               "write_timeout, inbox_returning, "
                               "ssl-mode, ssl-ca, ssl-capath, "
                               "ssl-cert, ssl-key, ssl-cipher)",
                               key[0] ? key : "?");
                return -1;
        }
        return 0;
}

/* Parse "k=v&k=v": the timeouts (seconds, 1..86399), inbox_returning,
 * ssl-mode (DISABLED, PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY) and
 * ssl-ca, ssl-capath, ssl-cert, ssl-key, ssl-cipher ('_' for '-' too).
 * Anything else is refused, naming it: a misspelt TLS parameter must not
 * leave a plaintext connection. Returns 0, or -1 with errstr set. */
static int
url_options(const char *params, struct myopts *o, char *errstr, size_t sz)
{
        *o = (struct myopts){.ct = MY_CONNECT_TIMEOUT,
                             .rt = MY_READ_TIMEOUT,
                             .wt = MY_WRITE_TIMEOUT,
                             .returning = true,
                             .ssl_mode = SSL_DEFAULT};
        for (const char *p = params ? params : ""; *p;) {
                size_t n = strcspn(p, "&");
                const char *eq = memchr(p, '=', n);
                char key[32] = "", val[1024] = "";
                size_t kl = eq ? (size_t)(eq - p) : n;
                if (kl && kl < sizeof(key)) {
                        memcpy(key, p, kl);
                        for (char *k = key; *k; k++)
                                if (*k == '_' && strncmp(key, "inbox", 5) &&
                                    !strstr(key, "timeout"))
                                        *k = '-';
                }
                size_t vl = eq ? n - kl - 1 : 0;
                if (eq && vl < sizeof(val))
                        memcpy(val, eq + 1, vl);
                if (!eq || vl >= sizeof(val)) {
                        kinbox__errstr(errstr, sz,
                                       "database.url: parameter \"%.*s\" "
                                       "needs a value (KEY=VALUE)",
                                       (int)(kl > 40 ? 40 : kl), p);
                        return -1;
                }
                if (url_param(key, val, vl, o, errstr, sz))
                        return -1;
                p += n;
                if (*p == '&')
                        p++;
        }
        bool tls_files = o->ssl[0] || o->ssl[1] || o->ssl[2] || o->ssl[3];
        if (o->ssl_mode == SSL_DISABLED && tls_files) {
                kinbox__errstr(errstr, sz,
                               "database.url: ssl-mode=DISABLED with ssl-* "
                               "files: say which one you mean");
                return -1;
        }
        /* Files but no mode: as the mysql client does, REQUIRED, and the
         * server's certificate verified when a CA is given. */
        if (o->ssl_mode == SSL_DEFAULT && tls_files)
                o->ssl_mode = o->ssl[0] || o->ssl[1] ? SSL_VERIFY_IDENTITY
                                                     : SSL_REQUIRED;
        return 0;
}

int
kinbox__mysql_url_check(const char *params, char *errstr, size_t sz)
{
        struct myopts o;
        int rc = url_options(params, &o, errstr, sz);
        myopts_free(&o);
        return rc;
}

/* TLS options of the connector from the URL's ssl-* parameters. */
static void
my_tls_options(MYSQL *m, const struct myopts *o)
{
        my_bool yes = 1, no = 0;
        if (o->ssl_mode == SSL_DEFAULT || o->ssl_mode == SSL_DISABLED)
                return;
        const enum mysql_option opt[5] = {
            MYSQL_OPT_SSL_CA, MYSQL_OPT_SSL_CAPATH, MYSQL_OPT_SSL_CERT,
            MYSQL_OPT_SSL_KEY, MYSQL_OPT_SSL_CIPHER};
        for (int i = 0; i < 5; i++)
                if (o->ssl[i])
                        mysql_optionsv(m, opt[i], o->ssl[i]);
        if (o->ssl_mode == SSL_PREFERRED) {
                /* TLS when the server offers it (Connector/C 3.3: any TLS
                 * option asks for it); not enforced. */
                mysql_optionsv(m, MYSQL_OPT_SSL_ENFORCE, &no);
                if (!o->ssl[0] && !o->ssl[1] && !o->ssl[4])
                        mysql_optionsv(m, MYSQL_OPT_SSL_CIPHER, "");
                return;
        }
        mysql_optionsv(m, MYSQL_OPT_SSL_ENFORCE, &yes);
        /* Connector/C checks the chain and the host name together:
         * VERIFY_CA is as strict as VERIFY_IDENTITY here. (Connector/C
         * 3.3 enforces TLS only with the verification on: REQUIRED is
         * checked after the connect, my_connect().) */
        mysql_optionsv(m, MYSQL_OPT_SSL_VERIFY_SERVER_CERT,
                       o->ssl_mode >= SSL_VERIFY_CA ? &yes : &no);
}

/* The library initialised, the URL parsed into u and its parameters
 * into o (both to be freed by the caller on success). */
static int
connect_url(kinbox__db_t *db, kinbox__dburl_t *u, struct myopts *o)
{
        char ebuf[256];
        pthread_once(&my_once, my_lib_init);
        if (my_lib_rc) {
                kinbox__db_seterr(db, KINBOX_ERR_DB, "", 0, -1,
                                  "MySQL: client library init failed");
                return KINBOX_ERR_DB;
        }
        if (kinbox__dburl_parse(db->url, u, ebuf, sizeof(ebuf))) {
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1, "%s",
                                  ebuf);
                return KINBOX_ERR_INVALID;
        }
        if (u->backend != KINBOX_BACKEND_MYSQL) {
                kinbox__dburl_free(u);
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1,
                                  "MySQL backend given a non-mysql:// URL");
                return KINBOX_ERR_INVALID;
        }
        if (url_options(u->params, o, ebuf, sizeof(ebuf))) {
                myopts_free(o);
                kinbox__dburl_free(u);
                kinbox__db_seterr(db, KINBOX_ERR_INVALID, "", 0, -1, "%s",
                                  ebuf);
                return KINBOX_ERR_INVALID;
        }
        return KINBOX_OK;
}

/* The connected session's settings; the queue's flush size from the
 * server's max_allowed_packet. */
static int
connect_setup(kinbox__db_t *db, struct mystate *s, bool returning)
{
        MYSQL *m = db->native;
        static const char setup[] =
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;\n"
            "SET SESSION sql_mode = '" MY_SQL_MODE "';\n"
            /* English error texts: the violated key's name is read from
             * error 1062's text (the code itself decides it is one). */
            "SET SESSION lc_messages = 'en_US';\n"
            "SELECT @@max_allowed_packet";
        static const int setup_tags[4] = {-1, -1, -1, -1};
        struct kinbox_rows_s *r = NULL;
        int rc = kinbox__my_roundtrip(db, setup, sizeof(setup) - 1, setup_tags,
                                      4, &r, false);
        if (rc) {
                kinbox_rows_destroy(r);
                kinbox__my_mark_down(db);
                return rc;
        }
        unsigned long long map = 0;
        if (r->nrows == 1 && r->ncols == 1 && r->values[0])
                map = strtoull(r->values[0], NULL, 10);
        kinbox_rows_destroy(r);
        const char *info = mysql_get_server_info(m);
        s->returning = returning && info && strstr(info, "MariaDB") &&
                       mysql_get_server_version(m) >= 100500;
        /* Leave room for one more statement of similar size. */
        s->flush_at = map > 1024 ? (size_t)(map / 2) : 1u << 20;
        if (s->flush_at > MY_FLUSH_CAP)
                s->flush_at = MY_FLUSH_CAP;
        return KINBOX_OK;
}

int
kinbox__my_connect(kinbox__db_t *db)
{
        kinbox__dburl_t u;
        struct myopts o;
        int rc;

        kinbox__my_disconnect(db);
        if ((rc = connect_url(db, &u, &o)))
                return rc;
        unsigned int off = 0;
        unsigned int ct = o.ct, rt = o.rt, wt = o.wt;
        bool returning = o.returning;

        struct mystate *s = kinbox__calloc(1, sizeof(*s));
        MYSQL *m = s ? mysql_init(NULL) : NULL;
        if (!m) {
                free(s);
                myopts_free(&o);
                kinbox__dburl_free(&u);
                return kinbox__my_oom(db);
        }
        s->next_flags = ST_EFF;
        kinbox__buf_init(&s->q);
        kinbox__buf_init(&s->tmp);
        mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
        mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &ct);
        mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &rt);
        mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &wt);
        /* LOAD DATA LOCAL lets a server read client files: never needed. */
        mysql_options(m, MYSQL_OPT_LOCAL_INFILE, &off);
        my_tls_options(m, &o);
        bool need_tls = o.ssl_mode >= SSL_REQUIRED;
        myopts_free(&o);

        const char *pw = db->password ? db->password : u.password;
        MYSQL *ok = mysql_real_connect(m, u.host, u.user, pw, u.dbname,
                                       (unsigned int)u.port, NULL,
                                       CLIENT_MULTI_STATEMENTS);
        kinbox__dburl_free(&u);
        db->native = m;
        db->impl = s;
        if (!ok) {
                unsigned int e = mysql_errno(m);
                /* Refused credentials or a missing database will not heal
                 * by reconnecting; everything else might. */
                int code = (e == 1044 || e == 1045 || e == 1049)
                               ? KINBOX_ERR_DB
                               : KINBOX_ERR_DB_CONN;
                kinbox__db_seterr(db, code, "", (int)e, -1,
                                  "MySQL %u (%s): connect: %s", e,
                                  mysql_sqlstate(m), mysql_error(m));
                kinbox__my_mark_down(db);
                return code;
        }
        if (need_tls && !mysql_get_ssl_cipher(m)) {
                /* Before any statement: nothing of the application's
                 * went over the plaintext connection. */
                kinbox__db_seterr(db, KINBOX_ERR_DB, "", 2026, -1,
                                  "MySQL: connect: ssl-mode=REQUIRED but the "
                                  "server did not negotiate TLS (is it "
                                  "started with ssl_cert and ssl_key?)");
                kinbox__my_mark_down(db);
                return KINBOX_ERR_DB;
        }
        return connect_setup(db, s, returning);
}
