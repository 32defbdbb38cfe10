/*
 * startpos.c -- start positions you can audit: the one classification of
 * a partition's start (database watermark W, Kafka's committed offset C,
 * the log's range [L, H)) that `kinbox run` applies at each assignment
 * and `kinbox offsets`, `verify` and `status` report; the identity of the
 * record at W-1 stored with each watermark; the watermark rows.
 * docs/failures.md, "Start positions".
 */
#include "startpos.h"
#include "internal.h"

#include <stdlib.h>
#include <string.h>

kinbox_startpos_t
kinbox_startpos_classify(int64_t w, int64_t c, int64_t low, int64_t high)
{
        if (w < 0)
                return c < 0 ? KINBOX_STARTPOS_NEW
                             : KINBOX_STARTPOS_UNKNOWN_GROUP;
        if (high >= 0 && w > high)
                return KINBOX_STARTPOS_PAST_END;
        if (low >= 0 && w < low)
                return KINBOX_STARTPOS_BEFORE_START;
        if (c > w)
                return KINBOX_STARTPOS_COMMITTED_AHEAD;
        if (c >= 0 && c < w)
                return KINBOX_STARTPOS_BEHIND;
        return KINBOX_STARTPOS_WATERMARK;
}

int
kinbox_startpos_refused(kinbox_startpos_t v)
{
        return v >= KINBOX_STARTPOS_UNKNOWN_GROUP;
}

static const struct {
        const char *name, *reason, *fix;
} texts[] = {
    {"new",
     "no watermark and no committed offset: a new consumer, starting per "
     "auto.offset.reset",
     ""},
    {"watermark", "starting at the database's watermark", ""},
    {"behind",
     "Kafka's committed offset is behind the watermark (a crash between "
     "the database's commit and the offset commit, or an offset reset to "
     "an earlier position): those records were applied here, starting at "
     "the watermark",
     ""},
    {"unknown_group",
     "Kafka has offsets committed for this group that this database never "
     "recorded (a new or restored database under a group that already "
     "consumed): starting there would apply none of the history",
     "--to earliest (apply the history) or --to committed (start where "
     "the group is)"},
    {"past_end",
     "the watermark is past the log's end (the topic was deleted and "
     "created again, or its log was truncated): its records were never "
     "applied here",
     "--to earliest"},
    {"before_start",
     "records between the watermark and the log's start are gone from the "
     "log before they were applied here (retention, deleted records, or "
     "another incarnation of the topic)",
     "--to earliest (accepting that they are lost)"},
    {"committed_ahead",
     "Kafka's committed offset is ahead of the watermark: starting there "
     "would skip records never applied here (an offset reset forward, or a "
     "database restored from a backup)",
     "--to committed (skip them) or --to watermark (apply them)"},
    {"incarnation",
     "the record at the watermark is not the one applied here (the topic "
     "was deleted and created again)",
     "--to earliest"},
};

const char *
kinbox_startpos_name(kinbox_startpos_t v)
{
        return (unsigned)v < KINBOX__ARRAY_SIZE(texts) ? texts[v].name : "?";
}

const char *
kinbox_startpos_reason(kinbox_startpos_t v)
{
        return (unsigned)v < KINBOX__ARRAY_SIZE(texts) ? texts[v].reason : "?";
}

const char *
kinbox__startpos_fix(kinbox_startpos_t v)
{
        return (unsigned)v < KINBOX__ARRAY_SIZE(texts) ? texts[v].fix : "";
}

static uint64_t
fnv_bytes(uint64_t h, const unsigned char *p, size_t n)
{
        for (size_t i = 0; i < n; i++)
                h = (h ^ p[i]) * 1099511628211ull;
        return h;
}

static uint64_t
fnv_len(uint64_t h, const void *p, size_t n)
{
        uint64_t v = p ? (uint64_t)n : UINT64_MAX;
        unsigned char b[8];
        for (int i = 0; i < 8; i++)
                b[i] = (unsigned char)(v >> (8 * i));
        return fnv_bytes(h, b, sizeof(b));
}

uint64_t
kinbox__record_hash(const void *key, size_t klen, const void *payload,
                    size_t plen)
{
        uint64_t h = 14695981039346656037ull;
        h = fnv_len(h, key, klen);
        if (key)
                h = fnv_bytes(h, key, klen);
        h = fnv_len(h, payload, plen);
        if (payload)
                h = fnv_bytes(h, payload, plen);
        return h;
}

void
kinbox__wms_free(kinbox__wm_t *w, size_t n)
{
        for (size_t i = 0; w && i < n; i++)
                free(w[i].topic);
        free(w);
}

int
kinbox__wms_read(kinbox__db_t *db, const char *consumer, kinbox__wm_t **out,
                 size_t *n)
{
        static const char sql[] =
            "SELECT topic, kafka_partition, next_offset, last_ts, last_hash "
            "FROM kinbox_offsets WHERE consumer = $1 ORDER BY topic, "
            "kafka_partition";
        const char *vals[1] = {consumer};
        kinbox_rows_t *rows = NULL;
        *out = NULL;
        *n = 0;
        int rc = kinbox__db_queryv(db, sql, 1, vals, &rows);
        if (rc == KINBOX_ERR_DB_CONN) /* a restarted server: once more */
                rc = kinbox__db_queryv(db, sql, 1, vals, &rows);
        if (rc)
                return rc;
        size_t cnt = kinbox_rows_count(rows);
        kinbox__wm_t *w = kinbox__calloc(cnt + 1, sizeof(*w));
        if (!w) {
                kinbox_rows_destroy(rows);
                return KINBOX_ERR_NOMEM;
        }
        for (size_t i = 0; i < cnt; i++) {
                const char *ts = kinbox_rows_value(rows, i, 3, NULL);
                const char *hs = kinbox_rows_value(rows, i, 4, NULL);
                w[i].topic =
                    kinbox__strdup(kinbox_rows_value(rows, i, 0, NULL));
                w[i].partition = (int32_t)strtol(
                    kinbox_rows_value(rows, i, 1, NULL), NULL, 10);
                w[i].next_offset =
                    strtoll(kinbox_rows_value(rows, i, 2, NULL), NULL, 10);
                w[i].has_identity = ts && hs;
                w[i].last_ts = ts ? strtoll(ts, NULL, 10) : -1;
                w[i].last_hash = hs ? (uint64_t)strtoll(hs, NULL, 10) : 0;
                if (!w[i].topic) {
                        kinbox_rows_destroy(rows);
                        kinbox__wms_free(w, cnt);
                        return KINBOX_ERR_NOMEM;
                }
        }
        kinbox_rows_destroy(rows);
        *out = w;
        *n = cnt;
        return KINBOX_OK;
}

const kinbox__wm_t *
kinbox__wms_find(const kinbox__wm_t *w, size_t n, const char *topic,
                 int32_t partition)
{
        for (size_t i = 0; i < n; i++)
                if (w[i].partition == partition && !strcmp(w[i].topic, topic))
                        return &w[i];
        return NULL;
}
