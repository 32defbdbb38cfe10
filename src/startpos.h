/*
 * startpos.h -- start positions you can audit (internal): the identity of
 * the record at a watermark, and the watermark rows as kinbox_offsets
 * holds them. The classification itself is public
 * (kinbox_startpos_classify(), include/kinbox/admin.h).
 */
#ifndef KINBOX_STARTPOS_H
#define KINBOX_STARTPOS_H

#include "db.h"
#include "kinbox/admin.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The identity of a record stored with the watermark next to it:
 * FNV-1a 64 over the key's length (8 bytes, little endian; all ones for
 * no key), the key, the payload's length (the same way) and the payload.
 * The lengths keep a missing key apart from an empty one, and key "ab"
 * with payload "c" apart from key "a" with payload "bc". */
uint64_t kinbox__record_hash(const void *key, size_t klen, const void *payload,
                             size_t plen);

/* One watermark row of a consumer. */
typedef struct kinbox__wm {
        char *topic;
        int32_t partition;
        int64_t next_offset; /* W */
        bool has_identity; /* last_ts and last_hash were stored */
        int64_t last_ts;
        uint64_t last_hash;
} kinbox__wm_t;

/* Read every watermark row of consumer (a connection lost once is tried
 * again). *out (malloc'ed, kinbox__wms_free()) and *n. KINBOX_OK, or the
 * database's error code (db->err). */
int kinbox__wms_read(kinbox__db_t *db, const char *consumer,
                     kinbox__wm_t **out, size_t *n);
void kinbox__wms_free(kinbox__wm_t *w, size_t n);
/* The row of topic/partition in w[0..n), or NULL. */
const kinbox__wm_t *kinbox__wms_find(const kinbox__wm_t *w, size_t n,
                                     const char *topic, int32_t partition);

/* What resolves v, as the consumer's error line and the CLI say it:
 * "kinbox offsets reset ... --to X". */
const char *kinbox__startpos_fix(kinbox_startpos_t v);

#endif
