/*
 * ini.c -- INI file → kinbox_conf_t objects (libinih).
 *
 * [database] url, password_file      → database.*
 * [kafka]    any librdkafka property → kafka.*
 * [log]      level, format           → log.*
 * [prune]    inbox.retention, ...     (keys as in the reference)
 * [reconcile] interval, grace         → reconcile.*
 * [relay]    enabled, and relay.* keys without the prefix
 * [metrics]  listen
 * [console]  enabled, token_file, allow_remote → console.*
 * [consumer.NAME] consumer keys; name = NAME
 */
#include "config.h"
#include "confval.h"
#include "internal.h"

#include <ini.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct load {
        kb_config_t *cfg;
        char *err;
        size_t errsz;
        const char *path;
        int line;
        bool failed;
        /* Settings seen before the consumer sections are copied later:
         * collect every (key, value) of shared sections in order. */
        struct kvs {
                char *k, *v;
        } shared[256];
        int nshared;
        struct ckv {
                int consumer;
                char *k, *v;
        } ckv[1024];
        int nckv;
        struct kvs relay[64];
        int nrelay;
        char *last_section; /* to tell a repeated [consumer.NAME] */
        rd_kafka_conf_t *rk; /* [kafka] keys tried here: unknown ones */
} load_t;

typedef struct kb_buf {
        char *p;
        size_t len, cap;
        bool oom;
} kb_buf_t;

static void
kb_buf_add(kb_buf_t *b, const char *s, size_t n)
{
        if (b->oom || !n)
                return;
        if (b->len + n > b->cap) {
                size_t cap = b->cap ? b->cap : 64;
                while (cap < b->len + n)
                        cap *= 2;
                char *q = realloc(b->p, cap);
                if (!q) {
                        b->oom = true;
                        return;
                }
                b->p = q;
                b->cap = cap;
        }
        memcpy(b->p + b->len, s, n);
        b->len += n;
}

/* Expand ${VAR} and ${VAR:-default} from the environment. An unset
 * ${VAR} is an error naming the variable (an unset password variable must
 * not become an empty password); ${VAR:-default} takes the default when VAR
 * is unset or empty, as the shell does. Returns NULL with *bad set to the
 * variable's name (malloc'ed) when unset, NULL with *bad NULL on OOM. */
static char *
expand(const char *v, char **bad)
{
        kb_buf_t o = {0};
        *bad = NULL;
        for (const char *p = v; *p;) {
                const char *e;
                if (p[0] != '$' || p[1] != '{' || !(e = strchr(p + 2, '}'))) {
                        kb_buf_add(&o, p, 1);
                        p++;
                        continue;
                }
                const char *name = p + 2;
                const char *dflt = NULL;
                size_t nlen = (size_t)(e - name);
                const char *sep = memchr(name, ':', nlen);
                if (sep && sep + 1 < e && sep[1] == '-') {
                        dflt = sep + 2;
                        nlen = (size_t)(sep - name);
                }
                char *n = strndup(name, nlen);
                if (!n)
                        goto oom;
                const char *val = getenv(n);
                if (dflt && (!val || !*val)) {
                        kb_buf_add(&o, dflt, (size_t)(e - dflt));
                } else if (!val) {
                        *bad = n;
                        free(o.p);
                        return NULL;
                } else {
                        kb_buf_add(&o, val, strlen(val));
                }
                free(n);
                p = e + 1;
        }
        kb_buf_add(&o, "", 1);
        if (o.oom)
                goto oom;
        return o.p;
oom:
        free(o.p);
        return NULL;
}

static int
find_consumer(kb_config_t *cfg, const char *name)
{
        for (int i = 0; i < cfg->nconsumers; i++)
                if (!strcmp(cfg->consumers[i].name, name))
                        return i;
        return -1;
}

/* A section's keys arrive together: a section name we saw before, after
 * another one, is the same section written twice (an error). */
