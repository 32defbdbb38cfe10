-- kinbox 0002: the transactional outbox (MySQL 8 / MariaDB 10.6+: SKIP LOCKED).
-- Mirrors migrations/postgresql/0002_outbox.sql. DDL commits implicitly on
-- MySQL, so a run that failed half-way is re-run: hence IF NOT EXISTS.
--
-- destination, idem_key and aggregate_id are VARBINARY(255): keys compare
-- byte for byte (a utf8mb4_bin VARCHAR would treat 'k' and 'k ' as the same
-- key). Times are TIMESTAMP(6) (stored as UTC, compared in one session time
-- zone), each with an explicit NULL or DEFAULT.
CREATE TABLE IF NOT EXISTS kinbox_outbox (
    id              BIGINT         NOT NULL AUTO_INCREMENT,
    kind            VARCHAR(8)     NOT NULL DEFAULT 'event',
    destination     VARBINARY(255) NOT NULL,
    idem_key        VARBINARY(255) NOT NULL,
    aggregate_id    VARBINARY(255) NULL,
    payload         LONGBLOB       NULL,
    headers         MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    status          VARCHAR(10)    NOT NULL DEFAULT 'pending',
    attempts        INT            NOT NULL DEFAULT 0,
    max_attempts    INT            NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    version         BIGINT         NOT NULL DEFAULT 0,
    lease_owner     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    last_error      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at      TIMESTAMP(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    sent_at         TIMESTAMP(6)   NULL DEFAULT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY kinbox_outbox_dest_idem (destination, idem_key),
    KEY kinbox_outbox_claim (status, next_attempt_at, id),
    KEY kinbox_outbox_aggregate (aggregate_id, status, id),
    KEY kinbox_outbox_status (status, destination),
    KEY kinbox_outbox_sent_at (sent_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
