-- kinbox 0001: inbox, offset watermarks, dead letters (PostgreSQL 12+).
-- Mirrored by migrations/mysql/0001_inbox.sql. The migration runner records
-- the version and runs this file in one transaction.

-- One row per (consumer, message id) whose effect committed (or that was
-- dead-lettered). The primary key is the deduplication.
CREATE TABLE IF NOT EXISTS kinbox_inbox (
    consumer        text        NOT NULL,
    message_id      text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    processed_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id),
    CHECK (octet_length(message_id) <= 255)
);
CREATE INDEX IF NOT EXISTS kinbox_inbox_processed_at
    ON kinbox_inbox (processed_at);

-- The database's own offset watermark, written in the same transaction as
-- the effects: on assignment the consumer starts at max(this, committed).
CREATE TABLE IF NOT EXISTS kinbox_offsets (
    consumer        text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    next_offset     bigint      NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, topic, kafka_partition)
);

-- Messages that could not be applied, with their original bytes.
CREATE TABLE IF NOT EXISTS kinbox_dead_letter (
    id              bigserial   PRIMARY KEY,
    consumer        text        NOT NULL,
    message_id      text,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    msg_key         bytea,
    headers         text,
    payload         bytea,
    error           text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    first_failed_at timestamptz NOT NULL DEFAULT now(),
    dead_at         timestamptz NOT NULL DEFAULT now(),
    status          text        NOT NULL DEFAULT 'dead'
        CHECK (status IN ('dead', 'replayed', 'discarded'))
);
CREATE INDEX IF NOT EXISTS kinbox_dead_letter_consumer_status
    ON kinbox_dead_letter (consumer, status);
