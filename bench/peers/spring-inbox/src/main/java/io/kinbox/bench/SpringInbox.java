package io.kinbox.bench;

import com.zaxxer.hikari.HikariConfig;
import com.zaxxer.hikari.HikariDataSource;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import javax.sql.DataSource;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.kafka.annotation.EnableKafka;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.config.ConcurrentKafkaListenerContainerFactory;
import org.springframework.kafka.core.ConsumerFactory;
import org.springframework.kafka.core.DefaultKafkaConsumerFactory;
import org.springframework.kafka.listener.ContainerProperties.AckMode;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.annotation.EnableTransactionManagement;

/**
 * The Spring Kafka peer of bench/run's peers series: a {@code @KafkaListener}
 * whose {@code @Transactional} service inserts the message id into the inbox
 * table (a taken id skips the message) and applies the points grant in the
 * same JDBC transaction; the container commits the offset after the listener
 * returns, so after COMMIT ({@code AckMode.RECORD}: one transaction and one
 * synchronous offset commit per record; {@code --batch}: a batch listener,
 * one transaction per poll, {@code AckMode.BATCH}).
 *
 * <p>Settings come from system properties: bench.bootstrap, bench.topic,
 * bench.group, bench.jdbc (a jdbc:postgresql: or jdbc:mariadb: URL),
 * bench.user, bench.password, bench.consumer (the inbox's consumer name),
 * bench.mode (record or batch). Runs until SIGTERM, then prints its counts
 * to stderr.
 */
public final class SpringInbox {

    static String prop(String name) {
        String v = System.getProperty("bench." + name);
        if (v == null) {
            throw new IllegalArgumentException("missing -Dbench." + name);
        }
        return v;
    }

    @Configuration
    @EnableKafka
    @EnableTransactionManagement
    public static class Config {
        @Bean(destroyMethod = "close")
        public HikariDataSource dataSource() {
            HikariConfig c = new HikariConfig();
            c.setJdbcUrl(prop("jdbc"));
            c.setUsername(prop("user"));
            c.setPassword(prop("password"));
            c.setMaximumPoolSize(2);
            c.setMinimumIdle(1);
            c.setAutoCommit(true);
            c.setTransactionIsolation("TRANSACTION_READ_COMMITTED");
            return new HikariDataSource(c);
        }

        @Bean
        public PlatformTransactionManager transactionManager(DataSource ds) {
            return new DataSourceTransactionManager(ds);
        }

        @Bean
        public JdbcTemplate jdbcTemplate(DataSource ds) {
            return new JdbcTemplate(ds);
        }

        @Bean
        public InboxService inboxService(JdbcTemplate jdbc) {
            return new InboxService(jdbc, prop("consumer"), prop("jdbc").startsWith("jdbc:postgresql:"));
        }

        @Bean
        public ConsumerFactory<String, String> consumerFactory() {
            Map<String, Object> p = new HashMap<>();
            p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, prop("bootstrap"));
            p.put(ConsumerConfig.GROUP_ID_CONFIG, prop("group"));
            p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
            p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
            p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 6000);
            p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
            p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
            return new DefaultKafkaConsumerFactory<>(p);
        }

        @Bean
        public ConcurrentKafkaListenerContainerFactory<String, String> recordFactory(
                ConsumerFactory<String, String> cf) {
            ConcurrentKafkaListenerContainerFactory<String, String> f =
                    new ConcurrentKafkaListenerContainerFactory<>();
            f.setConsumerFactory(cf);
            f.setConcurrency(1);
            f.getContainerProperties().setAckMode(AckMode.RECORD);
            f.getContainerProperties().setSyncCommits(true);
            f.setAutoStartup(!"batch".equals(prop("mode")));
            return f;
        }

        @Bean
        public ConcurrentKafkaListenerContainerFactory<String, String> batchFactory(
                ConsumerFactory<String, String> cf) {
            ConcurrentKafkaListenerContainerFactory<String, String> f =
                    new ConcurrentKafkaListenerContainerFactory<>();
            f.setConsumerFactory(cf);
            f.setConcurrency(1);
            f.setBatchListener(true);
            f.getContainerProperties().setAckMode(AckMode.BATCH);
            f.getContainerProperties().setSyncCommits(true);
            f.setAutoStartup("batch".equals(prop("mode")));
            return f;
        }

        @Bean
        public Listeners listeners(InboxService svc) {
            return new Listeners(svc);
        }
    }

    /** The listeners: each hands its record(s) to the transactional service. */
    public static class Listeners {
        private final InboxService svc;

        Listeners(InboxService svc) {
            this.svc = svc;
        }

        @KafkaListener(id = "inbox-record", idIsGroup = false, topics = "#{systemProperties['bench.topic']}",
                containerFactory = "recordFactory")
        public void onRecord(ConsumerRecord<String, String> rec) throws Exception {
            svc.applyOne(rec);
        }

        @KafkaListener(id = "inbox-batch", idIsGroup = false, topics = "#{systemProperties['bench.topic']}",
                containerFactory = "batchFactory")
        public void onBatch(List<ConsumerRecord<String, String>> recs) throws Exception {
            svc.applyBatch(recs);
        }
    }

    public static void main(String[] args) {
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        AnnotationConfigApplicationContext ctx = new AnnotationConfigApplicationContext(Config.class);
        InboxService svc = ctx.getBean(InboxService.class);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            ctx.close();
            System.err.println("spring-inbox: " + svc.counts());
            System.err.flush();
        }));
    }
}
