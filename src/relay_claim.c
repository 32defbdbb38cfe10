/*
 * relay_claim.c -- claiming due rows (ops->claim of the backend)
 * into a free batch slot, and starting the batch: every event produced,
 * every action run; the rest of a failed row's run held back.
 */
#include "relay_int.h"

static int
cmp_item(const void *a, const void *b)
{
        const item_t *x = a, *y = b;
        return x->id < y->id ? -1 : x->id > y->id;
}

/* Turn claim rows (KINBOX__CL_* columns) into items pointing into rows,
 * in id order (so a run's rows are produced in order). */
static item_t *
items_from_rows(struct kinbox_rows_s *rows, size_t *np)
{
        size_t n = rows ? rows->nrows : 0;
        *np = n;
        if (!n)
                return NULL;
        if (rows->ncols < KINBOX__CL_NCOLS)
                return NULL;
        item_t *v = kinbox__calloc(n, sizeof(*v));
        if (!v)
                return NULL;
        int64_t wall = kinbox__wall_ms();
        for (size_t i = 0; i < n; i++) {
                char **c = rows->values + i * (size_t)rows->ncols;
                size_t *l = rows->lens + i * (size_t)rows->ncols;
                v[i].id = to_i64(c[KINBOX__CL_ID]);
                v[i].version = to_i64(c[KINBOX__CL_VERSION]);
                v[i].action = c[KINBOX__CL_KIND] &&
                              !strcmp(c[KINBOX__CL_KIND], "action");
                v[i].destination = c[KINBOX__CL_DESTINATION];
                v[i].idem_key = c[KINBOX__CL_IDEM_KEY];
                v[i].aggregate_id = c[KINBOX__CL_AGGREGATE];
                v[i].payload = c[KINBOX__CL_PAYLOAD];
                v[i].payload_size =
                    c[KINBOX__CL_PAYLOAD] ? l[KINBOX__CL_PAYLOAD] : 0;
                v[i].headers_json = c[KINBOX__CL_HEADERS];
                v[i].attempts = (int)to_i64(c[KINBOX__CL_ATTEMPTS]);
                v[i].max_attempts = (int)to_i64(c[KINBOX__CL_MAX_ATTEMPTS]);
                v[i].age_ms = to_i64(c[KINBOX__CL_AGE_MS]);
                v[i].created_ms = wall - v[i].age_ms;
                v[i].created_at_ms = to_i64(c[KINBOX__CL_CREATED_MS]);
                const char *re = c[KINBOX__CL_RECLAIMED];
                v[i].reclaimed = re && (!strcmp(re, "t") || !strcmp(re, "1"));
        }
        qsort(v, n, sizeof(*v), cmp_item);
        return v;
}

/* Items of the same aggregate as v[i] that come after it in the batch
 * (the rest of its run) go back untouched: released, no attempt charged,
 * still behind v[i], which stays pending (retry) or is dead/sent. */
static void
hold_rest_of_run(batch_t *b, size_t i)
{
        const char *agg = b->v[i].aggregate_id;
        if (!agg)
                return;
        for (size_t k = i + 1; k < b->n; k++) {
                item_t *it = &b->v[k];
                if (it->aggregate_id && !strcmp(it->aggregate_id, agg) &&
                    !it->produced && it->out == OUT_NONE) {
                        it->out = OUT_RELEASE;
                        it->held = true;
                }
        }
}

/* Produce every event, then run the actions (a run never mixes the two:
 * same destination). A row that cannot be produced holds the rest of its
 * aggregate's run back, so nothing overtakes it. */
void
kinbox__relay_start(kinbox_relay_t *r, batch_t *b)
{
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (it->action || it->out != OUT_NONE)
                        continue;
                kinbox__relay_produce(r, it);
                if (!it->produced)
                        hold_rest_of_run(b, i);
        }
        for (size_t i = 0; i < b->n; i++) {
                item_t *it = &b->v[i];
                if (!it->action || it->out != OUT_NONE)
                        continue;
                /* Never start an action that could outlive the lease. */
                if (kinbox__now_ms() + r->action_ms + MARGIN_MS >
                        b->t0 + r->lease_ms ||
                    atomic_load(&r->stop)) {
                        it->out = OUT_RELEASE;
                        continue;
                }
                kinbox__relay_run_action(r, it);
                if (it->out != OUT_SENT)
                        hold_rest_of_run(b, i);
                rd_kafka_poll(r->rk, 0);
        }
}

/* Claim a batch into b. Returns <0 on error, else the rows claimed. */
int
kinbox__relay_claim(kinbox_relay_t *r, batch_t *b)
{
        memset(b, 0, sizeof(*b));
        /* Heads among the first rows of the backlog first; everything
         * when that found nothing (an aggregate whose head waits for a
         * retry can fill the front of the backlog with its rows). */
        kinbox__claim_req_t req = {r->cur_batch,
                                   r->lease_ms,
                                   r->owner,
                                   r->run_max,
                                   2 * r->cur_batch,
                                   r->lock_mode,
                                   r->lock_ms + 2 * MARGIN_MS,
                                   0,
                                   r->logr != NULL};
        if (r->lock_mode) {
                /* Rows another lock-held relay holds look due to this
                 * claim's walk and are skipped at the lock: look past as
                 * many as one relay holds at most (relay.batch.size), so
                 * a second relay gets rows of its own instead of a claim
                 * that comes back short (and shrinks its next one).
                 * Always, not only after a short claim: that variant
                 * saved a relay alone a little per claim but left two
                 * relays no faster than one (docs/benchmarks-history.md,
                 * "Issue 11, fifth pass"). */
                req.window += r->batch;
                req.cand = 4 * r->cur_batch + r->batch;
        }
        b->tx0 = kinbox__now_ms();
        int64_t us = kinbox__now_us();
        int rc = r->db->ops->outbox->claim(r->db, &req, &b->rows);
        if (!rc && (!b->rows || !b->rows->nrows)) {
                kinbox_rows_destroy(b->rows);
                b->rows = NULL;
                req.window = 0;
                rc = r->db->ops->outbox->claim(r->db, &req, &b->rows);
        }
        b->us_claim = kinbox__now_us() - us;
        if (rc) {
                kinbox_rows_destroy(b->rows);
                b->rows = NULL;
                return rc > 0 ? -rc : rc;
        }
        b->v = items_from_rows(b->rows, &b->n);
        b->locked = r->lock_mode && b->n;
        if (b->n && !b->v) {
                /* Lease mode: the claim committed, the leases just expire.
                 * Lock-held: the rows go back untouched. */
                kinbox__db_abandon(r->db);
                kinbox_rows_destroy(b->rows);
                b->rows = NULL;
                b->n = 0;
                b->locked = false;
                return KINBOX_ERR_NOMEM;
        }
        b->t0 = kinbox__now_ms();
        if (b->n) {
                STAT_ADD(r, claimed, b->n);
                STAT_ADD(r, batches, 1);
        } else {
                /* An empty slot is reused without finishing: nothing of
                 * the empty claim may stay behind in it. */
                free(b->v);
                kinbox_rows_destroy(b->rows);
                memset(b, 0, sizeof(*b));
        }
        return (int)b->n;
}

bool
kinbox__relay_has_action(const batch_t *b)
{
        for (size_t i = 0; i < b->n; i++)
                if (b->v[i].action)
                        return true;
        return false;
}
