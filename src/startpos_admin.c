/*
 * startpos_admin.c -- `kinbox offsets`: a consumer's start positions as
 * the database and Kafka see them (W, C, L, H and the verdict of
 * kinbox_startpos_classify()), and the reset that moves both sides to
 * the same position.
 */
#include "admin_int.h"
#include "internal.h"
#include "kafka.h"
#include "settings.h"
#include "startpos.h"

#include <errno.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How long each broker request may take. */
#define ASK_MS 5000

void
kinbox_offsets_destroy(kinbox_offsets_t *o)
{
        if (!o)
                return;
        free(o->partitions);
        free(o);
}

/* The partition topic/part of o, added when missing; NULL: no memory. */
static kinbox_offsets_partition_t *
part_of(kinbox_offsets_t *o, size_t *cap, const char *topic, int32_t part)
{
        for (size_t i = 0; i < o->npartitions; i++)
                if (o->partitions[i].partition == part &&
                    !strcmp(o->partitions[i].topic, topic))
                        return &o->partitions[i];
        if (o->npartitions == *cap) {
                size_t nc = *cap ? *cap * 2 : 16;
                kinbox_offsets_partition_t *n =
                    realloc(o->partitions, nc * sizeof(*n));
                if (!n)
                        return NULL;
                o->partitions = n;
                *cap = nc;
        }
        kinbox_offsets_partition_t *p = &o->partitions[o->npartitions++];
        memset(p, 0, sizeof(*p));
        snprintf(p->topic, sizeof(p->topic), "%s", topic);
        p->partition = part;
        p->watermark = p->committed = p->low = p->high = p->target = -1;
        p->identity_checked = -1;
        return p;
}

static int
by_tp(const void *a, const void *b)
{
        const kinbox_offsets_partition_t *x = a, *y = b;
        int c = strcmp(x->topic, y->topic);
        return c ? c
                 : (x->partition > y->partition) -
                       (x->partition < y->partition);
}

/* Whether topic t is one of the consumer's `topics` (and the filter). */
static bool
wanted(const char *topics, const char *t, const char *only)
{
        if (only && strcmp(only, t))
                return false;
        size_t n = strlen(t);
        for (const char *p = topics; p && *p;) {
                size_t k = strcspn(p, ",");
                size_t s = 0, e = k;
                while (s < e && (p[s] == ' ' || p[s] == '\t'))
                        s++;
                while (e > s && (p[e - 1] == ' ' || p[e - 1] == '\t'))
                        e--;
                if (e - s == n && !memcmp(p + s, t, n))
                        return true;
                p += k + (p[k] ? 1 : 0);
        }
        return false;
}

/* The broker's partitions of each wanted topic. */
static kinbox_err_t
broker_parts(kinbox_admin_t *adm, rd_kafka_t *rk, const char *topics,
             const char *only, int32_t part, kinbox_offsets_t *o, size_t *cap)
{
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 1, NULL, &md, ASK_MS);
        if (e) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "broker metadata: %s", rd_kafka_err2str(e));
                return KINBOX_ERR_KAFKA;
        }
        kinbox_err_t rc = KINBOX_OK;
        for (int i = 0; i < md->topic_cnt && !rc; i++) {
                const struct rd_kafka_metadata_topic *t = &md->topics[i];
                if (t->err || !wanted(topics, t->topic, only))
                        continue;
                for (int k = 0; k < t->partition_cnt && !rc; k++)
                        if ((part < 0 || t->partitions[k].id == part) &&
                            !part_of(o, cap, t->topic, t->partitions[k].id))
                                rc = KINBOX_ERR_NOMEM;
        }
        rd_kafka_metadata_destroy(md);
        return rc;
}

