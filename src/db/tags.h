/*
 * db/tags.h -- statement tags, the attribution contract between the
 * backend layer and the consumer (internal; included by db.h, which users
 * include). The connection's side of it (db->err.tag, db->none_tags, the
 * drop_rows / call_tag / drops of exec_values() rows, the hints of a
 * query with owners) is in struct kinbox__db, db.h.
 */
#ifndef KINBOX_DB_TAGS_H
#define KINBOX_DB_TAGS_H

/*
 * Statement tags. A tag travels with each deferred statement and comes back
 * in db->err.tag when that statement fails, so the consumer can charge the
 * failure to exactly the message that queued it.
 *   >= 0 without KINBOX__TAG_GROUP: a per-message handler call; the low
 *        bits are the message's index in the batch;
 *   with KINBOX__TAG_GROUP: a batch handler call for the savepoint group
 *        whose first message has index N (low bits); no one message owns
 *        its set-based statements;
 *   KINBOX__TAG_UNIQUE may be or'ed into either: the statement's unique
 *        violation means "already applied" (kinbox_tx_exec_unique());
 *   KINBOX__TAG_CLAIM likewise: no row affected means "already applied"
 *        (kinbox_tx_exec_claim());
 *   -1: kinbox's own statements; KINBOX__TAG_MERGED(_AT): see below.
 */
#define KINBOX__TAG_UNIQUE (1 << 28)
#define KINBOX__TAG_GROUP (1 << 29)
#define KINBOX__TAG_MERGED_BIT (1 << 27)
/* A kinbox_tx_exec_claim() statement: the backend notes it in
 * db->none_tags when it affected no row. */
#define KINBOX__TAG_CLAIM (1 << 26)
#define KINBOX__TAG_LOW(t) ((t) & ((1 << 26) - 1))
/* A merged statement (MySQL) whose first row came from message i: no one
 * message is to blame, but all its rows lie in i's savepoint group. */
#define KINBOX__TAG_MERGED_AT(i) (KINBOX__TAG_MERGED_BIT | KINBOX__TAG_LOW(i))
/* err.tag of a failed statement that merged rows of several messages
 * (MySQL coalescing): no one message is to blame; run the batch again. */
#define KINBOX__TAG_MERGED (-3)

#endif
