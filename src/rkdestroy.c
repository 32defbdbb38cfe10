/*
 * rkdestroy.c -- destroying a librdkafka handle within a bound
 * (rkdestroy.h).
 *
 * rd_kafka_destroy() joins librdkafka's threads, which wait for every
 * reference to the handle's partitions and brokers; librdkafka releases
 * before 2.6 (Debian 12 ships 2.0.2) can keep such a reference for ever
 * under load (librdkafka PR #4724: a fetch queue op that holds its own
 * partition), and the caller would hang with them. So the destroy runs in
 * a detached thread and the caller waits for it only so long. With
 * librdkafka 2.6.0 or later (KINBOX__RK_DESTROY_MAY_HANG false) none of
 * this is compiled: the destroy is a plain call.
 */
#include "rkdestroy.h"
#include "internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#if !KINBOX__RK_DESTROY_MAY_HANG
bool
kinbox__rk_destroy_bounded(rd_kafka_t *rk, int flags, const char *fault)
{
        (void)fault;
        rd_kafka_destroy_flags(rk, flags);
        return true;
}
#else
struct rk_destroy {
        rd_kafka_t *rk;
        int flags;
        const char *fault;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool done;
        int refs; /* the waiter and the thread: the last one frees */
};

static void
rk_destroy_unref(struct rk_destroy *d)
{
        pthread_mutex_lock(&d->lock);
        bool last = --d->refs == 0;
        pthread_mutex_unlock(&d->lock);
        if (!last)
                return;
        pthread_mutex_destroy(&d->lock);
        pthread_cond_destroy(&d->cond);
        free(d);
}

static void *
rk_destroy_main(void *arg)
{
        struct rk_destroy *d = arg;
        /* Tests: a librdkafka that takes longer than the bound. */
        if (d->fault && kinbox__fault(d->fault))
                usleep((KINBOX__RK_DESTROY_MS + 8000) * 1000);
        rd_kafka_destroy_flags(d->rk, d->flags);
        pthread_mutex_lock(&d->lock);
        d->done = true;
        pthread_cond_signal(&d->cond);
        pthread_mutex_unlock(&d->lock);
        rk_destroy_unref(d);
        return NULL;
}

bool
kinbox__rk_destroy_bounded(rd_kafka_t *rk, int flags, const char *fault)
{
        struct rk_destroy *d = calloc(1, sizeof(*d));
        pthread_attr_t attr;
        pthread_t thr;
        if (!d || pthread_attr_init(&attr)) {
                free(d);
                rd_kafka_destroy_flags(rk, flags);
                return true;
        }
        *d = (struct rk_destroy){
            .rk = rk, .flags = flags, .fault = fault, .refs = 2};
        pthread_mutex_init(&d->lock, NULL);
        pthread_cond_init(&d->cond, NULL);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        bool started = !pthread_create(&thr, &attr, rk_destroy_main, d);
        pthread_attr_destroy(&attr);
        if (!started) {
                d->refs = 1;
                rk_destroy_unref(d);
                rd_kafka_destroy_flags(rk, flags);
                return true;
        }
        struct timespec ts;
        kinbox__deadline(KINBOX__RK_DESTROY_MS, &ts);
        pthread_mutex_lock(&d->lock);
        int rc = 0;
        while (!d->done && rc != ETIMEDOUT)
                rc = pthread_cond_timedwait(&d->cond, &d->lock, &ts);
        bool done = d->done;
        pthread_mutex_unlock(&d->lock);
        rk_destroy_unref(d);
        return done;
}
#endif

static struct abandoned {
        void *owner;
        struct abandoned *next;
} * g_abandoned;
static pthread_mutex_t g_abandoned_lock = PTHREAD_MUTEX_INITIALIZER;

void
kinbox__rk_abandon(void *owner)
{
        struct abandoned *a = malloc(sizeof(*a));
        if (!a)
                return;
        pthread_mutex_lock(&g_abandoned_lock);
        *a = (struct abandoned){owner, g_abandoned};
        g_abandoned = a;
        pthread_mutex_unlock(&g_abandoned_lock);
}
