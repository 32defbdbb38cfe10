/*
 * watchdog.c -- bounded shutdown of `kinbox run` (see watchdog.h).
 */
#include "watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static sem_t armed, done;
static atomic_bool started, is_armed;
static _Atomic(const char *) step = "stopping";

static void *
watchdog_main(void *arg)
{
        (void)arg;
        while (sem_wait(&armed) && errno == EINTR)
                ;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += KB_SHUTDOWN_BOUND_S;
        int rc;
        while ((rc = sem_timedwait(&done, &ts)) && errno == EINTR)
                ;
        if (!rc)
                return NULL;
        fprintf(stderr,
                "kinbox run: shutdown did not finish within %d s, stuck in "
                "step \"%s\"; exiting with status %d (uncommitted work is "
                "redelivered on the next start)\n",
                KB_SHUTDOWN_BOUND_S, atomic_load(&step), KB_SHUTDOWN_EXIT);
        fflush(stderr);
        _exit(KB_SHUTDOWN_EXIT);
}

int
kb_watchdog_start(void)
{
        if (atomic_exchange(&started, true))
                return 0;
        if (sem_init(&armed, 0, 0) || sem_init(&done, 0, 0))
                return -1;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        int rc = pthread_create(&t, &a, watchdog_main, NULL);
        pthread_attr_destroy(&a);
        return rc ? -1 : 0;
}

void
kb_watchdog_arm(void)
{
        if (atomic_load(&started) && !atomic_exchange(&is_armed, true))
                sem_post(&armed);
}

void
kb_watchdog_step(const char *s)
{
        atomic_store(&step, s);
}

void
kb_watchdog_done(void)
{
        if (atomic_load(&started))
                sem_post(&done);
}
