/*
 * hold.c -- per-key holds (dead_letter.hold_key): the set of keys held on
 * a partition, a message's held key, parking the followers of a dead
 * letter's key (the batch's hooks), loading the holds at assignment;
 * hold_release.c releases them once the blocker was replayed or
 * discarded. See hold.h and docs/operations.md, "Holding a key".
 */
#include "hold_int.h"
#include "fate.h"
#include "hdrcodec.h"
#include "metrics.h"
#include "tx.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* the set of keys held on a partition: open addressing, linear probing */

static uint64_t
hkey_hash(const void *k, size_t n)
{
        uint64_t h = 1469598103934665603u;
        const unsigned char *p = k;
        for (size_t i = 0; i < n; i++)
                h = (h ^ p[i]) * 1099511628211u;
        return h;
}

hent_t *
kinbox__hs_find(struct kinbox__holdset *s, const void *k, size_t n)
{
        if (!s || !s->n)
                return NULL;
        uint64_t h = hkey_hash(k, n);
        for (size_t i = h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
                hent_t *e = &s->e[i];
                if (!e->key)
                        return NULL;
                if (e->hash == h && e->len == n && !memcmp(e->key, k, n))
                        return e;
        }
}

static bool
hs_grow(struct kinbox__holdset *s)
{
        size_t cap = s->cap ? s->cap * 2 : 16;
        hent_t *ne = kinbox__calloc(cap, sizeof(*ne));
        if (!ne)
                return false;
        for (size_t i = 0; i < s->cap; i++) {
                if (!s->e[i].key)
                        continue;
                size_t j = s->e[i].hash & (cap - 1);
                while (ne[j].key)
                        j = (j + 1) & (cap - 1);
                ne[j] = s->e[i];
        }
        free(s->e);
        s->e = ne;
        s->cap = cap;
        return true;
}

/* Add key k (blocker at offset off) unless present; NULL on no memory. */
hent_t *
kinbox__hs_add(struct kinbox__holdset **sp, const void *k, size_t n,
               int64_t off)
{
        if (!*sp && !(*sp = kinbox__calloc(1, sizeof(**sp))))
                return NULL;
        struct kinbox__holdset *s = *sp;
        hent_t *e = kinbox__hs_find(s, k, n);
        if (e)
                return e;
        if ((s->n + 1) * 2 > s->cap && !hs_grow(s))
                return NULL;
        uint64_t h = hkey_hash(k, n);
        size_t i = h & (s->cap - 1);
        while (s->e[i].key)
                i = (i + 1) & (s->cap - 1);
        unsigned char *copy = malloc(n ? n : 1);
        if (!copy)
                return NULL;
        memcpy(copy, k, n);
        s->e[i] = (hent_t){copy, n, h, off, 0, 0};
        s->n++;
        return &s->e[i];
}

/* Remove e (backward-shift deletion keeps probe chains whole). */
void
kinbox__hs_del(struct kinbox__holdset *s, hent_t *e)
{
        size_t i = (size_t)(e - s->e), mask = s->cap - 1;
        free(e->key);
        s->e[i].key = NULL;
        s->n--;
        for (size_t j = (i + 1) & mask; s->e[j].key; j = (j + 1) & mask) {
                size_t home = s->e[j].hash & mask;
                /* j's entry may move to the hole at i when its home is
                 * not in the cyclic range (i, j]. */
                bool stays =
                    i <= j ? (home > i && home <= j) : (home > i || home <= j);
                if (stays)
                        continue;
                s->e[i] = s->e[j];
                s->e[j].key = NULL;
                i = j;
        }
}

void
kinbox__hold_free(kinbox__part_t *p)
{
        struct kinbox__holdset *s = p->holds;
        if (!s)
                return;
        for (size_t i = 0; i < s->cap; i++)
                free(s->e[i].key);
        free(s->e);
        free(s);
        p->holds = NULL;
}

/* ------------------------------------------------------------------ */
/* configuration, the key of a message */

void
kinbox__hold_conf(kinbox_consumer_t *c, const kinbox_conf_t *conf)
{
        const kinbox__settings_t *s = kinbox__settings_of(conf);
        c->hold_on = s->dead_letter_hold_key;
        c->hold_src = kinbox__strdup(s->dead_letter_hold_key_source);
        c->release_poll = s->dead_letter_release_poll_ms;
        if (!c->hold_src)
                c->hold_on = false;
}

/* Look the message's held key up once (msgid.h's locator, the rule of
 * the message id: a repeated header is ambiguous). */
