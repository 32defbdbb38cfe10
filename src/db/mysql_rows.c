/*
 * mysql_rows.c -- row maps of exec_values() statements (the attribution
 * contract of src/db.h on MariaDB).
 *
 * A batch handler's kinbox_tx_exec_values() rows keep their owners: when
 * such a statement fails, the server is asked which row failed
 * (rm_pin()) and, where nothing else of the call needs undoing
 * (rm_can_drop()), that message's rows are taken out and the rest of the
 * queue is sent again (rm_drop(); the loop is kinbox__my_q_send()).
 */
#include "mysql_int.h"

#include <stdlib.h>
#include <string.h>

/* The handler call a tag stands for (its flags stripped). */
static int
call_of(int t)
{
        return t < 0 ? t : t & ~(KINBOX__TAG_UNIQUE | KINBOX__TAG_CLAIM);
}

/* Whether call t is in the list of calls whose effects ran earlier. */
static bool
sent_has(const struct mystate *s, int t)
{
        for (size_t k = 0; k < s->nsent; k++)
                if (s->sent_tags[k] == call_of(t))
                        return true;
        return false;
}

static struct rowmap *rm_at(struct mystate *s, size_t stmt);

/* Append v to a growing int list; false when out of memory. */
static bool
ints_add(int **a, size_t *n, size_t *cap, int v)
{
        if (kinbox__grow(a, cap, *n + 1, sizeof(**a)))
                return false;
        (*a)[(*n)++] = v;
        return true;
}

/* The statements [0, upto) of q ran: note the handler calls whose plain
 * statements ran, and the owners of exec_values() rows that ran. */
void
kinbox__my_sent_note(struct mystate *s, size_t upto)
{
        bool ok = true;
        for (size_t k = 0; k < upto && k < s->ntags && ok; k++) {
                int t = s->tags[k];
                /* Only a batch handler's group call queues row maps: a
                 * per-message call's or kinbox's own statements never
                 * decide a drop (and are most of a per-message batch). */
                if (t < 0 || !(t & KINBOX__TAG_GROUP) ||
                    !(s->flags[k] & ST_EFF))
                        continue;
                struct rowmap *rm =
                    s->flags[k] & ST_VALUES ? rm_at(s, k) : NULL;
                if (rm) {
                        for (size_t r = 0; r < rm->n && ok; r++)
                                ok = ints_add(&s->ran_owners, &s->nran,
                                              &s->capran,
                                              KINBOX__TAG_LOW(rm->tags[r]));
                } else if (!sent_has(s, t)) {
                        ok = ints_add(&s->sent_tags, &s->nsent, &s->capsent,
                                      call_of(t));
                }
        }
        /* Forgetting would allow a wrong drop: none in this session. */
        if (!ok)
                s->no_rownum = true;
}

/* Whether a row of message mt ran in an earlier round trip. */
static bool
ran_has(const struct mystate *s, int mt)
{
        for (size_t k = 0; k < s->nran; k++)
                if (s->ran_owners[k] == KINBOX__TAG_LOW(mt))
                        return true;
        return false;
}

static struct rowmap *
rm_at(struct mystate *s, size_t stmt)
{
        for (size_t k = 0; k < s->nrmaps; k++)
                if (s->rmaps[k].stmt == stmt)
                        return &s->rmaps[k];
        return NULL;
}

/* Whether rm has a row of the message with tag mt. */
static bool
rm_owns(const struct rowmap *rm, int mt)
{
        for (size_t r = 0; rm && r < rm->n; r++)
                if (KINBOX__TAG_LOW(rm->tags[r]) == KINBOX__TAG_LOW(mt))
                        return true;
        return false;
}

/*
 * The statement that failed in the last round trip was an exec_values()
 * one: ask the server which of its rows failed (MariaDB 10.7+ keeps the
 * row number in the diagnostics area until the next statement) and charge
 * the failure to that row's owner (db->err.tag; err.stmt_tag stays the
 * statement's). Without an answer the statement's own tag stays. Returns
 * rc, or the error of a lost connection.
 */
