/*
 * service_test.c -- `kinbox run` under a service manager, with a
 * NOTIFY_SOCKET of the test's own standing in for systemd: READY=1 once it
 * runs, WATCHDOG=1 pings when WATCHDOG_USEC is set, SIGHUP re-reads the
 * file and applies its log.level (debug lines appear only after the
 * reload), STOPPING=1 and exit 0 on SIGTERM.
 */
#include "harness.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Wait for a datagram containing want (up to timeout_s); fail otherwise. */
static void
expect_notify(int fd, const char *want, int timeout_s)
{
        struct timeval tv = {1, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        char seen[2048] = "";
        for (int i = 0; i < timeout_s; i++) {
                char buf[512];
                ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
                if (n <= 0)
                        continue;
                buf[n] = '\0';
                if (strstr(buf, want))
                        return;
                strncat(seen, buf, sizeof(seen) - strlen(seen) - 2);
                strncat(seen, "|", sizeof(seen) - strlen(seen) - 1);
        }
        cr_fatal("no %s notification in %d s; got: %s", want, timeout_s, seen);
}

static void
write_conf(const char *path, const char *url, const char *topic,
           const char *level)
{
        FILE *fp = fopen(path, "w");
        cr_assert(fp != NULL);
        fprintf(fp,
                "[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n"
                "session.timeout.ms = 6000\n[log]\nlevel = %s\n"
                "[consumer.points]\ntopics = %s\nhandler = points\n",
                url, kt_env("KINBOX_BOOTSTRAP"), level, topic);
        fclose(fp);
}

static void
grant(const char *topic, int i)
{
        char payload[128], id[32];
        snprintf(payload, sizeof(payload),
                 "{\"order_id\": \"o-%d\", \"user_id\": %d, "
                 "\"grant_points\": 10}",
                 i, i);
        snprintf(id, sizeof(id), "svc-%d", i);
        kt_producer_t *p = kt_producer_new();
        kt_produce(p, topic, -1, "k", payload, id);
        kt_producer_flush_destroy(p);
}

Test(service, notify_watchdog_sighup_stop, .timeout = 180)
{
        char *url = kt_fresh_db("postgresql");
        char *topic = kt_unique("svc");
        kt_topic(topic, 1);
        char *conf = kt_tmp("service_conf");
        write_conf(conf, url, topic, "info");

        int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
        cr_assert(fd >= 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        char *sock = kt_tmp("notify_sock");
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
        unlink(sock);
        cr_assert(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
        setenv("NOTIFY_SOCKET", sock, 1);
        setenv("WATCHDOG_USEC", "1000000", 1);

        char *log = kt_tmp("service_log");
        pid_t pid = kt_spawn_kinbox(conf, NULL, log);
        expect_notify(fd, "READY=1", 30);
        expect_notify(fd, "WATCHDOG=1", 5);

        grant(topic, 1);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM user_account", 1, 60),
            1));
        char *s = kt_slurp(log);
        cr_assert(s && !strstr(s, "batch of"), "debug line at level info:\n%s",
                  s);
        free(s);

        /* The operator raises the level and reloads. */
        write_conf(conf, url, topic, "debug");
        kill(pid, SIGHUP);
        expect_notify(fd, "RELOADING=1", 10);
        expect_notify(fd, "READY=1", 10);
        grant(topic, 2);
        cr_assert(eq(
            i64, kt_wait_qint(url, "SELECT COUNT(*) FROM user_account", 2, 60),
            2));
        bool found = false;
        for (int i = 0; i < 50 && !found; i++) {
                s = kt_slurp(log);
                found = s && strstr(s, "batch of") &&
                        strstr(s, "SIGHUP: reloaded");
                free(s);
                if (!found)
                        usleep(100000);
        }
        s = kt_slurp(log);
        cr_assert(found, "no debug line after SIGHUP to level debug:\n%s", s);
        free(s);

        kill(pid, SIGTERM);
        expect_notify(fd, "STOPPING=1", 10);
        cr_assert(eq(int, kt_wait(pid, 60), 0));
        close(fd);
        unlink(sock);
}