static void
msg_key_find(const kinbox_consumer_t *c, kinbox_msg_t *m)
{
        kinbox__field_t f;
        char why[160];
        kinbox__field_rc_t rc = kinbox__msgfield_locate(
            c->hold_src, &m->v, "held key", &f, why, sizeof(why));
        m->hkey_own = f.own;
        m->hkey_state = rc == KINBOX__FIELD_AMBIGUOUS ? KINBOX__HKEY_AMBIGUOUS
                                                      : KINBOX__HKEY_NONE;
        if (rc == KINBOX__FIELD_SET && f.n && f.n <= KINBOX__HOLD_KEY_MAX) {
                m->hkey = f.v;
                m->hkey_len = f.n;
                m->hkey_state = KINBOX__HKEY_SET;
        }
}

/* The message's held-key value, or false when it has none. */
static bool
msg_key(const kinbox_consumer_t *c, kinbox_msg_t *m, const void **k, size_t *n)
{
        if (m->hkey_state == KINBOX__HKEY_UNKNOWN)
                msg_key_find(c, m);
        *k = m->hkey;
        *n = m->hkey_len;
        return m->hkey_state == KINBOX__HKEY_SET;
}

bool
kinbox__hold_ambiguous(const kinbox_consumer_t *c, kinbox_msg_t *m, char *why,
                       size_t wsz)
{
        /* Only a header can be repeated: other sources cost nothing. */
        if (!c->hold_on || strncmp(c->hold_src, "header:", 7))
                return false;
        if (m->hkey_state == KINBOX__HKEY_UNKNOWN)
                msg_key_find(c, m);
        if (m->hkey_state != KINBOX__HKEY_AMBIGUOUS)
                return false;
        kinbox__field_t f; /* again, for the reason (a header: nothing own) */
        kinbox__msgfield_locate(c->hold_src, &m->v, "held key", &f, why, wsz);
        return true;
}

/* ------------------------------------------------------------------ */
/* batch hooks */

/* Parameters of the hold / parked statements: consumer, topic,
 * partition, key (binary), then the rest. */
typedef struct hparams {
        char part[16], off[24], boff[24];
} hparams_t;

static const char SQL_PARK[] =
    "INSERT INTO kinbox_parked (consumer, topic, kafka_partition, "
    "hold_key, kafka_offset, message_id, msg_key, headers, payload) VALUES "
    "($1, $2, $3, $4, $5, $6, $7, $8, $9)";

bool
kinbox__hold_park(kinbox__batch_t *b, size_t i)
{
        kinbox_consumer_t *c = b->c;
        kinbox_msg_t *m = b->msgs[i];
        struct kinbox__holdset *s = m->part->holds;
        if (!c->hold_on || ((!s || !s->n) && !b->hold_dead))
                return false;
        const void *k;
        size_t n;
        if (!msg_key(c, m, &k, &n))
                return false;
        hent_t *e = kinbox__hs_find(s, k, n);
        if (e) {
                m->hold_off = e->blocker_off;
                return true;
        }
        for (size_t j = 0; j < i; j++) {
                kinbox_msg_t *d = b->msgs[j];
                const void *dk;
                size_t dn;
                if (b->run[j].state == KINBOX__MSG_DEAD &&
                    d->part == m->part && msg_key(c, d, &dk, &dn) && dn == n &&
                    !memcmp(dk, k, n)) {
                        m->hold_off = d->rkm->offset;
                        return true;
                }
        }
        return false;
}

/* The hold row of m's key, blocker at offset boff: inserted, or (when it
 * exists) locked and kept, so that a release of the key waits for us. */
static int
queue_hold(kinbox__batch_t *b, kinbox_msg_t *m, int64_t boff)
{
        kinbox_consumer_t *c = b->c;
        hparams_t h;
        snprintf(h.part, sizeof(h.part), "%" PRId32, m->part->partition);
        snprintf(h.boff, sizeof(h.boff), "%" PRId64, boff);
        kinbox__param_t p[5] = {{c->name, 0, 0},
                                {m->part->topic, 0, 0},
                                {h.part, 0, 0},
                                {m->hkey, m->hkey_len, 1},
                                {h.boff, 0, 0}};
        return b->db->ops->exec(b->db, b->db->ops->sql->hold_upsert, 5, p, -1);
}