int
kinbox__my_rm_pin(kinbox__db_t *db, int rc)
{
        struct mystate *s = st_get(db);
        if ((rc != KINBOX_ERR_DB && rc != KINBOX_ERR_DUPLICATE) ||
            s->no_rownum)
                return rc;
        struct rowmap *rm = rm_at(s, s->fail_stmt);
        if (!rm)
                return rc;
        static const char q[] =
            "GET DIAGNOSTICS CONDITION 1 @kinbox_row = ROW_NUMBER;\n"
            "SELECT @kinbox_row";
        static const int t2[2] = {-1, -1};
        kinbox__dberr_t saved = db->err;
        size_t f = s->fail_stmt;
        struct kinbox_rows_s *r = NULL;
        int drc = kinbox__my_roundtrip(db, q, sizeof(q) - 1, t2, 2, &r, false);
        if (!db->native) /* the connection went: that is the news now */
                return drc;
        s->fail_stmt = f; /* the statement that failed, not this one */
        long rn = 0;
        if (!drc && r && r->nrows == 1 && r->ncols >= 1 && r->values[0])
                rn = strtol(r->values[0], NULL, 10);
        else if (drc && db->err.vendor == 1064) /* no such item */
                s->no_rownum = true;
        kinbox_rows_destroy(r);
        db->err = saved;
        if (rn >= 1 && (size_t)rn <= rm->n)
                db->err.tag = rm->tags[rn - 1];
        return rc;
}

/*
 * Whether the failed exec_values() statement can go on without the row's
 * message (see rm_drop()): the consumer allows it (db->attr->drop_rows), no
 * COMMIT rides in the round trip, the failure can never succeed (a unique
 * violation, a permanent error), the server named the row, the handler
 * call that queued it has returned, no statement of that call that ran
 * carries the message's effect (nothing effectful of the call ran in an
 * earlier round trip; before it in this one only exec_values() rows of
 * other messages), and every statement of the call after it is an
 * exec_values() one.
 */
bool
kinbox__my_rm_can_drop(kinbox__db_t *db, bool in_commit)
{
        struct mystate *s = st_get(db);
        const kinbox__dberr_t *e = &db->err;
        size_t f = s->fail_stmt;
        struct rowmap *rm = rm_at(s, f);
        if (!db->attr || !db->attr->drop_rows || in_commit || !rm ||
            e->tag == e->stmt_tag || e->tag < 0 ||
            (e->code != KINBOX_ERR_DUPLICATE && !e->permanent))
                return false;
        int t = call_of(rm->tag);
        if (t == call_of(db->attr->call_tag) || sent_has(s, t) ||
            ran_has(s, e->tag))
                return false;
        for (size_t k = 0; k < s->ntags; k++) {
                if (k == f || call_of(s->tags[k]) != t)
                        continue;
                bool values = s->flags[k] & ST_VALUES;
                if (k > f && !values)
                        return false;
                if (k < f && (s->flags[k] & ST_EFF) &&
                    (!values || rm_owns(rm_at(s, k), e->tag)))
                        return false;
        }
        return true;
}

/* Text of statement k of q and how many statements share it. */
static const char *
q_text(const struct mystate *s, size_t k, size_t *len, size_t *count)
{
        size_t j = k + 1;
        while (j < s->ntags && s->offs[j] == s->offs[k])
                j++;
        size_t end = j < s->ntags ? s->offs[j] - 2 : s->q.len;
        *len = end - s->offs[k];
        *count = j - k;
        return s->q.p + s->offs[k];
}

