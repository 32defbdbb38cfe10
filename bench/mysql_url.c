#include "mysql_url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

MYSQL *
bench_mysql_connect(const char *url, char *err, size_t errsz)
{
        char u[512];
        snprintf(u, sizeof(u), "%s", url);
        char *user = u + 8, *at = strchr(user, '@');
        char *host = at ? at + 1 : NULL;
        char *db = host ? strchr(host, '/') : NULL;
        if (strncmp(u, "mysql://", 8) || !db) {
                snprintf(err, errsz,
                         "bad mysql url %s: expected "
                         "mysql://user:pass@host:port/db",
                         url);
                return NULL;
        }
        *at = 0;
        *db++ = 0;
        char *pass = strchr(user, ':');
        if (pass)
                *pass++ = 0;
        char *port = strchr(host, ':');
        if (port)
                *port++ = 0;
        MYSQL *my = mysql_init(NULL);
        if (!my ||
            !mysql_real_connect(my, host, user, pass, db,
                                port ? (unsigned)atoi(port) : 3306, NULL, 0)) {
                snprintf(err, errsz, "mysql connect: %s",
                         my ? mysql_error(my) : "out of memory");
                if (my)
                        mysql_close(my);
                return NULL;
        }
        return my;
}
