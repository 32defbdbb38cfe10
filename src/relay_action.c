/*
 * relay_action.c -- local actions (destinations "action:NAME"): one at a
 * time on a worker thread with a timeout, and the kinbox_action_*()
 * accessors a registered action reads.
 */
#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "relay_int.h"

typedef struct job {
        pthread_mutex_t mu;
        pthread_cond_t cv;
        int refs;
        bool done;
        kinbox_result_t res;
        kinbox_action_fn fn;
        void *opaque;
        kinbox_relay_t *relay;
        kinbox_action_t act;
} job_t;

static void
job_unref(job_t *j)
{
        pthread_mutex_lock(&j->mu);
        bool last = --j->refs == 0;
        pthread_mutex_unlock(&j->mu);
        if (!last)
                return;
        free(j->act.name);
        free(j->act.idem_key);
        free(j->act.aggregate_id);
        free(j->act.payload);
        hdrs_free(&j->act.headers);
        pthread_mutex_destroy(&j->mu);
        pthread_cond_destroy(&j->cv);
        free(j);
}

static void *
job_main(void *arg)
{
        job_t *j = arg;
        kinbox_relay_t *r = j->relay;
        kinbox_result_t res = j->fn(&j->act, j->opaque);
        pthread_mutex_lock(&j->mu);
        j->res = res;
        j->done = true;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
        job_unref(j);
        pthread_mutex_lock(&r->lock);
        if (--r->live_jobs == 0)
                pthread_cond_broadcast(&r->jobs_cv);
        pthread_mutex_unlock(&r->lock);
        return NULL;
}

static const action_reg_t *
find_action(const kinbox_relay_t *r, const char *name)
{
        for (size_t i = 0; i < r->nactions; i++)
                if (!strcmp(r->actions[i].name, name))
                        return &r->actions[i];
        return NULL;
}

/* The job of one action row: a copy of what the action reads, two
 * references (the relay's, the thread's). NULL when out of memory. */
static job_t *
job_new(kinbox_relay_t *r, const action_reg_t *reg, const item_t *it,
        const char *name)
{
        job_t *j = kinbox__calloc(1, sizeof(*j));
        if (!j)
                return NULL;
        pthread_mutex_init(&j->mu, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&j->cv, &ca);
        pthread_condattr_destroy(&ca);
        j->refs = 2;
        j->fn = reg->fn;
        j->opaque = reg->opaque;
        j->relay = r;
        j->act.id = it->id;
        j->act.attempt = it->attempts + 1;
        j->act.name = kinbox__strdup(name);
        j->act.idem_key = kinbox__strdup(it->idem_key);
        j->act.aggregate_id =
            it->aggregate_id ? kinbox__strdup(it->aggregate_id) : NULL;
        if (it->payload) {
                j->act.payload = malloc(it->payload_size + 1);
                if (j->act.payload) {
                        memcpy(j->act.payload, it->payload, it->payload_size);
                        j->act.payload[it->payload_size] = '\0';
                }
                j->act.payload_size = it->payload_size;
        }
        if (!j->act.name || !j->act.idem_key ||
            (it->aggregate_id && !j->act.aggregate_id) ||
            (it->payload && !j->act.payload)) {
                j->refs = 1;
                job_unref(j);
                return NULL;
        }
        return j;
}

/* The row's outcome from its action's (done: it returned in time). */
static void
job_verdict(kinbox_relay_t *r, item_t *it, const char *name, bool done,
            kinbox_result_t res, const char *aerr)
{
        if (!done) {
                char e[128];
                snprintf(e, sizeof(e), "action timed out after %" PRId64 " ms",
                         r->action_ms);
                set_err(it->err, e);
                it->out = OUT_RETRY;
                rlog(r, KINBOX_LOG_WARNING,
                     "outbox row %" PRId64 ": action %s timed out", it->id,
                     name);
                return;
        }
        switch (res) {
        case KINBOX_RESULT_OK:
                it->out = OUT_SENT;
                break;
        case KINBOX_RESULT_REJECT:
                set_err(it->err, aerr[0] ? aerr : "rejected by the action");
                it->out = OUT_DEAD;
                break;
        default:
                set_err(it->err, aerr[0] ? aerr : "action asked to retry");
                it->out = OUT_RETRY;
                break;
        }
}

