/*
 * errstr.c -- kinbox__errstr(), the one errstr writer. Compiled into the
 * library and, with confval.c and hdrcodec.c, into the kinbox command
 * (the library does not export internal symbols).
 */
#include "errstr.h"

#include <stdarg.h>
#include <stdio.h>

void
kinbox__errstr(char *errstr, size_t size, const char *fmt, ...)
{
        if (!errstr || !size)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(errstr, size, fmt, ap);
        va_end(ap);
}
