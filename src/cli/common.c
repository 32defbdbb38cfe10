/*
 * common.c -- what the operator commands share beyond options (opts.c)
 * and output (out.c): the configuration-and-database context, the
 * broker's view of a consumer group, the interval wait of the services.
 */
#include "common.h"
#include "schema.h"
#include "internal.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

bool
kb_nap(pthread_mutex_t *lock, pthread_cond_t *cond, const volatile int *stop,
       int64_t ms)
{
        struct timespec ts;
        kinbox__deadline(ms, &ts);
        pthread_mutex_lock(lock);
        while (!*stop && pthread_cond_timedwait(cond, lock, &ts) == 0)
                ;
        bool stopped = *stop;
        pthread_mutex_unlock(lock);
        return stopped;
}

int
ctx_open(ctx_t *x)
{
        /* A schema this binary does not know (older or newer) is refused
         * before any command reads or changes it. */
        int ex = kb_schema_load(x->o.config, &x->cfg, x->o.cmd, false);
        if (ex)
                return ex;
        x->loaded = true;
        char err[2048];
        x->adm = kinbox_admin_new(x->cfg.base, err, sizeof(err));
        if (!x->adm) {
                fprintf(stderr, "kinbox %s: %s\n", x->o.cmd, err);
                return KB_EX_USAGE;
        }
        /* Reachability up front: one clear error instead of several. */
        if (kinbox_admin_ping(x->adm)) {
                fprintf(stderr, "kinbox %s: database unreachable: %s\n",
                        x->o.cmd, kinbox_admin_errstr(x->adm));
                return KB_EX_DB;
        }
        return KB_EX_OK;
}

/* Consumer name's slot in x->cfg (a new one, topics empty), or -1. */
static int
discovered_slot(ctx_t *x, const char *name)
{
        kb_config_t *c = &x->cfg;
        if (c->nconsumers &&
            !strcmp(c->consumers[c->nconsumers - 1].name, name))
                return c->nconsumers - 1;
        if (c->nconsumers == KB_MAX_CONSUMERS)
                return -1;
        int i = c->nconsumers;
        char e[300];
        c->consumers[i].name = strdup(name);
        c->consumers[i].conf = kinbox_conf_dup(c->base);
        c->consumers[i].discovered = true;
        if (!c->consumers[i].name || !c->consumers[i].conf ||
            kinbox_conf_set(c->consumers[i].conf, "name", name, e, sizeof(e)))
                return -1;
        c->nconsumers++;
        c->consumers[i].settings = kinbox_conf_dup(c->consumers[i].conf);
        return i;
}

int
ctx_discover(ctx_t *x)
{
        if (x->cfg.nconsumers)
                return KB_EX_OK;
        kinbox_rows_t *r = NULL;
        kinbox_err_t rc = kinbox_admin_consumers(x->adm, &r);
        if (rc)
                return db_fail(x, rc);
        int ex = KB_EX_OK;
        for (size_t i = 0; i < kinbox_rows_count(r) && !ex; i++) {
                const char *name = rv(r, i, 0), *topic = rv(r, i, 1);
                int k = name ? discovered_slot(x, name) : -1;
                if (k < 0) {
                        fprintf(stderr,
                                "kinbox %s: more than %d consumers in the "
                                "database (or out of memory)\n",
                                x->o.cmd, KB_MAX_CONSUMERS);
                        ex = KB_EX_RUNTIME;
                        break;
                }
                kinbox_conf_t *conf = x->cfg.consumers[k].conf;
                const char *had = kinbox__settings_of(conf)->topics;
                char list[1024], e[300];
                snprintf(list, sizeof(list), "%s%s%s", had ? had : "",
                         had ? "," : "", topic ? topic : "");
                (void)kinbox_conf_set(conf, "topics", list, e, sizeof(e));
        }
        kinbox_rows_destroy(r);
        return ex;
}

