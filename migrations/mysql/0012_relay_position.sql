-- kinbox 0012: where a relay that reads the binlog ([relay] source =
-- binlog) stands (issue 38). MariaDB only: PostgreSQL's log relay keeps
-- its position in its replication slot.
--
-- gtid is the GTID state (MariaDB's "domain-server-seq" list, as
-- @@gtid_binlog_pos prints it) after the last transaction whose every
-- outbox row Kafka acknowledged; a restarted relay reads the binlog from
-- there. relay is the relay's name ([relay] name, default "kinbox").
CREATE TABLE IF NOT EXISTS kinbox_relay_position (
    relay      VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    gtid       VARCHAR(2048) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (relay)
) ENGINE = InnoDB;