/* C and [L, H) of each partition of o. */
static kinbox_err_t
kafka_side(kinbox_admin_t *adm, rd_kafka_t *rk, kinbox_offsets_t *o)
{
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new((int)o->npartitions + 1);
        for (size_t i = 0; i < o->npartitions; i++)
                rd_kafka_topic_partition_list_add(l, o->partitions[i].topic,
                                                  o->partitions[i].partition);
        rd_kafka_resp_err_t e =
            o->npartitions ? rd_kafka_committed(rk, l, ASK_MS) : 0;
        if (e) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "committed offsets of group %s: %s", o->group,
                         rd_kafka_err2str(e));
                rd_kafka_topic_partition_list_destroy(l);
                return KINBOX_ERR_KAFKA;
        }
        size_t n = (size_t)l->cnt + 1;
        int64_t *lo = kinbox__calloc(n, sizeof(*lo));
        int64_t *hi = kinbox__calloc(n, sizeof(*hi));
        rd_kafka_resp_err_t *le = kinbox__calloc(n, sizeof(*le));
        if (lo && hi && le)
                kinbox__log_ranges(rk, l, lo, hi, le, ASK_MS);
        for (size_t i = 0; lo && hi && le && i < o->npartitions; i++) {
                kinbox_offsets_partition_t *p = &o->partitions[i];
                rd_kafka_topic_partition_t *tp =
                    rd_kafka_topic_partition_list_find(l, p->topic,
                                                       p->partition);
                p->committed =
                    tp && !tp->err && tp->offset >= 0 ? tp->offset : -1;
                p->low = tp ? lo[tp - l->elems] : -1;
                p->high = tp ? hi[tp - l->elems] : -1;
        }
        kinbox_err_t rc = lo && hi && le ? KINBOX_OK : KINBOX_ERR_NOMEM;
        free(lo);
        free(hi);
        free(le);
        rd_kafka_topic_partition_list_destroy(l);
        return rc;
}

/* A record read at W-1 (or before it, compacted) compared with the
 * identity stored with the watermark: true when it settled its partition
 * (then paused: nothing more is read of it). */
static bool
identity_of(rd_kafka_t *rk, kinbox_offsets_t *o, const kinbox__wm_t *wms,
            size_t nwm, const rd_kafka_message_t *m)
{
        const char *t = m->rkt ? rd_kafka_topic_name(m->rkt) : NULL;
        const kinbox__wm_t *wm =
            t ? kinbox__wms_find(wms, nwm, t, m->partition) : NULL;
        kinbox_offsets_partition_t *p = NULL;
        for (size_t i = 0; t && i < o->npartitions && !p; i++)
                if (o->partitions[i].partition == m->partition &&
                    !strcmp(o->partitions[i].topic, t))
                        p = &o->partitions[i];
        if (m->err || !wm || !p || p->identity_checked >= 0)
                return false;
        rd_kafka_timestamp_type_t tt;
        int64_t ts = rd_kafka_message_timestamp(m, &tt);
        uint64_t h =
            kinbox__record_hash(m->key, m->key_len, m->payload, m->len);
        if (m->offset == wm->next_offset - 1)
                p->identity_checked = ts == wm->last_ts && h == wm->last_hash;
        else if (m->offset < wm->next_offset - 1)
                p->identity_checked = 0;
        /* Later: compacted away, not known. */
        if (!p->identity_checked)
                p->verdict = KINBOX_STARTPOS_INCARNATION;
        rd_kafka_topic_partition_list_t *one =
            rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(one, t, m->partition);
        rd_kafka_pause_partitions(rk, one);
        rd_kafka_topic_partition_list_destroy(one);
        return true;
}

/* KINBOX_OFFSETS_READ_LOG: read the record at W-1 of each partition whose
 * watermark carries an identity, and compare. */