static bool
section_seen(load_t *L, const char *section)
{
        if (L->last_section && !strcmp(L->last_section, section))
                return true;
        if (!strncmp(section, "consumer.", 9) &&
            find_consumer(L->cfg, section + 9) >= 0) {
                snprintf(L->err, L->errsz,
                         "%s: [%s] appears twice (merge the two sections)",
                         L->path, section);
                L->failed = true;
                return false;
        }
        free(L->last_section);
        if (!(L->last_section = strdup(section))) {
                L->failed = true;
                snprintf(L->err, L->errsz, "out of memory");
                return false;
        }
        return true;
}

/* A section header written twice anywhere in the file (libinih would
 * merge the two, also when they follow each other: its handler sees keys,
 * not headers). Returns the line of the second one (error in errstr) or 0;
 * fp is rewound. */
static int
repeated_section(FILE *fp, const char *path, char *errstr, size_t sz)
{
        char buf[1024], *names[256];
        int lines[256], n = 0, line = 0, found = 0;
        while (!found && fgets(buf, sizeof(buf), fp)) {
                line++;
                char *p = buf + strspn(buf, " \t");
                char *end = *p == '[' ? strchr(p, ']') : NULL;
                if (!end)
                        continue;
                *end = '\0';
                for (int i = 0; i < n && !found; i++)
                        if (!strcmp(names[i], p + 1)) {
                                snprintf(errstr, sz,
                                         "%s:%d: [%s] appears twice (first "
                                         "at line %d): merge the two sections",
                                         path, line, p + 1, lines[i]);
                                found = line;
                        }
                if (!found && n < 256 && (names[n] = strdup(p + 1)))
                        lines[n++] = line;
        }
        for (int i = 0; i < n; i++)
                free(names[i]);
        rewind(fp);
        return found;
}

/* libinih's limits: a line of at most INI_MAX_LINE - 3 characters (a
 * longer one is cut and its rest read as another line), a section name
 * of at most KB_INI_MAX_SECTION - 1 (cut silently; its ini.c's
 * MAX_SECTION). */
#define KB_INI_MAX_SECTION 50
#define KB_INI_LINE (INI_MAX_LINE - 3)
#define KB_INI_SECTION (KB_INI_MAX_SECTION - 1)

/* A line or a section header libinih would cut (a [consumer.NAME] with a
 * long NAME: a "syntax error", or a consumer named by its first 40
 * characters). Returns its line (error in errstr) or 0; fp is rewound. */
static int
over_limits(FILE *fp, const char *path, char *errstr, size_t sz)
{
        char buf[KB_INI_LINE + 3];
        int line = 0, found = 0;
        bool cont = false; /* buf continues the line before */
        while (!found && fgets(buf, sizeof(buf), fp)) {
                size_t n = strlen(buf);
                bool whole = n && buf[n - 1] == '\n';
                if (!cont)
                        line++;
                cont = !whole && !feof(fp);
                if (cont || (!whole && n > KB_INI_LINE)) {
                        snprintf(errstr, sz,
                                 "%s:%d: line longer than %d characters "
                                 "(the limit of the INI reader): shorten it "
                                 "(a long value can come from ${VAR})",
                                 path, line, KB_INI_LINE);
                        found = line;
                        break;
                }
                char *p = buf + strspn(buf, " \t");
                char *end = *p == '[' ? strchr(p, ']') : NULL;
                if (!end || end - p - 1 <= KB_INI_SECTION)
                        continue;
                found = line;
                *end = '\0';
                if (!strncmp(p + 1, "consumer.", 9))
                        snprintf(errstr, sz,
                                 "%s:%d: [%s]: the consumer name is %d "
                                 "characters long; at most %d (a section "
                                 "name has at most %d)",
                                 path, line, p + 1, (int)(end - p - 10),
                                 KB_INI_SECTION - 9, KB_INI_SECTION);
                else
                        snprintf(errstr, sz,
                                 "%s:%d: [%s]: a section name has at most %d "
                                 "characters",
                                 path, line, p + 1, KB_INI_SECTION);
        }
        rewind(fp);
        return found;
}