void
ctx_close(ctx_t *x)
{
        kinbox_admin_destroy(x->adm);
        if (x->loaded)
                kb_config_free(&x->cfg);
}

int
kb_db_reachable(const kinbox_conf_t *conf, const char *cmd, const char *where)
{
        char err[2048];
        kinbox_admin_t *adm = kinbox_admin_new(conf, err, sizeof(err));
        if (!adm) {
                fprintf(stderr, "kinbox %s: %s%s%s\n", cmd, where,
                        *where ? ": " : "", err);
                return KB_EX_USAGE;
        }
        int ex = KB_EX_OK;
        if (kinbox_admin_ping(adm)) {
                fprintf(stderr, "kinbox %s: %s%sdatabase unreachable: %s\n",
                        cmd, where, *where ? ": " : "",
                        kinbox_admin_errstr(adm));
                ex = KB_EX_DB;
        }
        kinbox_admin_destroy(adm);
        return ex;
}

int
kb_exit_of(kinbox_err_t rc)
{
        switch (rc) {
        case KINBOX_OK:
                return KB_EX_OK;
        case KINBOX_ERR_DB_CONN:
                return KB_EX_DB;
        case KINBOX_ERR_CONFIG:
        case KINBOX_ERR_INVALID:
        case KINBOX_ERR_UNKNOWN_KEY:
        case KINBOX_ERR_ABI:
        case KINBOX_ERR_SCHEMA:
                return KB_EX_USAGE;
        case KINBOX_ERR_NOT_FOUND:
                return KB_EX_NOTFOUND;
        default:
                return KB_EX_RUNTIME;
        }
}

int
db_fail(ctx_t *x, kinbox_err_t rc)
{
        fprintf(stderr, "kinbox %s: %s\n", x->o.cmd,
                kinbox_admin_errstr(x->adm));
        return kb_exit_of(rc);
}

const char *
rv(kinbox_rows_t *r, size_t i, int c)
{
        return kinbox_rows_value(r, i, c, NULL);
}

const char *
group_of(kinbox_conf_t *conf)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        return s->group_id ? s->group_id : s->name;
}

const char *
consumer_section(ctx_t *x, const char *name, kinbox_conf_t **conf)
{
        for (int i = 0; i < x->cfg.nconsumers; i++)
                if (!strcmp(x->cfg.consumers[i].name, name)) {
                        *conf = x->cfg.consumers[i].conf;
                        return x->cfg.consumers[i].name;
                }
        return NULL;
}

static const char *
pos(char *b, size_t sz, int64_t v)
{
        if (v < 0)
                snprintf(b, sz, "none");
        else
                snprintf(b, sz, "%" PRId64, v);
        return b;
}

void
kb_start_refusal(const kinbox_offsets_partition_t *p, char *buf, size_t sz)
{
        char w[24], c[24], l[24], h[24];
        snprintf(buf, sz,
                 "%s [%d]: start refused (%s): %s; DB watermark %s, Kafka "
                 "committed %s, log %s..%s (kinbox offsets list / reset)",
                 p->topic, (int)p->partition, kinbox_startpos_name(p->verdict),
                 kinbox_startpos_reason(p->verdict),
                 pos(w, sizeof(w), p->watermark),
                 pos(c, sizeof(c), p->committed), pos(l, sizeof(l), p->low),
                 pos(h, sizeof(h), p->high));
}

int
kb_start_refusals(const kinbox_offsets_t *o, json_t *ja, FILE *out,
                  const char *prefix, const char *name)
{
        int n = 0;
        for (size_t i = 0; i < o->npartitions; i++) {
                const kinbox_offsets_partition_t *p = &o->partitions[i];
                if (!kinbox_startpos_refused(p->verdict))
                        continue;
                char msg[1024];
                kb_start_refusal(p, msg, sizeof(msg));
                json_array_append_new(ja, json_string(msg));
                if (out)
                        fprintf(out, "%s%s: %s\n", prefix, name, msg);
                n++;
        }
        return n;
}