static void
read_identities(const kinbox_conf_t *conf, kinbox_offsets_t *o,
                const kinbox__wm_t *wms, size_t nwm)
{
        /* librdkafka assigns and polls only with a group.id: one of its
         * own, never joined (assign only), nothing committed. */
        char g[300];
        snprintf(g, sizeof(g), "%s.kinbox-offsets-read", o->group);
        const char *const extra[] = {"group.id",
                                     g,
                                     "enable.auto.commit",
                                     "false",
                                     "enable.auto.offset.store",
                                     "false",
                                     "auto.offset.reset",
                                     "error",
                                     "log_level",
                                     "0",
                                     NULL};
        char e[256];
        kinbox_kafka_t *kk = kinbox_kafka_new(conf, extra, e, sizeof(e));
        if (!kk)
                return;
        rd_kafka_t *rk = kinbox__kafka_handle(kk);
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new(4);
        size_t left = 0;
        for (size_t i = 0; i < o->npartitions; i++) {
                kinbox_offsets_partition_t *p = &o->partitions[i];
                const kinbox__wm_t *wm =
                    kinbox__wms_find(wms, nwm, p->topic, p->partition);
                if (!wm || !wm->has_identity || p->low < 0 ||
                    p->watermark - 1 < p->low || p->watermark > p->high)
                        continue;
                rd_kafka_topic_partition_list_add(l, p->topic, p->partition)
                    ->offset = p->watermark - 1;
                left++;
        }
        if (left && !rd_kafka_assign(rk, l)) {
                int64_t end = kinbox__now_ms() + 2 * ASK_MS;
                while (left && kinbox__now_ms() < end) {
                        rd_kafka_message_t *m =
                            rd_kafka_consumer_poll(rk, 200);
                        if (!m)
                                continue;
                        if (identity_of(rk, o, wms, nwm, m))
                                left--;
                        rd_kafka_message_destroy(m);
                }
        }
        rd_kafka_topic_partition_list_destroy(l);
        kinbox_kafka_destroy(kk);
}

/* The group client: reads (and, for a reset, commits) the group's
 * offsets without joining it. */
static kinbox_kafka_t *
group_client(kinbox_admin_t *adm, const kinbox_conf_t *conf, const char *g)
{
        const char *const extra[] = {
            "group.id", g,   "enable.auto.commit", "false", "log_level",
            "0",        NULL};
        char e[512];
        kinbox_kafka_t *kk = kinbox_kafka_new(conf, extra, e, sizeof(e));
        if (!kk)
                snprintf(adm->errstr, sizeof(adm->errstr), "%s", e);
        return kk;
}

/* W, C, L, H and the verdicts, with the group client kk. */
static kinbox_err_t
gather(kinbox_admin_t *adm, const kinbox_conf_t *conf, rd_kafka_t *rk,
       const char *topic, int32_t partition, int flags, kinbox_offsets_t *o)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        kinbox__wm_t *wms = NULL;
        size_t nwm = 0, cap = 0;
        int rc = kinbox__wms_read(adm->db, o->consumer, &wms, &nwm);
        if (rc)
                return kinbox__admin_fail(adm, rc);
        kinbox_err_t ret =
            broker_parts(adm, rk, s->topics, topic, partition, o, &cap);
        for (size_t i = 0; !ret && i < nwm; i++) {
                if (!wanted(s->topics, wms[i].topic, topic) ||
                    (partition >= 0 && wms[i].partition != partition))
                        continue;
                kinbox_offsets_partition_t *p =
                    part_of(o, &cap, wms[i].topic, wms[i].partition);
                if (!p) {
                        ret = KINBOX_ERR_NOMEM;
                        break;
                }
                p->watermark = wms[i].next_offset;
                p->identity = wms[i].has_identity;
        }
        if (!ret)
                ret = kafka_side(adm, rk, o);
        for (size_t i = 0; !ret && i < o->npartitions; i++) {
                kinbox_offsets_partition_t *p = &o->partitions[i];
                p->verdict = kinbox_startpos_classify(
                    p->watermark, p->committed, p->low, p->high);
        }
        if (!ret && (flags & KINBOX_OFFSETS_READ_LOG))
                read_identities(conf, o, wms, nwm);
        if (!ret && o->npartitions)
                qsort(o->partitions, o->npartitions, sizeof(*o->partitions),
                      by_tp);
        kinbox__wms_free(wms, nwm);
        return ret;
}