int
kinbox__hold_queue_park(kinbox__batch_t *b, kinbox_msg_t *m)
{
        kinbox_consumer_t *c = b->c;
        int rc = queue_hold(b, m, m->hold_off);
        if (rc)
                return rc;
        hparams_t h;
        snprintf(h.part, sizeof(h.part), "%" PRId32, m->part->partition);
        snprintf(h.off, sizeof(h.off), "%" PRId64, m->rkm->offset);
        kinbox__buf_t hb;
        kinbox__buf_init(&hb);
        kinbox__headers_json(m, &hb);
        if (hb.oom) {
                kinbox__buf_free(&hb);
                return KINBOX_ERR_NOMEM;
        }
        kinbox__param_t p[9] = {{c->name, 0, 0},
                                {m->part->topic, 0, 0},
                                {h.part, 0, 0},
                                {m->hkey, m->hkey_len, 1},
                                {h.off, 0, 0},
                                {m->id, 0, 0},
                                {m->rkm->key, m->rkm->key_len, 1},
                                {hb.p, 0, 0},
                                {m->rkm->payload, m->rkm->len, 1}};
        rc = b->db->ops->exec(b->db, SQL_PARK, 9, p, -1);
        kinbox__buf_free(&hb);
        return rc;
}

int
kinbox__hold_block(kinbox__batch_t *b, kinbox_msg_t *m)
{
        kinbox_consumer_t *c = b->c;
        const void *k;
        size_t n;
        if (!msg_key(c, m, &k, &n))
                return KINBOX_OK;
        return queue_hold(b, m, m->rkm->offset);
}

bool
kinbox__hold_followers(kinbox__batch_t *b, const size_t *idx, size_t n)
{
        kinbox_consumer_t *c = b->c;
        for (size_t a = 0; a < n; a++) {
                kinbox_msg_t *d = b->msgs[idx[a]];
                const void *dk, *k;
                size_t dn, kn;
                if (b->run[idx[a]].state != KINBOX__MSG_DEAD ||
                    !msg_key(c, d, &dk, &dn))
                        continue;
                for (size_t j = a + 1; j < n; j++) {
                        kinbox_msg_t *m = b->msgs[idx[j]];
                        if (b->run[idx[j]].state == KINBOX__MSG_RUN &&
                            m->part == d->part && msg_key(c, m, &k, &kn) &&
                            kn == dn && !memcmp(k, dk, dn))
                                return true;
                }
        }
        return false;
}

void
kinbox__hold_committed(kinbox__batch_t *b)
{
        kinbox_consumer_t *c = b->c;
        if (!c->hold_on)
                return;
        for (size_t i = 0; i < b->nmsgs; i++) {
                kinbox_msg_t *m = b->msgs[i];
                kinbox__run_t *ru = &b->run[i];
                const void *k;
                size_t n;
                if (ru->state != KINBOX__MSG_DEAD || !msg_key(c, m, &k, &n))
                        continue;
                if (!kinbox__hs_add(&m->part->holds, k, n, m->rkm->offset))
                        kinbox__log(&c->lg, KINBOX_LOG_ERR, "hold",
                                    "out of memory: a held key of %s [%" PRId32
                                    "] is known only to the database until "
                                    "the next release poll",
                                    m->part->topic, m->part->partition);
        }
}

/* ------------------------------------------------------------------ */
/* loading at assignment */

static const char SQL_LOAD[] =
    "SELECT h.hold_key, d.kafka_offset FROM kinbox_hold h JOIN "
    "kinbox_dead_letter d ON d.id = h.blocker_id WHERE h.consumer = $1 AND "
    "h.topic = $2 AND h.kafka_partition = $3";

bool
kinbox__hold_load(kinbox_consumer_t *c, kinbox__db_t *db, kinbox__part_t *p)
{
        if (!c->hold_on)
                return true;
        char part[16];
        snprintf(part, sizeof(part), "%" PRId32, p->partition);
        const char *vals[3] = {c->name, p->topic, part};
        kinbox_rows_t *rows = NULL;
        int rc = kinbox__db_queryv(db, SQL_LOAD, 3, vals, &rows);
        if (rc == KINBOX_ERR_DB_CONN)
                rc = kinbox__db_queryv(db, SQL_LOAD, 3, vals, &rows);
        if (rc) {
                kinbox__log(&c->lg, KINBOX_LOG_ERR, "hold",
                            "%s [%" PRId32 "]: reading held keys: %s",
                            p->topic, p->partition, db->err.msg);
                return false;
        }
        for (size_t i = 0; i < kinbox_rows_count(rows); i++) {
                size_t n = 0;
                const char *k = kinbox_rows_value(rows, i, 0, &n);
                const char *o = kinbox_rows_value(rows, i, 1, NULL);
                if (k && o)
                        kinbox__hs_add(&p->holds, k, n, strtoll(o, NULL, 10));
        }
        if (p->holds && p->holds->n)
                kinbox__log(&c->lg, KINBOX_LOG_INFO, "hold",
                            "%s [%" PRId32 "]: %zu key(s) held", p->topic,
                            p->partition, p->holds->n);
        kinbox_rows_destroy(rows);
        return true;
}
