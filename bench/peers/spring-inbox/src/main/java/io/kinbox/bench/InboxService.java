package io.kinbox.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.transaction.annotation.Transactional;

/**
 * The inbox and the points effect in one JDBC transaction: the message id's
 * inbox row (a taken id: a redelivery, skipped) and the grant with the
 * statements of kinbox's points handler (a taken order: a business
 * duplicate, not credited).
 */
public class InboxService {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final JdbcTemplate jdbc;
    private final String consumer;
    private final boolean pg;
    private final AtomicLong applied = new AtomicLong();
    private final AtomicLong redelivered = new AtomicLong();
    private final AtomicLong business = new AtomicLong();

    InboxService(JdbcTemplate jdbc, String consumer, boolean pg) {
        this.jdbc = jdbc;
        this.consumer = consumer;
        this.pg = pg;
    }

    /** The counts, as kinbox logs them (bench/run's audit reads them). */
    public String counts() {
        return String.format("applied %d, duplicates %d (redelivered) + %d (business)",
                applied.get(), redelivered.get(), business.get());
    }

    @Transactional
    public void applyOne(ConsumerRecord<String, String> rec) throws Exception {
        apply(rec);
    }

    @Transactional
    public void applyBatch(List<ConsumerRecord<String, String>> recs) throws Exception {
        for (ConsumerRecord<String, String> rec : recs) {
            apply(rec);
        }
    }

    private void apply(ConsumerRecord<String, String> rec) throws Exception {
        Header h = rec.headers().lastHeader("message_id");
        if (h == null) {
            throw new IllegalArgumentException("no message_id header at " + rec.topic() + "/"
                    + rec.partition() + "@" + rec.offset());
        }
        String id = new String(h.value(), StandardCharsets.UTF_8);
        int fresh = jdbc.update(pg
                ? "INSERT INTO kinbox_inbox (consumer, message_id, topic, kafka_partition, kafka_offset) "
                        + "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
                : "INSERT INTO kinbox_inbox (consumer, message_id, topic, kafka_partition, kafka_offset) "
                        + "VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE kafka_offset = kafka_offset",
                consumer, id, rec.topic(), rec.partition(), rec.offset());
        if (fresh != 1) {
            redelivered.incrementAndGet();
            return;
        }
        JsonNode g = JSON.readTree(rec.value());
        long user = g.get("user_id").asLong();
        String order = g.get("order_id").asText();
        long points = g.get("grant_points").asLong();
        int credited;
        if (pg) {
            credited = jdbc.update("WITH f AS (INSERT INTO user_points_flow (user_id, order_id, biz_type, "
                    + "points_delta) VALUES (?, ?, 'ORDER_REWARD', ?) ON CONFLICT (order_id, biz_type) "
                    + "DO NOTHING RETURNING user_id, points_delta) INSERT INTO user_account (user_id, points) "
                    + "SELECT user_id, points_delta FROM f ON CONFLICT (user_id) DO UPDATE SET points = "
                    + "user_account.points + EXCLUDED.points", user, order, points);
        } else {
            credited = jdbc.update("INSERT INTO user_points_flow (user_id, order_id, biz_type, points_delta) "
                    + "VALUES (?, ?, 'ORDER_REWARD', ?) ON DUPLICATE KEY UPDATE order_id = order_id",
                    user, order, points);
            if (credited == 1) {
                jdbc.update("INSERT INTO user_account (user_id, points) SELECT ?, ? FROM DUAL "
                        + "WHERE ROW_COUNT() > 0 ON DUPLICATE KEY UPDATE points = points + VALUES(points)",
                        user, points);
            }
        }
        if (credited == 1) {
            applied.incrementAndGet();
        } else {
            business.incrementAndGet();
        }
    }
}
