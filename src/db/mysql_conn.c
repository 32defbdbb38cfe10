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
        if (kinbox__dburl_split(db->url, u, ebuf, sizeof(ebuf))) {
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
