package io.kinbox.bench;

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.ChangeEvent;
import io.debezium.embedded.Connect;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;

/**
 * The Debezium peer of bench/run's peers series (relay side): an embedded
 * Debezium engine (PostgreSQL with pgoutput, or the MySQL connector on
 * MariaDB's binlog) reading the outbox table Debezium documents (id,
 * aggregatetype, aggregateid, type, payload), the outbox event router SMT
 * (io.debezium.transforms.outbox.EventRouter: topic from aggregatetype, key =
 * aggregateid, value = payload, the event id as header "id"), and a plain
 * kafka-clients producer. Each batch the engine hands over is sent, the
 * sends awaited (acks=all, idempotent), and only then marked processed, so
 * the offsets (a file) and PostgreSQL's slot advance after the broker's ack:
 * at-least-once, per-aggregate order kept (one producer, keyed records).
 *
 * <p>Settings are system properties: bench.connector (postgres or mysql),
 * bench.host, bench.port, bench.user, bench.password, bench.db,
 * bench.table (outboxevent), bench.bootstrap, bench.dir (offsets and schema
 * history files), bench.slot (PostgreSQL slot name), bench.server_id
 * (MySQL), bench.poll_ms (the engine's poll.interval.ms). Runs until SIGTERM,
 * then prints its counts to stderr.
 */
public final class DebeziumOutbox {

    static String prop(String name, String dflt) {
        String v = System.getProperty("bench." + name, dflt);
        if (v == null) {
            throw new IllegalArgumentException("missing -Dbench." + name);
        }
        return v;
    }

    static byte[] bytes(Object o) {
        if (o == null) {
            return null;
        }
        if (o instanceof byte[] b) {
            return b;
        }
        if (o instanceof ByteBuffer bb) {
            byte[] b = new byte[bb.remaining()];
            bb.duplicate().get(b);
            return b;
        }
        return o.toString().getBytes(StandardCharsets.UTF_8);
    }

    public static void main(String[] args) throws Exception {
        String connector = prop("connector", null);
        String dir = prop("dir", null);
        String db = prop("db", null);
        String table = prop("table", "outboxevent");

        Properties p = new Properties();
        p.setProperty("name", "kinbox-bench-debezium");
        p.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        p.setProperty("offset.storage.file.filename", dir + "/offsets.dat");
        p.setProperty("offset.flush.interval.ms", prop("flush_ms", "1000"));
        p.setProperty("database.hostname", prop("host", "127.0.0.1"));
        p.setProperty("database.port", prop("port", null));
        p.setProperty("database.user", prop("user", null));
        p.setProperty("database.password", prop("password", null));
        p.setProperty("topic.prefix", "kbdbz");
        // Streaming only: the rows of a run are written after the first
        // start, which records the position (slot / binlog file and offset).
        p.setProperty("snapshot.mode", "no_data");
        p.setProperty("poll.interval.ms", prop("poll_ms", "500"));
        if (connector.equals("postgres")) {
            p.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
            p.setProperty("database.dbname", db);
            p.setProperty("plugin.name", "pgoutput");
            p.setProperty("slot.name", prop("slot", "kinbox_bench"));
            p.setProperty("publication.name", "kinbox_bench_pub");
            p.setProperty("publication.autocreate.mode", "filtered");
            p.setProperty("table.include.list", "public." + table);
        } else {
            p.setProperty("connector.class", "io.debezium.connector.mysql.MySqlConnector");
            p.setProperty("database.server.id", prop("server_id", "5401"));
            p.setProperty("database.include.list", db);
            p.setProperty("table.include.list", db + "." + table);
            p.setProperty("include.schema.changes", "false");
            p.setProperty("schema.history.internal", "io.debezium.storage.file.history.FileSchemaHistory");
            p.setProperty("schema.history.internal.file.filename", dir + "/schema-history.dat");
        }
        // The outbox event router, as documented; the topic is the
        // aggregatetype column itself (the bench writes the topic's name).
        p.setProperty("transforms", "outbox");
        p.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        p.setProperty("transforms.outbox.route.topic.replacement", "${routedByValue}");
        p.setProperty("transforms.outbox.table.expand.json.payload", "false");

        Properties kp = new Properties();
        kp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, prop("bootstrap", null));
        kp.put(ProducerConfig.ACKS_CONFIG, "all");
        kp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        kp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        kp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(kp);

        AtomicLong published = new AtomicLong(), skipped = new AtomicLong(), batches = new AtomicLong();
        DebeziumEngine.ChangeConsumer<ChangeEvent<SourceRecord, SourceRecord>> consumer = (records, committer) -> {
            List<Future<RecordMetadata>> sent = new ArrayList<>(records.size());
            for (ChangeEvent<SourceRecord, SourceRecord> e : records) {
                SourceRecord r = e.value();
                if (r.value() == null || r.topic() == null || r.topic().startsWith("kbdbz")) {
                    skipped.incrementAndGet();  // heartbeats, tombstones, other tables
                    continue;
                }
                ProducerRecord<byte[], byte[]> pr = new ProducerRecord<>(r.topic(), null, bytes(r.key()), bytes(r.value()));
                for (Header h : r.headers()) {
                    pr.headers().add(h.key(), bytes(h.value()));
                }
                sent.add(producer.send(pr));
            }
            for (Future<RecordMetadata> f : sent) {
                try {
                    f.get();
                } catch (java.util.concurrent.ExecutionException ex) {
                    throw new RuntimeException(ex.getCause());
                }
            }
            published.addAndGet(sent.size());
            batches.incrementAndGet();
            for (ChangeEvent<SourceRecord, SourceRecord> e : records) {
                committer.markProcessed(e);
            }
            committer.markBatchFinished();
        };

        CountDownLatch done = new CountDownLatch(1);
        DebeziumEngine<ChangeEvent<SourceRecord, SourceRecord>> engine = DebeziumEngine.create(Connect.class)
                .using(p)
                .notifying(consumer)
                .using((success, message, error) -> {
                    if (!success) {
                        System.err.println("debezium-outbox: engine stopped: " + message);
                        if (error != null) {
                            error.printStackTrace();
                        }
                    }
                    done.countDown();
                })
                .build();
        ExecutorService ex = Executors.newSingleThreadExecutor();
        long t0 = System.nanoTime();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                engine.close();
                done.await(30, TimeUnit.SECONDS);
            } catch (Exception e) {
                e.printStackTrace();
            }
            producer.close();
            System.err.printf("debezium-outbox: published %d, skipped %d, batches %d in %.1f s%n",
                    published.get(), skipped.get(), batches.get(), (System.nanoTime() - t0) / 1e9);
        }));
        ex.execute(engine);
        done.await();
        ex.shutdown();
    }
}