/* A failed key: the message is in L->err; v is freed. Returns 0 (stop). */
static int
kv_failed(load_t *L, char *v)
{
        L->failed = true;
        free(v);
        return 0;
}

static int
too_many(load_t *L, const char *where, char *v)
{
        snprintf(L->err, L->errsz, "%s: %s: too many settings", L->path,
                 where);
        return kv_failed(L, v);
}

/* librdkafka properties without a default (not in rd_kafka_conf_dump()):
 * candidates for "did you mean" beside those of the dump. */
static const char *const kafka_unset[] = {
    "bootstrap.servers",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "group.instance.id",
    "client.rack",
    "debug",
    "transactional.id",
    "sasl.oauthbearer.config",
};

/* A [kafka] key librdkafka does not know: the error (with the closest
 * property) in L->err, true. Values are left to librdkafka at start. */
static bool
kafka_unknown(load_t *L, const char *name, const char *v, const char *where)
{
        if (!strcmp(name, "redelivery.window")) /* kinbox's own */
                return false;
        if (!L->rk && !(L->rk = rd_kafka_conf_new()))
                return false;
        char e[512];
        if (rd_kafka_conf_set(L->rk, name, v, e, sizeof(e)) !=
            RD_KAFKA_CONF_UNKNOWN)
                return false;
        size_t cnt = 0;
        const char **dump = rd_kafka_conf_dump(L->rk, &cnt);
        size_t nk = sizeof(kafka_unset) / sizeof(kafka_unset[0]);
        const char **keys = calloc(cnt / 2 + nk + 1, sizeof(*keys));
        const char *near = NULL;
        if (keys) {
                size_t n = 0;
                for (size_t i = 0; i < nk; i++)
                        keys[n++] = kafka_unset[i];
                for (size_t i = 0; i + 1 < cnt; i += 2)
                        keys[n++] = dump[i];
                near = kinbox__closest(name, keys, n);
        }
        snprintf(L->err, L->errsz, "%s: %s: not a librdkafka property%s%s%s",
                 L->path, where, near ? " (did you mean \"" : "",
                 near ? near : "", near ? "\"?)" : "");
        free(keys);
        rd_kafka_conf_dump_free(dump, cnt);
        return true;
}

/* [metrics]: listen only. Takes v. */
static int
on_metrics(load_t *L, const char *name, char *v, const char *where)
{
        if (strcmp(name, "listen")) {
                snprintf(L->err, L->errsz, "%s: %s: [metrics] has no such key",
                         L->path, where);
                return kv_failed(L, v);
        }
        free(L->cfg->metrics_listen);
        L->cfg->metrics_listen = v;
        return 1;
}

/* [relay]: enabled here, the rest kept for the relay's conf. Takes v. */
static int
on_relay(load_t *L, const char *name, char *v, const char *where)
{
        if (!strcmp(name, "enabled")) {
                char e[300];
                if (kinbox__confval_bool("[relay] enabled", v,
                                         &L->cfg->relay_enabled, e,
                                         sizeof(e))) {
                        snprintf(L->err, L->errsz, "%s: %s", L->path, e);
                        return kv_failed(L, v);
                }
                free(v);
                return 1;
        }
        if (L->nrelay == 64)
                return too_many(L, where, v);
        char key[256];
        snprintf(key, sizeof(key), "%s%s",
                 strcmp(name, "name") ? "relay." : "", name);
        L->relay[L->nrelay].k = strdup(key);
        L->relay[L->nrelay++].v = v;
        return 1;
}

