/*
 * errstr.h -- write a caller's errstr buffer (internal).
 */
#ifndef KINBOX_ERRSTR_H
#define KINBOX_ERRSTR_H

#include <stddef.h>

/* printf into errstr (NULL or size 0: nothing). */
void kinbox__errstr(char *errstr, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