static kinbox_err_t
run(kinbox_admin_t *adm, const kinbox_conf_t *conf, const char *topic,
    int32_t partition, int flags, kinbox_offsets_t **outp,
    kinbox_kafka_t **kkp)
{
        *outp = NULL;
        adm->errstr[0] = '\0';
        if (!conf) {
                snprintf(adm->errstr, sizeof(adm->errstr), "no configuration");
                return KINBOX_ERR_INVALID;
        }
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        kinbox_offsets_t *o = kinbox__calloc(1, sizeof(*o));
        if (!o)
                return KINBOX_ERR_NOMEM;
        snprintf(o->consumer, sizeof(o->consumer), "%s", s->name);
        snprintf(o->group, sizeof(o->group), "%s",
                 s->group_id ? s->group_id : s->name);
        kinbox_kafka_t *kk = group_client(adm, conf, o->group);
        kinbox_err_t rc = kk ? KINBOX_OK : KINBOX_ERR_CONFIG;
        if (!rc)
                rc = gather(adm, conf, kinbox__kafka_handle(kk), topic,
                            partition, flags, o);
        if (rc) {
                kinbox_kafka_destroy(kk);
                kinbox_offsets_destroy(o);
                return rc;
        }
        *outp = o;
        if (kkp)
                *kkp = kk;
        else
                kinbox_kafka_destroy(kk);
        return KINBOX_OK;
}

kinbox_err_t
kinbox_offsets_list(kinbox_admin_t *adm, const kinbox_conf_t *conf,
                    const char *topic, int32_t partition, int flags,
                    kinbox_offsets_t **outp)
{
        if (!adm || !outp)
                return KINBOX_ERR_INVALID;
        return run(adm, conf, topic, partition, flags, outp, NULL);
}

/* Each partition's new position for `to`. */
static kinbox_err_t
targets(kinbox_admin_t *adm, kinbox_offsets_t *o, const char *to)
{
        char *end = NULL;
        errno = 0;
        long long n = strtoll(to, &end, 10);
        bool number = end != to && !*end && !errno && n >= 0;
        if (!number && strcmp(to, "earliest") && strcmp(to, "latest") &&
            strcmp(to, "committed") && strcmp(to, "watermark")) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "--to %s: expected earliest, latest, committed, "
                         "watermark or an offset",
                         to);
                return KINBOX_ERR_INVALID;
        }
        for (size_t i = 0; i < o->npartitions; i++) {
                kinbox_offsets_partition_t *p = &o->partitions[i];
                const char *why = NULL;
                if (p->low < 0 || p->high < 0)
                        why = "the broker has no such partition now";
                else if (number)
                        p->target = n;
                else if (!strcmp(to, "earliest"))
                        p->target = p->low;
                else if (!strcmp(to, "latest"))
                        p->target = p->high;
                else if (!strcmp(to, "committed"))
                        p->target = p->committed;
                else
                        p->target = p->watermark;
                if (!why && p->target < 0)
                        why = !strcmp(to, "committed")
                                  ? "Kafka has no committed offset"
                                  : "the database has no watermark";
                else if (!why && (p->target < p->low || p->target > p->high))
                        why = "the position is outside the log";
                if (why) {
                        snprintf(adm->errstr, sizeof(adm->errstr),
                                 "%s [%" PRId32 "]: --to %s: %s (log %" PRId64
                                 "..%" PRId64 ")",
                                 p->topic, p->partition, to, why, p->low,
                                 p->high);
                        return KINBOX_ERR_INVALID;
                }
        }
        return KINBOX_OK;
}

static bool
live_group(rd_kafka_resp_err_t e)
{
        return e == RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID ||
               e == RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION ||
               e == RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS ||
               e == RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID;
}

