/*
 * counters.c -- `kinbox run`'s record of its consumers' counters in the
 * database (kinbox_admin_counters_record()): duplicates leave no row, so
 * `kinbox status` reads what the running processes counted there, never
 * from a process's /metrics.
 */
#include "counters.h"
#include "common.h"
#include "internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A change is recorded within CHECK_MS of it, at most once every
 * EVERY_MS (a write is a durable commit: none while nothing changes); an
 * unchanged record is only rewritten after ALIVE_MS, for status, which
 * takes the records of the last 150 s (counters_read, src/db/: two
 * refreshes and a half) for running processes'. */
#define KB_COUNTERS_CHECK_MS 50
#define KB_COUNTERS_EVERY_MS 1000
#define KB_COUNTERS_ALIVE_MS 60000

struct kb_counters {
        int n;
        kinbox_consumer_t **cs; /* a copy of the caller's array */
        kinbox_admin_t **adm; /* one per consumer: its own database */
        kinbox_consumer_stats_t *last; /* what was recorded */
        int64_t *last_ms; /* when (monotonic) */
        char instance[300]; /* host:pid:start */
        pthread_t thr;
        bool started;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        volatile int stop;
};

/* Each consumer's counters when they changed (EVERY_MS after the last
 * write at the earliest) or the record is due for its ALIVE_MS refresh
 * (force: now; remove: its record deleted). */
static void
record_all(kb_counters_t *k, bool force, int remove)
{
        int64_t now = kinbox__now_ms();
        for (int i = 0; i < k->n; i++) {
                kinbox_consumer_stats_t st;
                kinbox_consumer_stats(k->cs[i], &st);
                bool changed =
                    st.duplicates != k->last[i].duplicates ||
                    st.business_duplicates != k->last[i].business_duplicates;
                int64_t age = now - k->last_ms[i];
                bool due = force || (changed && age >= KB_COUNTERS_EVERY_MS) ||
                           age >= KB_COUNTERS_ALIVE_MS;
                if (!k->adm[i] || !due)
                        continue;
                if (!kinbox_admin_counters_record(
                        k->adm[i], kinbox_consumer_name(k->cs[i]), k->instance,
                        &st, remove)) {
                        k->last[i] = st;
                        k->last_ms[i] = now;
                }
        }
}

static void *
counters_main(void *arg)
{
        kb_counters_t *k = arg;
        while (!kb_nap(&k->lock, &k->cond, &k->stop, KB_COUNTERS_CHECK_MS))
                record_all(k, false, 0);
        return NULL;
}

static void
counters_free(kb_counters_t *k)
{
        for (int i = 0; i < k->n; i++)
                kinbox_admin_destroy(k->adm[i]);
        free(k->adm);
        free(k->cs);
        free(k->last);
        free(k->last_ms);
        pthread_mutex_destroy(&k->lock);
        pthread_cond_destroy(&k->cond);
        free(k);
}

kb_counters_t *
kb_counters_start(kinbox_consumer_t *const *cs,
                  const kinbox_conf_t *const *confs, int n)
{
        kb_counters_t *k = calloc(1, sizeof(*k));
        if (!k)
                return NULL;
        pthread_mutex_init(&k->lock, NULL);
        pthread_cond_init(&k->cond, NULL);
        k->adm = calloc((size_t)n + 1, sizeof(*k->adm));
        k->cs = calloc((size_t)n + 1, sizeof(*k->cs));
        k->last = calloc((size_t)n + 1, sizeof(*k->last));
        k->last_ms = calloc((size_t)n + 1, sizeof(*k->last_ms));
        if (!k->adm || !k->cs || !k->last || !k->last_ms) {
                counters_free(k);
                return NULL;
        }
        k->n = n;
        memcpy(k->cs, cs, (size_t)n * sizeof(*cs));
        char host[256] = "";
        (void)gethostname(host, sizeof(host) - 1);
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        snprintf(k->instance, sizeof(k->instance), "%s:%ld:%lld", host,
                 (long)getpid(), (long long)now.tv_sec);
        for (int i = 0; i < n; i++)
                k->adm[i] = kinbox_admin_new(confs[i], NULL, 0);
        record_all(k, true, 0);
        if (pthread_create(&k->thr, NULL, counters_main, k)) {
                record_all(k, true, 1);
                counters_free(k);
                return NULL;
        }
        k->started = true;
        return k;
}

void
kb_counters_stop(kb_counters_t *k)
{
        if (!k)
                return;
        pthread_mutex_lock(&k->lock);
        k->stop = 1;
        pthread_cond_broadcast(&k->cond);
        pthread_mutex_unlock(&k->lock);
        if (k->started)
                pthread_join(k->thr, NULL);
        record_all(k, true, 1);
        counters_free(k);
}