/* Take the rows of message mt out of rm (its text is rebuilt). */
static int
rm_remove(struct rowmap *rm, int mt)
{
        kinbox__buf_t b;
        kinbox__buf_init(&b);
        kinbox__buf_add(&b, rm->text, rm->head_len);
        size_t n = 0;
        for (size_t r = 0; r < rm->n; r++) {
                if (KINBOX__TAG_LOW(rm->tags[r]) == KINBOX__TAG_LOW(mt))
                        continue;
                if (n)
                        kinbox__buf_add(&b, ", ", 2);
                size_t at = b.len;
                kinbox__buf_add(&b, rm->text + rm->rs[r], rm->rl[r]);
                rm->rs[n] = at;
                rm->rl[n] = rm->rl[r];
                rm->tags[n++] = rm->tags[r];
        }
        size_t tail = b.len;
        kinbox__buf_add(&b, rm->text + rm->tail_off, rm->len - rm->tail_off);
        if (b.oom) {
                kinbox__buf_free(&b);
                return -1;
        }
        free(rm->text);
        rm->text = b.p; /* the buffer's bytes now belong to rm */
        rm->len = b.len;
        rm->tail_off = tail;
        rm->n = n;
        return 0;
}

/*
 * Drop the failed message's rows: the queue becomes the statements from
 * the failed one on (those before it ran), with the failed statement and
 * the call's later exec_values() statements without the message's rows
 * (a statement left with no row goes). The failure is recorded in
 * db->attr->drops for the consumer. Returns 0 when the queue is ready to be
 * sent again.
 */
int
kinbox__my_rm_drop(kinbox__db_t *db)
{
        struct mystate *s = st_get(db);
        size_t f = s->fail_stmt, n0 = s->ntags;
        int mt = db->err.tag, t = call_of(s->tags[f]);
        kinbox__attr_t *a = db->attr;
        if (kinbox__grow(&a->drops, &a->capdrops, a->ndrops + 1,
                         sizeof(*a->drops)))
                return -1;
        kinbox__buf_t nq;
        kinbox__buf_init(&nq);
        size_t nt = 0;
        int *tags = malloc(n0 * sizeof(*tags));
        size_t *offs = malloc(n0 * sizeof(*offs));
        unsigned char *fl = malloc(n0);
        /* New index of each old statement, (size_t)-1 when it goes. */
        size_t *to = malloc(n0 * sizeof(*to));
        if (!tags || !offs || !fl || !to)
                goto oom;
        for (size_t k = 0; k < n0; k++)
                to[k] = (size_t)-1;
        for (size_t k = f; k < n0;) {
                size_t len, cnt;
                const char *txt = q_text(s, k, &len, &cnt);
                struct rowmap *rm = rm_at(s, k);
                if (rm && call_of(rm->tag) == t) {
                        if (rm_remove(rm, mt))
                                goto oom;
                        if (!rm->n) {
                                k += cnt;
                                continue;
                        }
                        txt = rm->text;
                        len = rm->len;
                }
                if (nt)
                        kinbox__buf_add(&nq, ";\n", 2);
                size_t at = nq.len;
                kinbox__buf_add(&nq, txt, len);
                for (size_t j = 0; j < cnt; j++) {
                        to[k + j] = nt;
                        tags[nt] = s->tags[k + j];
                        offs[nt] = at;
                        fl[nt++] = s->flags[k + j];
                }
                k += cnt;
        }
        if (nq.oom)
                goto oom;
        a->drops[a->ndrops++] = db->err;
        size_t keep = 0;
        for (size_t k = 0; k < s->nrmaps; k++) {
                struct rowmap *rm = &s->rmaps[k];
                if (to[rm->stmt] == (size_t)-1) {
                        kinbox__my_rm_free(rm); /* it ran, or it went */
                        continue;
                }
                rm->stmt = to[rm->stmt];
                s->rmaps[keep++] = *rm;
        }
        s->nrmaps = keep;
        kinbox__buf_free(&s->q);
        s->q = nq;
        memcpy(s->tags, tags, nt * sizeof(*tags));
        memcpy(s->offs, offs, nt * sizeof(*offs));
        memcpy(s->flags, fl, nt);
        s->ntags = nt;
        s->sp_len = s->sp_ntags = 0;
        free(tags);
        free(offs);
        free(fl);
        free(to);
        db->err = (kinbox__dberr_t){.tag = -1, .stmt_tag = -1};
        return 0;
oom:
        kinbox__buf_free(&nq);
        free(tags);
        free(offs);
        free(fl);
        free(to);
        return -1;
}
