// KinboxInterop -- the Java side of tests/interop_test.c: Apache Kafka's own
// Java client (kafka-clients, the jars scripts/setup fetched) producing to
// and consuming from the topics kinbox reads and writes.
//
//   produce BOOTSTRAP TOPIC        stdin: KEYHEX \t VALUEHEX \t NAME=HEX,NAME=HEX...
//                                  (KEYHEX "-": no key; VALUEHEX "-": null value;
//                                  headers "-": none); prints "PARTITION OFFSET"
//                                  per record, in input order
//   consume BOOTSTRAP TOPIC N MS   reads N records from the beginning of every
//                                  partition (at most MS milliseconds); prints
//                                  PARTITION \t OFFSET \t KEYHEX \t VALUEHEX \t HEADERS
//                                  (the same encodings, headers in order)
//   partition-of N KEY...          the partition Kafka's Java producer picks for
//                                  each key (UTF-8) among N partitions
//
// Exit status 0, or 1 with a message on stderr. Built and run by
// tests/java/interop (javac on first use).
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import java.io.BufferedReader;
import java.io.InputStreamReader;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

public final class KinboxInterop {
    private static byte[] unhex(String s) {
        if (s.equals("-")) return null;
        byte[] b = new byte[s.length() / 2];
        for (int i = 0; i < b.length; i++)
            b[i] = (byte) Integer.parseInt(s.substring(2 * i, 2 * i + 2), 16);
        return b;
    }

    private static String hex(byte[] b) {
        if (b == null) return "-";
        StringBuilder sb = new StringBuilder(b.length * 2);
        for (byte x : b) sb.append(String.format("%02x", x & 0xff));
        return sb.toString();
    }

    private static void produce(String bootstrap, String topic) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("acks", "all");
        p.put("enable.idempotence", "true");
        p.put("linger.ms", "5");
        // The default partitioner, as every Java service runs it.
        try (KafkaProducer<byte[], byte[]> pr =
                 new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer())) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
            String line;
            while ((line = in.readLine()) != null) {
                if (line.isEmpty()) continue;
                String[] f = line.split("\t", -1);
                if (f.length != 3) throw new IllegalArgumentException("bad input line: " + line);
                ProducerRecord<byte[], byte[]> r =
                    new ProducerRecord<>(topic, unhex(f[0]), unhex(f[1]));
                if (!f[2].equals("-"))
                    for (String h : f[2].split(",")) {
                        int eq = h.indexOf('=');
                        r.headers().add(h.substring(0, eq), unhex(h.substring(eq + 1)));
                    }
                sent.add(pr.send(r));
            }
            pr.flush();
            for (Future<RecordMetadata> f : sent) {
                RecordMetadata m = f.get();
                System.out.println(m.partition() + " " + m.offset());
            }
        }
    }

    private static void consume(String bootstrap, String topic, int n, long ms) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("enable.auto.commit", "false");
        try (KafkaConsumer<byte[], byte[]> c =
                 new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            List<TopicPartition> tps = new ArrayList<>();
            for (PartitionInfo pi : c.partitionsFor(topic, Duration.ofSeconds(30)))
                tps.add(new TopicPartition(topic, pi.partition()));
            c.assign(tps);
            c.seekToBeginning(tps);
            long end = System.currentTimeMillis() + ms;
            int got = 0;
            StringBuilder out = new StringBuilder();
            while (got < n && System.currentTimeMillis() < end) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    StringBuilder hs = new StringBuilder();
                    for (Header h : r.headers()) {
                        if (hs.length() > 0) hs.append(',');
                        hs.append(h.key()).append('=').append(hex(h.value()));
                    }
                    out.append(r.partition()).append('\t').append(r.offset()).append('\t')
                       .append(hex(r.key())).append('\t').append(hex(r.value())).append('\t')
                       .append(hs.length() > 0 ? hs.toString() : "-").append('\n');
                    got++;
                }
            }
            System.out.print(out);
            if (got < n) {
                System.err.println("consume: " + got + " of " + n + " records in " + ms + " ms");
                System.exit(1);
            }
        }
    }

    public static void main(String[] a) throws Exception {
        if (a.length >= 3 && a[0].equals("produce")) {
            produce(a[1], a[2]);
        } else if (a.length == 5 && a[0].equals("consume")) {
            consume(a[1], a[2], Integer.parseInt(a[3]), Long.parseLong(a[4]));
        } else if (a.length >= 3 && a[0].equals("partition-of")) {
            int n = Integer.parseInt(a[1]);
            for (int i = 2; i < a.length; i++)
                System.out.println(
                    Utils.toPositive(Utils.murmur2(a[i].getBytes(StandardCharsets.UTF_8))) % n);
        } else {
            System.err.println("usage: KinboxInterop produce BOOTSTRAP TOPIC | "
                               + "consume BOOTSTRAP TOPIC N MS | partition-of N KEY...");
            System.exit(2);
        }
    }
}
