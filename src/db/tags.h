/*
 * db/tags.h -- statement tags and the attribution record: the attribution
 * contract between the backend layer and the consumer (internal; included
 * by db.h, which users include). A failed statement's tag comes back in
 * db->err.tag; everything else the backend learns about whom a result
 * belongs to it writes into the attribution record of the transaction
 * (kinbox__attr_t), which kinbox__db_begin() hands it.
 */
#ifndef KINBOX_DB_TAGS_H
#define KINBOX_DB_TAGS_H

#include <stdbool.h>
#include <stddef.h>

struct kinbox__dberr;

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

/*
 * The attribution record of one transaction: owned by its caller (the
 * consumer's batch), pointed at by db->attr from kinbox__db_begin() on.
 * The backend writes it through that one pointer, and writes nothing when
 * it is NULL (every other user of a connection: nobody attributes). One
 * thread, the connection's.
 */
typedef struct kinbox__attr {
        /* Tags of KINBOX__TAG_CLAIM statements that affected no row, in
         * the order their results were read (kinbox__db_note_none(); the
         * caller empties it). */
        int *none_tags;
        size_t nnone, capnone;
        /* exec_values() (set by the caller per transaction): drop_rows
         * lets a failed row's message be dropped from its statement;
         * call_tag is the tag of the handler call running now (its
         * statements are never dropped from: the call may still queue
         * more), -1 if none. drops: the failures of dropped messages
         * (err.tag names the message), in the order found; the caller
         * empties it. */
        bool drop_rows;
        int call_tag;
        /* exec_values() rows with owners are queued, unsent (the backend
         * sets and clears it): the caller flushes them before a savepoint
         * or the epilogue, so a dropped row's dead letter is queued where
         * it stays. */
        bool rows_queued;
        struct kinbox__dberr *drops;
        size_t ndrops, capdrops;
        /* The query running now has rows with owners (set around
         * ops->query() by kinbox__db_query_hinted()): row r's key
         * hint_keys[r], owner tag hint_tags[r]. hint_n 0: none. */
        const char *const *hint_keys;
        const int *hint_tags;
        size_t hint_n;
} kinbox__attr_t;

#endif
