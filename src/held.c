/*
 * held.c -- partitions held by an error no retry can fix: the backoff,
 * the rate-limited error line, the counter and the gauge. See held.h.
 */
#include "held.h"
#include "metrics.h"

#include <inttypes.h>
#include <stdio.h>

/* One error line per held partition per this many ms. */
#define HELD_LOG_MS 60000

void
kinbox__held_gauge(kinbox_consumer_t *c)
{
        char l[300];
        kinbox__m_set(
            "kinbox_consumer_held_partitions",
            kinbox__m_labels(l, sizeof(l), "consumer", c->name, (char *)NULL),
            (double)atomic_load(&c->st_held));
}

void
kinbox__held_hold(kinbox_consumer_t *c, kinbox_msg_t *m,
                  const kinbox__dberr_t *e)
{
        kinbox__part_t *p = m->part;
        kinbox__worker_t *w = p->w;
        int64_t now = kinbox__now_ms();
        char cause[16], l[300];
        kinbox__db_err_cause(e, cause, sizeof(cause));
        kinbox__m_add("kinbox_consumer_held_errors_total",
                      kinbox__m_labels(l, sizeof(l), "consumer", c->name,
                                       "cause", cause, (char *)NULL),
                      1);
        if (!p->held) {
                p->held = true;
                p->held_n = 0;
                p->held_since_ms = now;
                p->held_log_ms = 0;
                atomic_fetch_add(&c->st_held, 1);
                kinbox__held_gauge(c);
        }
        p->held_n++;
        int64_t delay =
            kinbox__backoff_ms(p->held_n - 1, c->backoff_base, c->backoff_max);
        pthread_mutex_lock(&w->lock);
        p->retry_at = now + delay;
        pthread_mutex_unlock(&w->lock);
        atomic_store(&c->pause_dirty, true);
        if (p->held_log_ms && now - p->held_log_ms < HELD_LOG_MS)
                return;
        p->held_log_ms = now;
        kinbox__log(&c->lg, KINBOX_LOG_ERR, "consumer",
                    "consumer %s: %s [%" PRId32 "] offset %" PRId64
                    " message %s: partition held (%d attempt%s in %" PRId64
                    " s): %s%s%s%s; no retry can fix this (an undefined "
                    "table, column or function, a syntax error or a "
                    "missing privilege): nothing is dead-lettered, the "
                    "partition runs again with backoff and resumes by itself "
                    "once the database is fixed",
                    c->name, p->topic, p->partition, kinbox_msg_offset(m),
                    m->id ? m->id : "(none)", p->held_n,
                    p->held_n == 1 ? "" : "s", (now - p->held_since_ms) / 1000,
                    e->msg, e->stmt[0] ? " (statement: " : "", e->stmt,
                    e->stmt[0] ? ")" : "");
}

void
kinbox__held_release(kinbox_consumer_t *c, kinbox__part_t *p)
{
        if (!p->held)
                return;
        p->held = false;
        atomic_fetch_sub(&c->st_held, 1);
        kinbox__held_gauge(c);
        kinbox__log(&c->lg, KINBOX_LOG_NOTICE, "consumer",
                    "consumer %s: %s [%" PRId32 "] resumed after %" PRId64
                    " s held (%d attempts)",
                    c->name, p->topic, p->partition,
                    (kinbox__now_ms() - p->held_since_ms) / 1000, p->held_n);
}

void
kinbox__held_forget(kinbox_consumer_t *c, kinbox__part_t *p)
{
        if (!p->held)
                return;
        p->held = false;
        atomic_fetch_sub(&c->st_held, 1);
        kinbox__held_gauge(c);
}
