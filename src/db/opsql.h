/*
 * opsql.h -- the operator statements (admin.c, dead.c, verify.c) that both
 * backends spell alike: one list of designated initializers, spliced into
 * each backend's dialect table (pg.c, mysql.c). Parameters as in db.h.
 */
#ifndef KINBOX_DB_OPSQL_H
#define KINBOX_DB_OPSQL_H

/* The hold join: a dead letter's parked followers (h.blocker_id). */
#define KINBOX__OPSQL_FOLLOWERS                                               \
        " FROM kinbox_hold h JOIN kinbox_parked p ON "                        \
        "p.consumer = h.consumer AND p.topic = h.topic AND "                  \
        "p.kafka_partition = h.kafka_partition AND p.hold_key = "             \
        "h.hold_key WHERE h.blocker_id = $1"

/* A dead-letter list's tail (dead_list, console_dead_page): the count of
 * its parked followers, then the dead letters of consumer $1 and status $2
 * (NULL: any). */
#define KINBOX__OPSQL_DEAD_FROM                                               \
        " (SELECT count(*) FROM kinbox_hold h JOIN kinbox_parked p"           \
        "  ON p.consumer = h.consumer AND p.topic = h.topic"                  \
        "  AND p.kafka_partition = h.kafka_partition"                         \
        "  AND p.hold_key = h.hold_key WHERE h.blocker_id = d.id)"            \
        " FROM kinbox_dead_letter d"                                          \
        " WHERE COALESCE($1, consumer) = consumer"                            \
        " AND COALESCE($2, status) = status"

