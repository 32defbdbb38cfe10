-- kinbox 0006: per-key holds (dead_letter.hold_key). Mirrors
-- migrations/postgresql/0006_hold.sql. Keys are VARBINARY (byte for byte,
-- like message ids); 1024 bytes keep the primary key under InnoDB's 3072.
CREATE TABLE IF NOT EXISTS kinbox_hold (
    consumer        VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    topic           VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    kafka_partition INT NOT NULL,
    hold_key        VARBINARY(1024) NOT NULL,
    blocker_id      BIGINT NOT NULL,
    held_at         TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (consumer, topic, kafka_partition, hold_key),
    INDEX kinbox_hold_blocker (blocker_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS kinbox_parked (
    id              BIGINT NOT NULL AUTO_INCREMENT,
    consumer        VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    topic           VARCHAR(249) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    kafka_partition INT NOT NULL,
    kafka_offset    BIGINT NOT NULL,
    hold_key        VARBINARY(1024) NOT NULL,
    message_id      VARBINARY(255) NOT NULL,
    msg_key         LONGBLOB NULL,
    headers         JSON NULL,
    payload         LONGBLOB NULL,
    parked_at       TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (id),
    INDEX kinbox_parked_key (consumer, topic, kafka_partition, hold_key, kafka_offset)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The hold upsert finds its blocker by coordinates.
CREATE INDEX IF NOT EXISTS kinbox_dead_letter_coords ON kinbox_dead_letter
    (consumer, topic, kafka_partition, kafka_offset);