static int
on_kv(void *user, const char *section, const char *name, const char *value)
{
        /* Debian's libinih reports no line numbers to handlers: errors
         * name the section and key instead. */
        char where_buf[200];
        snprintf(where_buf, sizeof(where_buf), "[%s] %s", section, name);
        const char *where = where_buf;
        load_t *L = user;
        kb_config_t *cfg = L->cfg;
        if (L->failed)
                return 0;
        char key[256];
        if (!section_seen(L, section))
                return 0;
        char *unset = NULL;
        char *v = expand(value ? value : "", &unset);
        if (!v) {
                if (unset)
                        snprintf(L->err, L->errsz,
                                 "%s: %s: environment variable %s is not "
                                 "set (write ${%s:-default} for a default)",
                                 L->path, where, unset, unset);
                else
                        snprintf(L->err, L->errsz, "out of memory");
                free(unset);
                L->failed = true;
                return 0;
        }
        if (!strcmp(section, "database") || !strcmp(section, "log") ||
            !strcmp(section, "tracing") || !strcmp(section, "console")) {
                snprintf(key, sizeof(key), "%s.%s", section, name);
        } else if (!strcmp(section, "kafka")) {
                if (kafka_unknown(L, name, v, where))
                        return kv_failed(L, v);
                snprintf(key, sizeof(key), "kafka.%s", name);
        } else if (!strcmp(section, "prune")) {
                snprintf(key, sizeof(key), "%s", name);
        } else if (!strcmp(section, "reconcile")) {
                snprintf(key, sizeof(key), "reconcile.%s", name);
        } else if (!strcmp(section, "metrics")) {
                return on_metrics(L, name, v, where);
        } else if (!strcmp(section, "relay")) {
                return on_relay(L, name, v, where);
        } else if (!strncmp(section, "consumer.", 9) && section[9]) {
                int c = find_consumer(cfg, section + 9);
                if (c < 0) {
                        if (cfg->nconsumers == KB_MAX_CONSUMERS)
                                goto toomany;
                        c = cfg->nconsumers++;
                        cfg->consumers[c].name = strdup(section + 9);
                }
                if (L->nckv == 1024)
                        goto toomany;
                L->ckv[L->nckv].consumer = c;
                L->ckv[L->nckv].k = strdup(name);
                L->ckv[L->nckv++].v = v;
                return 1;
        } else {
                snprintf(L->err, L->errsz, "%s: %s: unknown section", L->path,
                         where);
                L->failed = true;
                free(v);
                return 0;
        }
        if (L->nshared == 256)
                goto toomany;
        /* Validate now for a precise line number. */
        char e[300];
        if (kinbox_conf_set(cfg->base, key, v, e, sizeof(e))) {
                snprintf(L->err, L->errsz, "%s: %s", L->path, e);
                L->failed = true;
                free(v);
                return 0;
        }
        free(v);
        return 1;
toomany:
        snprintf(L->err, L->errsz, "%s: %s: too many settings", L->path,
                 where);
        L->failed = true;
        free(v);
        return 0;
}

/* relay.source is how this database's outbox is relayed: the pruner,
 * `kinbox status`, `kinbox verify` and /metrics (which run on base) treat
 * event rows as published from the log when it is wal | binlog, [relay]
 * enabled or not. Copied from the relay's conf to base; non-zero when it
 * cannot be. */
static int
share_source(kb_config_t *cfg)
{
        if (!cfg->relay)
                return 0;
        char src[16];
        kinbox__conf_enum_text(
            "relay.source", (int)kinbox__settings_of(cfg->relay)->relay_source,
            src, sizeof(src));
        return kinbox_conf_set(cfg->base, "relay.source", src, NULL, 0);
}

/* Read L->path into L (base settings, the sections' keys); 0 or -1 with
 * L->err set. */
static int
parse_file(load_t *L)
{
        const char *path = L->path;
        FILE *fp = fopen(path, "r");
        if (!fp) {
                snprintf(L->err, L->errsz,
                         "%s: cannot open configuration file", path);
                return -1;
        }
        int dup = over_limits(fp, path, L->err, L->errsz);
        if (!dup)
                dup = repeated_section(fp, path, L->err, L->errsz);
        int line = dup ? 0 : ini_parse_file(fp, on_kv, L);
        fclose(fp);
        if (dup || L->failed)
                return -1;
        if (line) {
                snprintf(L->err, L->errsz, "%s:%d: syntax error", path, line);
                return -1;
        }
        return 0;
}

/* Each consumer's conf: base, its name, its section's keys; and the copy
 * that stays in cfg. 0 or -1 with L->err set. */
