-- kinbox 0001: inbox, offset watermarks, dead letters (MySQL 8 / MariaDB 10.5+).
-- Mirrors migrations/postgresql/0001_inbox.sql. The migration runner records
-- the version itself. DDL commits implicitly on MySQL, so a run that failed
-- half-way is re-run: hence IF NOT EXISTS.
--
-- message_id is VARBINARY(255): ids compare byte for byte. A utf8mb4_bin
-- VARCHAR would still treat 'a' and 'a ' as the same key (PAD SPACE), and
-- the NO PAD binary collations are spelled differently on MySQL and MariaDB.
-- Every TIMESTAMP has an explicit NULL or DEFAULT so that servers running
-- with explicit_defaults_for_timestamp=OFF add no ON UPDATE behaviour.

CREATE TABLE IF NOT EXISTS kinbox_inbox (
    consumer        VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id      VARBINARY(255) NOT NULL,
    topic           VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    kafka_partition INT NOT NULL,
    kafka_offset    BIGINT NOT NULL,
    -- Set by each batch insert to a random per-call token, so the rows that
    -- one INSERT ... ON DUPLICATE KEY UPDATE really inserted can be read back
    -- (MySQL has no RETURNING). Meaningless after commit.
    tx_token        CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL,
    processed_at    TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer, message_id),
    INDEX kinbox_inbox_processed_at (processed_at),
    INDEX kinbox_inbox_tx_token (consumer, tx_token)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS kinbox_offsets (
    consumer        VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    topic           VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    kafka_partition INT NOT NULL,
    next_offset     BIGINT NOT NULL,
    updated_at      TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer, topic, kafka_partition)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS kinbox_dead_letter (
    id              BIGINT NOT NULL AUTO_INCREMENT,
    consumer        VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    message_id      VARBINARY(255) NULL,
    topic           VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    kafka_partition INT NOT NULL,
    kafka_offset    BIGINT NOT NULL,
    msg_key         LONGBLOB NULL,
    headers         JSON NULL,
    payload         LONGBLOB NULL,
    -- MEDIUMTEXT, not TEXT: strict mode would reject a reason over 64 KiB
    -- and with it the dead letter itself.
    error           MEDIUMTEXT NOT NULL,
    attempts        INT NOT NULL DEFAULT 0,
    first_failed_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    dead_at         TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    status          VARCHAR(16) CHARACTER SET ascii NOT NULL DEFAULT 'dead',
    PRIMARY KEY (id),
    INDEX kinbox_dead_letter_consumer_status (consumer, status),
    CONSTRAINT kinbox_dead_letter_status
        CHECK (status IN ('dead', 'replayed', 'discarded'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