/* Kafka's side of a reset: commit the targets for the group. */
static kinbox_err_t
commit_targets(kinbox_admin_t *adm, rd_kafka_t *rk, const kinbox_offsets_t *o)
{
        rd_kafka_topic_partition_list_t *l =
            rd_kafka_topic_partition_list_new((int)o->npartitions);
        for (size_t i = 0; i < o->npartitions; i++)
                rd_kafka_topic_partition_list_add(l, o->partitions[i].topic,
                                                  o->partitions[i].partition)
                    ->offset = o->partitions[i].target;
        rd_kafka_resp_err_t e = rd_kafka_commit(rk, l, 0);
        for (int i = 0; !e && i < l->cnt; i++)
                e = l->elems[i].err;
        rd_kafka_topic_partition_list_destroy(l);
        if (!e)
                return KINBOX_OK;
        if (live_group(e)) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "group %s has live members (%s): stop the "
                         "consumers of group %s first; nothing was changed",
                         o->group, rd_kafka_err2str(e), o->group);
                return KINBOX_ERR_STATE;
        }
        snprintf(adm->errstr, sizeof(adm->errstr),
                 "committing offsets for group %s: %s; nothing was changed",
                 o->group, rd_kafka_err2str(e));
        return KINBOX_ERR_KAFKA;
}

/* The database's side of a reset, in one transaction. */
static kinbox_err_t
write_targets(kinbox_admin_t *adm, const kinbox_offsets_t *o)
{
        kinbox__db_t *db = adm->db;
        int rc = db->native ? KINBOX_OK : kinbox__db_connect(db);
        if (!rc)
                rc = db->ops->begin(db);
        for (size_t i = 0; !rc && i < o->npartitions; i++) {
                const kinbox_offsets_partition_t *p = &o->partitions[i];
                char part[16], off[24];
                snprintf(part, sizeof(part), "%" PRId32, p->partition);
                snprintf(off, sizeof(off), "%" PRId64, p->target);
                kinbox__param_t k[4] = {{o->consumer, 0, 0},
                                        {p->topic, 0, 0},
                                        {part, 0, 0},
                                        {off, 0, 0}};
                rc = db->ops->exec(db,
                                   "DELETE FROM kinbox_offsets WHERE "
                                   "consumer = $1 AND topic = $2 AND "
                                   "kafka_partition = $3",
                                   3, k, -1);
                if (!rc)
                        rc = db->ops->exec(
                            db,
                            "INSERT INTO kinbox_offsets (consumer, topic, "
                            "kafka_partition, next_offset) VALUES ($1, $2, "
                            "$3, $4)",
                            4, k, -1);
        }
        if (!rc)
                rc = db->ops->commit(db);
        if (rc) {
                kinbox_err_t r = kinbox__admin_fail(adm, rc);
                char m[sizeof(adm->errstr) - 96];
                memcpy(m, adm->errstr, sizeof(m) - 1);
                m[sizeof(m) - 1] = '\0';
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "Kafka's offsets were moved but the watermarks "
                         "were not (%s): run the reset again",
                         m);
                return r;
        }
        return KINBOX_OK;
}

kinbox_err_t
kinbox_offsets_reset(kinbox_admin_t *adm, const kinbox_conf_t *conf,
                     const char *topic, int32_t partition, const char *to,
                     int dry_run, kinbox_offsets_t **outp)
{
        if (!adm || !outp || !to)
                return KINBOX_ERR_INVALID;
        kinbox_kafka_t *kk = NULL;
        kinbox_offsets_t *o = NULL;
        kinbox_err_t rc = run(adm, conf, topic, partition, 0, &o, &kk);
        if (!rc && !o->npartitions) {
                snprintf(adm->errstr, sizeof(adm->errstr),
                         "no partition of consumer %s matches", o->consumer);
                rc = KINBOX_ERR_NOT_FOUND;
        }
        if (!rc)
                rc = targets(adm, o, to);
        if (!rc && !dry_run)
                rc = commit_targets(adm, kinbox__kafka_handle(kk), o);
        if (!rc && !dry_run)
                rc = write_targets(adm, o);
        kinbox_kafka_destroy(kk);
        if (rc) {
                kinbox_offsets_destroy(o);
                return rc;
        }
        *outp = o;
        return KINBOX_OK;
}
