/*
 * mysql_queue.c -- the deferred statement queue above the round trip
 * (mysql_trip.c): statements join it after the open merged INSERTs
 * (mysql_merge.c), and a send whose failing row can be dropped
 * (mysql_rows.c) takes that row out and sends the rest again.
 */
#include "mysql_merge.h"

#include <stdlib.h>
#include <string.h>

/* The same, after the open groups of merged INSERTs (their rows came
 * first). */
int
kinbox__my_q_append(kinbox__db_t *db, const char *text, size_t len, int tag,
                    int count)
{
        struct mystate *s = st_get(db);
        unsigned char fl = s->next_flags; /* this statement's, not theirs */
        s->next_flags = ST_EFF;
        int rc = kinbox__my_m_flush(db);
        s->next_flags = fl;
        return rc ? rc : kinbox__my_q_append_raw(db, text, len, tag, count);
}

void
kinbox__my_q_reset(struct mystate *s)
{
        kinbox__buf_reset(&s->q);
        kinbox__my_rm_cut(s, 0);
        s->ntags = 0;
        s->sp_len = s->sp_ntags = 0;
        s->begin_queued = false;
        kinbox__my_m_drop(s->merge);
}

/*
 * Send the queue (plus whatever the caller appended last) and empty it.
 * The queue is emptied whatever happens: after an error the transaction
 * is dead and only rollback() may follow. A failed exec_values() row whose
 * message can be dropped (rm_can_drop()) is taken out and the rest is
 * sent again, so the transaction goes on.
 */
int
kinbox__my_q_send(kinbox__db_t *db, struct kinbox_rows_s **out, bool in_commit)
{
        struct mystate *s = st_get(db);
        if (out)
                *out = NULL;
        int rc0 = kinbox__my_m_flush(db);
        if (rc0)
                return rc0;
        if (!s->ntags)
                return KINBOX_OK;
        s->tx_sent = true;
        int rc;
        for (;;) {
                rc = kinbox__my_roundtrip(db, s->q.p, s->q.len, s->tags,
                                          s->ntags, out, in_commit);
                if (!db->native)
                        return rc; /* the state went with the connection */
                if (!rc) {
                        kinbox__my_sent_note(s, s->ntags);
                        break;
                }
                if (s->fail_stmt < s->ntags) {
                        size_t a = s->offs[s->fail_stmt];
                        size_t b = s->fail_stmt + 1 < s->ntags
                                       ? s->offs[s->fail_stmt + 1]
                                       : s->q.len;
                        kinbox__db_err_stmt(db, s->q.p + a, b - a);
                }
                if (s->nrmaps)
                        rc = kinbox__my_rm_pin(db, rc);
                if (!db->native)
                        return rc;
                if (!kinbox__my_rm_can_drop(db, in_commit))
                        break;
                kinbox__my_sent_note(s, s->fail_stmt);
                kinbox__dberr_t e = db->err;
                if (kinbox__my_rm_drop(db)) {
                        db->err = e;
                        break;
                }
                rc = KINBOX_OK;
                if (!s->ntags)
                        break;
        }
        kinbox__my_q_reset(s);
        if (db->attr)
                db->attr->rows_queued = false;
        return rc;
}
