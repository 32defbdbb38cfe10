/*
 * hold_int.h -- what hold.c and hold_release.c share (internal): the set
 * of keys held on a partition. The partition's worker thread only (and
 * the rebalance callback before the partition is linked).
 */
#ifndef KINBOX_HOLD_INT_H
#define KINBOX_HOLD_INT_H

#include "hold.h"

typedef struct hent {
        unsigned char *key; /* NULL: free slot */
        size_t len;
        uint64_t hash;
        int64_t blocker_off; /* offset of the blocking dead letter */
        int64_t retry_at; /* release backoff (monotonic ms), 0 none */
        int tries; /* failed release attempts of the head parked row */
} hent_t;

struct kinbox__holdset {
        hent_t *e;
        size_t cap, n; /* cap: a power of two */
};

/* The entry of key k (n bytes) in s (may be NULL), or NULL. */
hent_t *kinbox__hs_find(struct kinbox__holdset *s, const void *k, size_t n);
/* The entry of key k in *sp (the set made or grown as needed), added with
 * blocker offset off when new; NULL when out of memory. */
hent_t *kinbox__hs_add(struct kinbox__holdset **sp, const void *k, size_t n,
                       int64_t off);
/* Remove entry e of s. */
void kinbox__hs_del(struct kinbox__holdset *s, hent_t *e);

#endif