static int
build_consumers(load_t *L)
{
        kb_config_t *cfg = L->cfg;
        char e[300];
        for (int i = 0; i < cfg->nconsumers; i++) {
                kinbox_conf_t *c = kinbox_conf_dup(cfg->base);
                cfg->consumers[i].conf = c;
                if (!c || kinbox_conf_set(c, "name", cfg->consumers[i].name, e,
                                          sizeof(e))) {
                        snprintf(L->err, L->errsz, "consumer.%s: bad name",
                                 cfg->consumers[i].name);
                        return -1;
                }
        }
        for (int i = 0; i < L->nckv; i++) {
                kinbox_conf_t *c = cfg->consumers[L->ckv[i].consumer].conf;
                if (kinbox_conf_set(c, L->ckv[i].k, L->ckv[i].v, e,
                                    sizeof(e))) {
                        snprintf(L->err, L->errsz, "%s: [consumer.%s] %s",
                                 L->path,
                                 cfg->consumers[L->ckv[i].consumer].name, e);
                        return -1;
                }
        }
        for (int i = 0; i < cfg->nconsumers; i++)
                if (!(cfg->consumers[i].settings =
                          kinbox_conf_dup(cfg->consumers[i].conf))) {
                        snprintf(L->err, L->errsz, "out of memory");
                        return -1;
                }
        return 0;
}

/* The relay's conf (base + [relay]), its relay.source shared with base,
 * and the file's path. 0 or -1 with L->err set. */
static int
build_relay(load_t *L)
{
        kb_config_t *cfg = L->cfg;
        cfg->relay = kinbox_conf_dup(cfg->base);
        for (int i = 0; cfg->relay && i < L->nrelay; i++) {
                char e[300];
                if (kinbox_conf_set(cfg->relay, L->relay[i].k, L->relay[i].v,
                                    e, sizeof(e))) {
                        snprintf(L->err, L->errsz, "%s: [relay] %s", L->path,
                                 e);
                        return -1;
                }
        }
        if (share_source(cfg)) {
                snprintf(L->err, L->errsz, "%s: [relay] source: bad value",
                         L->path);
                return -1;
        }
        cfg->path = realpath(L->path, NULL);
        if (!cfg->path && !(cfg->path = strdup(L->path))) {
                snprintf(L->err, L->errsz, "out of memory");
                return -1;
        }
        return 0;
}

static void
load_free(load_t *L)
{
        for (int i = 0; i < L->nckv; i++) {
                free(L->ckv[i].k);
                free(L->ckv[i].v);
        }
        for (int i = 0; i < L->nrelay; i++) {
                free(L->relay[i].k);
                free(L->relay[i].v);
        }
        free(L->last_section);
        if (L->rk)
                rd_kafka_conf_destroy(L->rk);
        free(L);
}

int
kb_config_load(const char *path, kb_config_t *cfg, char *errstr, size_t sz)
{
        memset(cfg, 0, sizeof(*cfg));
        cfg->base = kinbox_conf_new();
        load_t *L = calloc(1, sizeof(*L));
        if (!cfg->base || !L) {
                free(L);
                kb_config_free(cfg);
                snprintf(errstr, sz, "out of memory");
                return -1;
        }
        L->cfg = cfg;
        L->err = errstr;
        L->errsz = sz;
        L->path = path;
        int rc = parse_file(L);
        if (!rc)
                rc = build_consumers(L);
        if (!rc)
                rc = build_relay(L);
        load_free(L);
        if (rc)
                kb_config_free(cfg);
        return rc;
}

void
kb_config_free(kb_config_t *cfg)
{
        kinbox_conf_destroy(cfg->base);
        kinbox_conf_destroy(cfg->relay);
        for (int i = 0; i < cfg->nconsumers; i++) {
                free(cfg->consumers[i].name);
                kinbox_conf_destroy(cfg->consumers[i].conf);
                kinbox_conf_destroy(cfg->consumers[i].settings);
        }
        free(cfg->metrics_listen);
        free(cfg->path);
        memset(cfg, 0, sizeof(*cfg));
}