#define KINBOX__OPSQL                                                         \
        .ping = "SELECT 1",                                                   \
        .outbox_paused =                                                      \
            "SELECT 1 FROM kinbox_outbox_paused WHERE destination = $1",      \
        .outbox_resume =                                                      \
            "DELETE FROM kinbox_outbox_paused WHERE destination = $1",        \
        .consumer_status =                                                    \
            "SELECT (SELECT count(*) FROM kinbox_inbox WHERE consumer = $1 "  \
            "AND NOT shadow),"                                                \
            " (SELECT count(*) FROM kinbox_dead_letter WHERE consumer = $1"   \
            "  AND status = 'dead'),"                                         \
            " (SELECT count(*) FROM kinbox_dead_letter WHERE consumer = $1"   \
            "  AND status = 'replayed'),"                                     \
            " (SELECT count(*) FROM kinbox_dead_letter WHERE consumer = $1"   \
            "  AND status NOT IN ('dead', 'replayed')),"                      \
            " (SELECT count(*) FROM kinbox_parked WHERE consumer = $1),"      \
            " (SELECT count(*) FROM kinbox_hold WHERE consumer = $1),"        \
            " (SELECT min(parked_at) FROM kinbox_parked WHERE consumer = "    \
            "$1)",                                                            \
        .inbox_rows = "SELECT count(*) FROM kinbox_inbox WHERE NOT shadow",   \
        .consumers = "SELECT consumer, topic FROM kinbox_offsets UNION "      \
                     "SELECT consumer, topic FROM kinbox_dead_letter "        \
                     "ORDER BY 1, 2",                                         \
        .dead_list =                                                          \
            "SELECT id, consumer, topic, kafka_partition, kafka_offset,"      \
            " message_id, status, attempts, dead_at, "                        \
            "error," KINBOX__OPSQL_DEAD_FROM " ORDER BY id LIMIT %ld",        \
        .dead_show =                                                          \
            "SELECT id, consumer, message_id, topic, kafka_partition, "       \
            "kafka_offset, msg_key, headers, payload, error, attempts, "      \
            "first_failed_at, dead_at, status FROM kinbox_dead_letter "       \
            "WHERE id = $1",                                                  \
        .dead_parked =                                                        \
            "SELECT p.id, p.consumer, p.topic, p.kafka_partition,"            \
            " p.kafka_offset, p.message_id, p.hold_key, h.blocker_id,"        \
            " p.parked_at FROM kinbox_parked p LEFT JOIN kinbox_hold h"       \
            " ON h.consumer = p.consumer AND h.topic = p.topic"               \
            " AND h.kafka_partition = p.kafka_partition"                      \
            " AND h.hold_key = p.hold_key"                                    \
            " WHERE COALESCE($1, p.consumer) = p.consumer"                    \
            " ORDER BY p.consumer, p.topic, p.kafka_partition,"               \
            " p.hold_key, p.kafka_offset LIMIT %ld",                          \
        .dead_status = "SELECT status FROM kinbox_dead_letter WHERE id = $1", \
        .dead_discard = "UPDATE kinbox_dead_letter SET status = 'discarded'"  \
                        " WHERE id = $1 AND status = 'dead'",                 \
        .dead_held = "SELECT count(*)" KINBOX__OPSQL_FOLLOWERS,               \
        .dead_last_follower =                                                 \
            "SELECT p.id, p.consumer, p.topic, p.kafka_partition, "           \
            "p.kafka_offset" KINBOX__OPSQL_FOLLOWERS                          \
            " ORDER BY p.kafka_offset DESC LIMIT 1",                          \
        .dead_follower_state =                                                \
            "SELECT h.blocker_id, d.status FROM kinbox_parked q "             \
            "LEFT JOIN kinbox_hold h ON h.consumer = q.consumer AND "         \
            "h.topic = q.topic AND h.kafka_partition = "                      \
            "q.kafka_partition AND h.hold_key = q.hold_key LEFT "             \
            "JOIN kinbox_dead_letter d ON d.id = h.blocker_id AND "           \
            "d.id <> $2 WHERE q.id = $1",                                     \
        .dead_at =                                                            \
            "SELECT id FROM kinbox_dead_letter WHERE consumer = $1 AND "      \
            "topic "                                                          \
            "= $2 AND kafka_partition = $3 AND kafka_offset = $4 AND status " \
            "= 'dead'",                                                       \
        .verify_ahead =                                                       \
            "SELECT s.src, s.topic, s.kafka_partition, count(*),"             \
            " min(s.kafka_offset), max(s.kafka_offset), max(o.next_offset)"   \
            " FROM (SELECT 'inbox' AS src, consumer, topic, kafka_partition," \
            "  kafka_offset FROM kinbox_inbox WHERE consumer = $1 AND NOT"    \
            "  shadow"                                                        \
            "  UNION ALL SELECT 'dead_letter', consumer, topic,"              \
            "  kafka_partition, kafka_offset FROM kinbox_dead_letter"         \
            "  WHERE consumer = $1) s"                                        \
            " LEFT JOIN kinbox_offsets o ON o.consumer = s.consumer"          \
            "  AND o.topic = s.topic AND o.kafka_partition = "                \
            "s.kafka_partition"                                               \
            " WHERE o.next_offset IS NULL OR s.kafka_offset >= o.next_offset" \
            " GROUP BY s.src, s.topic, s.kafka_partition"                     \
            " ORDER BY s.topic, s.kafka_partition",                           \
        .verify_cover =                                                       \
            "SELECT o.topic, o.kafka_partition, o.next_offset,"               \
            " COALESCE(u.n, 0), u.lo FROM kinbox_offsets o LEFT JOIN"         \
            " (SELECT topic, kafka_partition, count(*) AS n,"                 \
            " min(kafka_offset) AS lo FROM (SELECT topic,"                    \
            " kafka_partition, kafka_offset FROM kinbox_inbox WHERE"          \
            " consumer = $1 UNION SELECT topic, kafka_partition,"             \
            " kafka_offset FROM kinbox_dead_letter WHERE consumer = $1) a"    \
            " GROUP BY topic, kafka_partition) u ON u.topic = o.topic"        \
            " AND u.kafka_partition = o.kafka_partition"                      \
            " WHERE o.consumer = $1 ORDER BY o.topic, o.kafka_partition",     \
        .console_dead_page =                                                  \
            "SELECT id, consumer, topic, kafka_partition, kafka_offset,"      \
            " message_id, status, attempts, first_failed_at, dead_at, "       \
            "error," KINBOX__OPSQL_DEAD_FROM                                  \
            " AND COALESCE($3, topic) = topic AND id < $4"                    \
            " ORDER BY id DESC LIMIT %ld"

#endif
