/*
 * wake.c -- the in-process wake-up of sleeping relays: a registry of the
 * relays' pipes (wake.h).
 */
#include "wake.h"

#include <pthread.h>
#include <unistd.h>

#define WAKE_MAX 16

static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
        int fd; /* -1: free slot */
        const atomic_bool *sleeping;
} wake_list[WAKE_MAX] = {{-1, 0}, {-1, 0}, {-1, 0}, {-1, 0}, {-1, 0}, {-1, 0},
                         {-1, 0}, {-1, 0}, {-1, 0}, {-1, 0}, {-1, 0}, {-1, 0},
                         {-1, 0}, {-1, 0}, {-1, 0}, {-1, 0}};
static atomic_int wake_n;

void
kinbox__wake_register(int fd, const atomic_bool *sleeping)
{
        if (fd < 0)
                return;
        pthread_mutex_lock(&wake_mu);
        for (int i = 0; i < WAKE_MAX; i++) {
                if (wake_list[i].fd < 0) {
                        wake_list[i].fd = fd;
                        wake_list[i].sleeping = sleeping;
                        atomic_fetch_add(&wake_n, 1);
                        break;
                }
        }
        pthread_mutex_unlock(&wake_mu);
}

void
kinbox__wake_unregister(int fd)
{
        if (fd < 0)
                return;
        pthread_mutex_lock(&wake_mu);
        for (int i = 0; i < WAKE_MAX; i++) {
                if (wake_list[i].fd == fd) {
                        wake_list[i].fd = -1;
                        wake_list[i].sleeping = NULL;
                        atomic_fetch_sub(&wake_n, 1);
                        break;
                }
        }
        pthread_mutex_unlock(&wake_mu);
}

void
kinbox__wake_poke(void)
{
        if (!atomic_load(&wake_n))
                return;
        pthread_mutex_lock(&wake_mu);
        for (int i = 0; i < WAKE_MAX; i++) {
                if (wake_list[i].fd >= 0 &&
                    atomic_load(wake_list[i].sleeping)) {
                        ssize_t w = write(wake_list[i].fd, "p", 1);
                        (void)w;
                }
        }
        pthread_mutex_unlock(&wake_mu);
}
