/*
 * relay_wake.c -- waiting for work: the LISTEN connection (PostgreSQL),
 * polling with an index-only probe, and the in-process wake-up (the
 * relay's pipe, registered with wake.c).
 */
#include <poll.h>
#include <unistd.h>

#include "relay_int.h"

void
kinbox__relay_listen_close(kinbox_relay_t *r)
{
        if (r->listen) {
                r->db->ops->outbox->listen_close(r->listen);
                r->listen = NULL;
        }
}

void
kinbox__relay_listen_open(kinbox_relay_t *r)
{
        const struct kinbox__outbox_ops *o = r->db->ops->outbox;
        if (!r->notify || !o->listen_open || r->listen ||
            kinbox__now_ms() < r->listen_retry_at)
                return;
        r->listen_retry_at = kinbox__now_ms() + 5000;
        char e[512];
        r->listen = o->listen_open(r->conf, &r->log, e, sizeof(e));
        if (!r->listen)
                rlog(r, KINBOX_LOG_WARNING,
                     "LISTEN connection failed (polling meanwhile): %s", e);
}

/* Drain pending notifications; false if the connection broke. */
static bool
listen_drain(kinbox_relay_t *r, bool *woken)
{
        char e[512];
        if (r->db->ops->outbox->listen_drain(r->listen, woken, e, sizeof(e))) {
                rlog(r, KINBOX_LOG_WARNING, "LISTEN connection lost: %s", e);
                kinbox__relay_listen_close(r);
                return false;
        }
        return true;
}

/* Sleep up to ms, or until stop / a NOTIFY / a local append. Returns true
 * when woken by a NOTIFY or a local append. */
bool
kinbox__relay_wait(kinbox_relay_t *r, int64_t ms)
{
        kinbox__relay_listen_open(r);
        int64_t until = kinbox__now_ms() + ms;
        bool woken = false;
        atomic_store(&r->sleeping, true);
        while (!atomic_load(&r->stop) && !woken) {
                int64_t left = until - kinbox__now_ms();
                if (left <= 0)
                        break;
                struct pollfd pf[2];
                nfds_t nf = 0;
                pf[nf].fd = r->pipefd[0];
                pf[nf++].events = POLLIN;
                if (r->listen) {
                        /* Notifications that arrived during the cycle. */
                        if (!listen_drain(r, &woken))
                                continue;
                        if (woken)
                                break;
                        pf[nf].fd = r->db->ops->outbox->listen_fd(r->listen);
                        pf[nf++].events = POLLIN;
                }
                int k = poll(pf, nf, (int)left);
                if (k <= 0)
                        continue;
                if (pf[0].revents) {
                        char buf[64];
                        while (read(r->pipefd[0], buf, sizeof(buf)) > 0)
                                ;
                        woken = true; /* a local append (or stop) */
                        r->hot_until = kinbox__now_ms() + HOT_MS;
                }
                if (nf > 1 && pf[1].revents)
                        listen_drain(r, &woken);
        }
        atomic_store(&r->sleeping, false);
        return woken;
}

/*
 * Idle: nothing in flight, the last claim found nothing. With LISTEN/NOTIFY
 * wait for a notification (relay.poll.ms at most). Polling: the interval
 * starts at POLL_MIN_MS while rows keep coming (and for HOT_MS after a
 * local append) and doubles up to relay.poll.ms while claims come back
 * empty; an index-only probe saves the claim when no row is due.
 */
void
kinbox__relay_idle(kinbox_relay_t *r, bool *more, bool last_claim_empty)
{
        if (r->listen) {
                kinbox__relay_wait(r, r->poll_ms);
                *more = true;
                return;
        }
        if (kinbox__now_ms() < r->hot_until)
                r->idle_ms = POLL_MIN_MS;
        else if (last_claim_empty)
                r->idle_ms =
                    r->idle_ms * 2 > r->poll_ms ? r->poll_ms : r->idle_ms * 2;
        kinbox__relay_wait(r, r->idle_ms);
        bool due = true;
        if (r->db->ops->outbox->probe(r->db, &due))
                due = true; /* the claim reports the error */
        *more = due;
}

void
kinbox__relay_halt(kinbox_relay_t *r)
{
        atomic_store(&r->stop, true);
        if (r->pipefd[1] >= 0) {
                ssize_t w = write(r->pipefd[1], "x", 1);
                (void)w;
        }
}
