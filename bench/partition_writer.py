#!/usr/bin/env python3
"""bench/partition_writer.py -- the steady inbox writer of bench/partition.

Inserts inbox rows the way a consumer's batch does: BATCH rows (one
consumer, message ids ordered by time, 26 bytes, like the fill's) in one
INSERT ... ON CONFLICT DO NOTHING RETURNING (PostgreSQL; the consumer's
unnest() form) or INSERT IGNORE ... RETURNING (MariaDB), plus the offset
upsert, in one transaction; one connection, closed loop (the next
transaction starts when the last one committed). One line per transaction
on OUT: "start_unix_s latency_s rows_inserted". Runs until SIGTERM/SIGINT.

Usage: partition_writer.py postgresql|mysql URL OUT [BATCH]
"""
import os
import signal
import sys
import time
import urllib.parse

stop = False


def on_signal(*_):
    global stop
    stop = True


def main():
    backend, url, out = sys.argv[1], sys.argv[2], sys.argv[3]
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 100
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tag = "w%05d" % (os.getpid() % 100000)
    seq = 0
    if backend == "postgresql":
        import psycopg
        conn = psycopg.connect(url, autocommit=False)
        ins = ("INSERT INTO kinbox_inbox (consumer, message_id, topic, "
               "kafka_partition, kafka_offset, msg_at, part_at, shadow) "
               "SELECT 'bench', u.id, 'bench.points', u.part, u.off, "
               "to_timestamp(u.ms / 1000.0), "
               "to_timestamp(floor(u.ms / 86400000.0) * 86400), false "
               "FROM unnest(%s::text[], %s::int[], %s::bigint[], "
               "%s::bigint[]) AS u(id, part, off, ms) "
               "ON CONFLICT DO NOTHING RETURNING message_id")
        off = ("INSERT INTO kinbox_offsets (consumer, topic, kafka_partition, "
               "next_offset, updated_at) VALUES ('bench', 'bench.points', "
               "%s, %s, now()) ON CONFLICT (consumer, topic, kafka_partition) "
               "DO UPDATE SET next_offset = GREATEST("
               "kinbox_offsets.next_offset, EXCLUDED.next_offset), "
               "updated_at = now()")
    else:
        import pymysql
        u = urllib.parse.urlparse(url)
        conn = pymysql.connect(host=u.hostname, port=u.port or 3306,
                               user=urllib.parse.unquote(u.username or ""),
                               password=urllib.parse.unquote(u.password or ""),
                               database=u.path.lstrip("/"), autocommit=False)
        with conn.cursor() as c:
            c.execute("SET time_zone = '+00:00'")
        conn.commit()
        off = ("INSERT INTO kinbox_offsets (consumer, topic, kafka_partition, "
               "next_offset) VALUES ('bench', 'bench.points', %s, %s) "
               "ON DUPLICATE KEY UPDATE next_offset = GREATEST(next_offset, "
               "VALUES(next_offset))")
    f = open(out, "w", buffering=1 << 16)
    part = 0
    while not stop:
        t0 = time.time()
        ms = int(t0 * 1000)
        ids, parts, offs, mss = [], [], [], []
        for _ in range(batch):
            seq += 1
            ids.append("id-%012x-%s%04d" % (ms, tag, seq % 10000))
            parts.append(part)
            offs.append(seq)
            mss.append(ms)
        part = (part + 1) % 64
        with conn.cursor() as c:
            if backend == "postgresql":
                c.execute(ins, (ids, parts, offs, mss))
                n = len(c.fetchall())
            else:
                day = time.strftime("%Y-%m-%d 00:00:00", time.gmtime(t0))
                at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)) + \
                    ".%03d" % (ms % 1000)
                vals = ",".join(["('bench', %s, 'bench.points', %s, %s, %s, "
                                 "%s, 0)"] * batch)
                args = []
                for i in range(batch):
                    args += [ids[i], parts[i], offs[i], at, day]
                c.execute("INSERT IGNORE INTO kinbox_inbox (consumer, "
                          "message_id, topic, kafka_partition, kafka_offset, "
                          "msg_at, part_at, shadow) VALUES " + vals +
                          " RETURNING message_id", args)
                n = len(c.fetchall())
            c.execute(off, (parts[0], offs[-1] + 1))
        conn.commit()
        t1 = time.time()
        f.write("%.6f %.6f %d\n" % (t0, t1 - t0, n))
    f.close()
    conn.close()


if __name__ == "__main__":
    main()
