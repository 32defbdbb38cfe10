-- kinbox 0006: per-key holds (dead_letter.hold_key). Mirrored by
-- migrations/mysql/0006_hold.sql.
--
-- A held key: a dead letter (blocker_id, a kinbox_dead_letter id) holds
-- back the later messages of its key on its partition. Deleted by the
-- consumer once the blocker left 'dead' and every parked follower was
-- applied. Never pruned.
CREATE TABLE IF NOT EXISTS kinbox_hold (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    hold_key        bytea       NOT NULL,
    blocker_id      bigint      NOT NULL,
    held_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, kafka_partition, hold_key),
    CHECK (octet_length(hold_key) <= 1024)
);
CREATE INDEX IF NOT EXISTS kinbox_hold_blocker ON kinbox_hold (blocker_id);

-- Messages parked behind a held key, with their original bytes, in the
-- transaction that moved the offset past them (their inbox row too).
-- Applied in offset order when the hold is released. Never pruned.
CREATE TABLE IF NOT EXISTS kinbox_parked (
    id              bigserial   PRIMARY KEY,
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    hold_key        bytea       NOT NULL,
    message_id      text        NOT NULL,
    msg_key         bytea,
    headers         text,
    payload         bytea,
    parked_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS kinbox_parked_key ON kinbox_parked
    (consumer, topic, kafka_partition, hold_key, kafka_offset);

-- The hold upsert finds its blocker by coordinates.
CREATE INDEX IF NOT EXISTS kinbox_dead_letter_coords ON kinbox_dead_letter
    (consumer, topic, kafka_partition, kafka_offset);
