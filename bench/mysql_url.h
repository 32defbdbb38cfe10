/*
 * mysql_url.h -- connect to mysql://user[:pass]@host[:port]/db, for the
 * bench programs (the library's own URL parser is internal).
 */
#ifndef KINBOX_BENCH_MYSQL_URL_H
#define KINBOX_BENCH_MYSQL_URL_H

#include <mysql.h>

/* A connected handle, or NULL with a message in err (the URL's form or
 * the server's error). The caller closes the handle. */
MYSQL *bench_mysql_connect(const char *url, char *err, size_t errsz);

#endif