void
kinbox__relay_run_action(kinbox_relay_t *r, item_t *it)
{
        const char *name =
            it->destination + strlen(KINBOX_OUTBOX_ACTION_PREFIX);
        const action_reg_t *reg = find_action(r, name);
        if (!reg) {
                char e[320];
                snprintf(e, sizeof(e), "no action \"%.255s\" registered",
                         name);
                set_err(it->err, e);
                it->out = OUT_RETRY;
                return;
        }
        job_t *j = job_new(r, reg, it, name);
        if (!j) {
                set_err(it->err, "out of memory");
                it->out = OUT_RETRY;
                return;
        }
        if (headers_parse(it->headers_json, &j->act.headers)) {
                j->refs = 1;
                job_unref(j);
                set_err(it->err, "malformed headers column");
                it->out = OUT_DEAD;
                return;
        }
        size_t ntp = 0, tp = 0; /* one context, or none: W3C ignores
                                   several */
        for (size_t i = 0; r->tracing && i < j->act.headers.n; i++)
                if (j->act.headers.v[i].name &&
                    !strcmp(j->act.headers.v[i].name,
                            KINBOX_TRACEPARENT_HEADER)) {
                        ntp++;
                        tp = i;
                }
        if (ntp == 1)
                kinbox__relay_trace_begin(r, it, j->act.headers.v[tp].value,
                                          j->act.headers.v[tp].size);

        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t th;
        pthread_mutex_lock(&r->lock);
        r->live_jobs++;
        pthread_mutex_unlock(&r->lock);
        if (pthread_create(&th, &attr, job_main, j)) {
                pthread_attr_destroy(&attr);
                pthread_mutex_lock(&r->lock);
                r->live_jobs--;
                pthread_mutex_unlock(&r->lock);
                j->refs = 1;
                job_unref(j);
                set_err(it->err, "cannot start action thread");
                it->out = OUT_RETRY;
                return;
        }
        pthread_attr_destroy(&attr);

        struct timespec dl;
        kinbox__deadline_on(CLOCK_MONOTONIC, r->action_ms, &dl);
        pthread_mutex_lock(&j->mu);
        while (!j->done) {
                if (pthread_cond_timedwait(&j->cv, &j->mu, &dl) == ETIMEDOUT)
                        break;
        }
        bool done = j->done;
        kinbox_result_t res = j->res;
        char aerr[ERR_MAX + 1];
        memcpy(aerr, j->act.error, sizeof(aerr));
        pthread_mutex_unlock(&j->mu);
        job_unref(j);

        job_verdict(r, it, name, done, res, aerr);
}

int64_t
kinbox_action_id(const kinbox_action_t *a)
{
        return a->id;
}

const char *
kinbox_action_name(const kinbox_action_t *a)
{
        return a->name;
}

const char *
kinbox_action_idem_key(const kinbox_action_t *a)
{
        return a->idem_key;
}

const char *
kinbox_action_aggregate_id(const kinbox_action_t *a)
{
        return a->aggregate_id;
}

const void *
kinbox_action_payload(const kinbox_action_t *a, size_t *sizep)
{
        if (sizep)
                *sizep = a->payload_size;
        return a->payload;
}

int
kinbox_action_attempt(const kinbox_action_t *a)
{
        return a->attempt;
}

size_t
kinbox_action_header_count(const kinbox_action_t *a)
{
        return a->headers.n;
}

kinbox_err_t
kinbox_action_header_at(const kinbox_action_t *a, size_t idx,
                        kinbox_header_t *hdr)
{
        if (idx >= a->headers.n)
                return KINBOX_ERR_NOT_FOUND;
        hdr->name = a->headers.v[idx].name;
        hdr->value = a->headers.v[idx].value;
        hdr->size = a->headers.v[idx].size;
        return KINBOX_OK;
}

void
kinbox_action_set_error(kinbox_action_t *a, const char *fmt, ...)
{
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        set_err(a->error, buf);
}
