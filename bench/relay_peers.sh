# bench/relay_peers.sh -- sourced by bench/run --peers: the relay side.
#
# kinbox's relays (bench/relay_bench: the polling relay, 1 and 2 relays
# "kinbox-1" / "kinbox-2"; the log relay "wal" on PostgreSQL and "binlog"
# on MariaDB; "emit": the log relay reading the table-less outbox,
# kinbox_outbox_emit_pg()'s logical messages, PostgreSQL) and Debezium's
# outbox event router (bench/peers/debezium-outbox: the embedded engine,
# pgoutput on PostgreSQL, the MySQL connector on MariaDB's binlog) take
# turns on the same database server and the same Apache Kafka broker, on
# the same rows: the same writer fills kinbox_outbox, Debezium's documented
# outbox table (outboxevent: id, aggregatetype, aggregateid, type, payload)
# or (emit) the log with kinbox's envelope, with the same count, payloads
# and aggregates, in transactions of 1,000 rows. Systems that do not exist
# on a backend (wal / emit on MariaDB, binlog on PostgreSQL) are skipped.
# The log relays' slot (PostgreSQL) or stored binlog position (MariaDB) is
# made before the fill, so the backlog waits in the log.
#  * backlog: NRP rows committed while the relay is down, then the relay
#    starts; kbtool hw watches the topic's high watermarks (the broker's
#    view, the same for every system): rows/s from the first published row
#    to the last, and from the relay's start. Debezium is started once
#    before the fill (it records its slot / binlog position; no snapshot)
#    and stopped; the slot's retained WAL is read after the fill while it
#    is stopped (RSTOP seconds).
#  * latency: a steady NRL rows at RLRATE rows/s, one autocommitted INSERT
#    each, commit-to-receive per row (kbtool latency: writer and consumer
#    in one process, one clock); Debezium with its default poll.interval.ms
#    (500) and with 10 ms ("debezium@10").
#  * latency10k (kind latency10k): the same at R10K rows/s (default
#    10,000), NL10K rows (default 100,000: 10 s), kinbox 1 relay and
#    debezium@10 (RPLAT10K). Autocommitted one-row INSERTs top out near
#    2,500/s on this 2-core machine beside the relay and the broker (1, 4
#    or 8 connections alike, fsync on), so the writer is W10K connections
#    (default 2; every aggregate on one of them, so its rows commit in
#    order), each committing TX10K rows in one multi-row INSERT (default
#    10: 1,000 commits/s in all); each row's latency counts from the
#    return of the commit that carried it. The achieved rate is recorded.
#  * hot (kind hot): a backlog of NRH rows (default 200,000) all on ONE
#    aggregate id (so one Kafka partition, order per aggregate required),
#    for RPHOT (default kinbox-1 kinbox-2 debezium); no slot wait.
# Debezium on MariaDB: debezium-connector-mysql 3.6.1 takes MariaDB 10.11
# for a MySQL >= 8.4 and fails on SHOW BINARY LOG STATUS; its MariaDB
# connector (debezium-connector-mariadb) is not served here. The runs are
# still tried, and recorded as not started with the engine's reason (the
# audit column: "FAILED:not-ready: REASON").
# Every run is audited on the topic (kbtool order: every row there, at
# least once, duplicates counted, per-aggregate order kept).
# Relay CPU and peak RSS are sampled every 0.1 s from /proc; WAL bytes
# (PostgreSQL) or binlog and InnoDB redo bytes (MariaDB) are read around
# the fill and around the drain. Writes $W/relay_peers.tsv (and each
# latency run's per-row figures, $W/N/latency.rows: kbtool latency --dump).

NRP=${KINBOX_BENCH_RELAY_PEERS_N:-200000}
NRL=${KINBOX_BENCH_RELAY_PEERS_LAT_N:-20000}
RLRATE=${KINBOX_BENCH_RELAY_PEERS_RATE:-1000}
RSTOP=${KINBOX_BENCH_RELAY_PEERS_STOP_S:-30}
DBZ_POLL=${KINBOX_BENCH_DBZ_POLL_MS:-500}
RPSYS=${KINBOX_BENCH_RELAY_PEERS:-kinbox-1 wal emit binlog debezium}
RPLAT=${KINBOX_BENCH_RELAY_PEERS_LAT:-kinbox-1 wal binlog debezium@10}
NL10K=${KINBOX_BENCH_RELAY_PEERS_10K_N:-100000}
R10K=${KINBOX_BENCH_RELAY_PEERS_10K_RATE:-10000}
W10K=${KINBOX_BENCH_RELAY_PEERS_10K_WRITERS:-2}
TX10K=${KINBOX_BENCH_RELAY_PEERS_10K_TX:-10}
RPLAT10K=${KINBOX_BENCH_RELAY_PEERS_10K-wal emit binlog debezium@10}
NRH=${KINBOX_BENCH_RELAY_PEERS_HOT_N:-200000}
RPHOT=${KINBOX_BENCH_RELAY_PEERS_HOT-wal binlog debezium}
if [ $quick = 1 ]; then NRP=10000 NRL=2000 RSTOP=5 NL10K=5000 NRH=5000; fi

build_debezium_peer() {
    local d=$BB/peers/debezium-outbox
    rm -rf "$d"; mkdir -p "$d"
    cp -r "$root/bench/peers/debezium-outbox/pom.xml" "$root/bench/peers/debezium-outbox/src" "$d/"
    local goals=(package dependency:copy-dependencies -DincludeScope=runtime)
    if ! mvn -q -B -o -f "$d/pom.xml" "${goals[@]}" > "$d/build.log" 2>&1; then
        echo "   (debezium peer: not all jars cached, fetching from Maven Central)"
        mvn -q -B -f "$d/pom.xml" "${goals[@]}" > "$d/build.log" 2>&1 ||
            { tail -n 20 "$d/build.log" >&2; echo "bench/run: could not build the Debezium peer ($d/build.log)" >&2; exit 1; }
    fi
    DBZ_CP="$d/target/debezium-outbox-1.jar:$d/target/dependency/*"
}

rp_table() {  # rp_table SYSTEM: the outbox table the system reads
    if [ "$1" = debezium ]; then echo outboxevent; else echo kinbox_outbox; fi
}
rp_has() {  # rp_has BACKEND SYSTEM: whether the system exists on the backend
    case "$1/$2" in mysql/wal | mysql/emit | postgresql/binlog) return 1 ;; esac
    return 0
}
rp_logsrc() {  # rp_logsrc BACKEND SYSTEM: the log relay's slot / position, before any row
    case "$2" in
        wal | emit) sql postgresql "$rdb" "SELECT 1 FROM pg_create_logical_replication_slot('kbwal_$idx', 'pgoutput')" >/dev/null ;;
        binlog) sql mysql "$rdb" "INSERT INTO kinbox_relay_position (relay, gtid) VALUES ('kbwal_$idx', @@gtid_binlog_pos)" ;;
    esac
}
rp_relay() {  # rp_relay SYSTEM N: bench/relay_bench for the system, in the background (sets rpid)
    local src=poll k=1
    case "$1" in wal | emit) src=wal ;; binlog) src=binlog ;; kinbox-*) k=${1#kinbox-} ;; esac
    RB_SOURCE=$src RB_SLOT=kbwal_$idx "$RELAYB" throughput --url "$rurl" -b "$KINBOX_KAFKA_BOOTSTRAP" --relays "$k" -n "$2" \
        > "$rdir/relay.out" 2> "$rdir/relay.log" &
    rpid=$!
}
# kinbox_outbox_emit_pg()'s envelope built in SQL (docs/outbox.md): version
# 1, then destination, aggregate_id, idem_key, headers (NULL), payload, each
# a 4-byte big-endian length and its bytes.
RP_ENV="'\\x01'::bytea || int4send(octet_length(d)) || convert_to(d, 'UTF8') || int4send(octet_length(a)) || convert_to(a, 'UTF8')
    || int4send(octet_length(k)) || convert_to(k, 'UTF8') || '\\xffffffff'::bytea || int4send(octet_length(p)) || convert_to(p, 'UTF8')"
rp_db() {  # rp_db BACKEND SYSTEM -> rdb rurl rtopic rdir
    idx=$((idx + 1))
    rdb=kb_$idx rtopic=relay.$idx rdir=$W/$idx
    mkdir -p "$rdir"
    settle "$1"
    db_create "$1" "$rdb"
    rurl=$(db_url "$1" "$rdb")
    printf '[database]\nurl = %s\n[kafka]\nbootstrap.servers = %s\n[consumer.x]\ngroup.id = x\ntopics = x\nhandler = points\n' \
        "$rurl" "$KINBOX_KAFKA_BOOTSTRAP" > "$rdir/kinbox.ini"
    "$KINBOX" migrate -c "$rdir/kinbox.ini" > "$rdir/migrate.log" 2>&1
    if [ "$2" = debezium ]; then
        # Debezium's documented outbox table (MariaDB: JSON is LONGTEXT
        # there; the id a CHAR(36) UUID the writer sets)
        if [ "$1" = mysql ]; then
            sql mysql "$rdb" "CREATE TABLE outboxevent (id CHAR(36) NOT NULL PRIMARY KEY,
                aggregatetype VARCHAR(255) NOT NULL, aggregateid VARCHAR(255) NOT NULL,
                type VARCHAR(255) NOT NULL, payload LONGTEXT)"
        else
            sql postgresql "$rdb" "CREATE TABLE outboxevent (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                aggregatetype varchar(255) NOT NULL, aggregateid varchar(255) NOT NULL,
                type varchar(255) NOT NULL, payload jsonb)"
        fi
    fi
    "$src/scripts/services" kafka-topic "$rtopic" "$PARTS"
}
rp_fill() {  # rp_fill BACKEND SYSTEM N [AGGREGATES]: N rows (aggregates: default 10,000), 1,000 a transaction
    local be=$1 sys=$2 n=$3 ag=${4:-10000} c lo hi
    for ((c = 0; c * 1000 < n; c++)); do
        lo=$((c * 1000 + 1)) hi=$(( (c + 1) * 1000 < n ? (c + 1) * 1000 : n ))
        if [ "$be" = mysql ]; then
            if [ "$sys" = debezium ]; then
                echo "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload)
                    SELECT UUID(), '$rtopic', CONCAT('agg-', seq % $ag), 'grant',
                    CONCAT('{\"order_id\":\"o-', seq, '\",\"user_id\":', seq % 100 + 1, ',\"grant_points\":', seq % 13 + 1, '}')
                    FROM seq_${lo}_to_${hi};"
            else
                echo "INSERT INTO kinbox_outbox (destination, idem_key, aggregate_id, payload)
                    SELECT '$rtopic', CONCAT('k-', seq), CONCAT('agg-', seq % $ag),
                    CONCAT('{\"order_id\":\"o-', seq, '\",\"user_id\":', seq % 100 + 1, ',\"grant_points\":', seq % 13 + 1, '}')
                    FROM seq_${lo}_to_${hi};"
            fi
        else
            if [ "$sys" = debezium ]; then
                echo "INSERT INTO outboxevent (aggregatetype, aggregateid, type, payload)
                    SELECT '$rtopic', 'agg-' || (i % $ag), 'grant',
                    ('{\"order_id\":\"o-' || i || '\",\"user_id\":' || (i % 100 + 1) || ',\"grant_points\":' || (i % 13 + 1) || '}')::jsonb
                    FROM generate_series($lo, $hi) AS i;"
            elif [ "$sys" = emit ]; then
                echo "SELECT count(pg_logical_emit_message(true, 'kinbox.outbox.v1', $RP_ENV))
                    FROM (SELECT '$rtopic'::text AS d, 'agg-' || (i % $ag) AS a, 'k-' || i AS k,
                    '{\"order_id\":\"o-' || i || '\",\"user_id\":' || (i % 100 + 1) || ',\"grant_points\":' || (i % 13 + 1) || '}' AS p
                    FROM generate_series($lo, $hi) AS i) AS e;"
            else
                echo "INSERT INTO kinbox_outbox (destination, idem_key, aggregate_id, payload)
                    SELECT '$rtopic', 'k-' || i, 'agg-' || (i % $ag),
                    convert_to('{\"order_id\":\"o-' || i || '\",\"user_id\":' || (i % 100 + 1) || ',\"grant_points\":' || (i % 13 + 1) || '}', 'UTF8')
                    FROM generate_series($lo, $hi) AS i;"
            fi
        fi
    done > "$rdir/fill.sql"
    if [ "$be" = mysql ]; then
        mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$KINBOX_MYSQL_PORT" -ukinbox -pkinbox "$rdb" < "$rdir/fill.sql"
    else
        psql "$rurl" -X -q -v ON_ERROR_STOP=1 -f "$rdir/fill.sql" >/dev/null
    fi
    if [ "$be" = mysql ]; then sql mysql "$rdb" "ANALYZE TABLE $(rp_table "$sys")" >/dev/null
    else sql postgresql "$rdb" "ANALYZE $(rp_table "$sys")"; fi
}
rp_logpos() {  # rp_logpos BACKEND: "log_bytes redo_bytes" (PostgreSQL: WAL, WAL)
    if [ "$1" = mysql ]; then
        local bl redo
        bl=$(sql mysql kinbox "SHOW BINARY LOGS" | awk '{s += $2} END {print s + 0}')
        redo=$(sql mysql kinbox "SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'" | awk '{print $2 + 0}')
        echo "$bl $redo"
    else
        local w; w=$(sql postgresql kinbox "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
        echo "$w $w"
    fi
}
rp_tablesize() {  # rp_tablesize BACKEND SYSTEM: bytes of the table and its indexes
    local t; t=$(rp_table "$2")
    if [ "$1" = mysql ]; then
        sql mysql "$rdb" "ANALYZE TABLE $t" >/dev/null
        sql mysql kinbox "SELECT data_length + index_length FROM information_schema.tables WHERE table_schema = '$rdb' AND table_name = '$t'"
    else
        sql postgresql "$rdb" "SELECT pg_total_relation_size('$t')"
    fi
}
rp_sample() {  # rp_sample PID FILE: "time ticks VmHWM" every 0.1 s (background; sets rspid)
    ( while kill -0 "$1" 2>/dev/null; do
        echo "$(date +%s.%N) $(proc_ticks "$1") $(awk '/VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null)"
        sleep 0.1; done ) > "$2" 2>/dev/null &
    rspid=$!
}
dbz_start() {  # dbz_start BACKEND: the Debezium peer on rdb (sets dpid)
    local conn=postgres port=$KINBOX_PG_PORT
    [ "$1" = mysql ] && conn=mysql port=$KINBOX_MYSQL_PORT
    dpid=""
    case " ${dbz_broken:-} " in *" $1 "*) return 0 ;; esac  # dbz_ready says so
    mkdir -p "$rdir/dbz"
    # shellcheck disable=SC2086
    java $PEER_JVM -Dbench.connector=$conn -Dbench.port="$port" -Dbench.user=kinbox -Dbench.password=kinbox \
        -Dbench.db="$rdb" -Dbench.bootstrap="$KINBOX_KAFKA_BOOTSTRAP" -Dbench.dir="$rdir/dbz" \
        -Dbench.slot="kbdbz_$idx" -Dbench.server_id=$((5400 + idx)) -Dbench.poll_ms="$DBZ_POLL" \
        -cp "$DBZ_CP" io.kinbox.bench.DebeziumOutbox >> "$rdir/debezium.log" 2>&1 &
    dpid=$!
}
dbz_ready() {  # dbz_ready BACKEND: a warm-up row (own topic) until it is published
    local wt=warm.$idx i id=gen_random_uuid\(\)
    [ "$1" = mysql ] && id=UUID\(\)
    # the peer that never started on this backend is not tried again
    case " ${dbz_broken:-} " in *" $1 "*)
        echo "bench/run: the Debezium peer did not start on $1 before; not tried again" >&2; return 1 ;; esac
    "$src/scripts/services" kafka-topic "$wt" 1
    for i in $(seq 1 120); do
        sql "$1" "$rdb" "INSERT INTO outboxevent (id, aggregatetype, aggregateid, type, payload) VALUES ($id, '$wt', 'w', 'warm', '{\"order_id\":\"w-$i\"}')" >/dev/null
        [ "$("$KBTOOL" offsets -b "$KINBOX_KAFKA_BOOTSTRAP" -t "$wt" -g warm | awk '{print $2}')" -ge 1 ] && return 0
        kill -0 "$dpid" 2>/dev/null || break
        sleep 1
    done
    dbz_broken="${dbz_broken:-} $1"
    echo "bench/run: the Debezium peer never published ($rdir/debezium.log)" >&2
    # the engine's reason, one line (kept for the later runs' rows too)
    dbz_why=$(grep -m1 -o "DebeziumException: .*" "$rdir/debezium.log" || tail -n 1 "$rdir/debezium.log")
    dbz_why=$(printf '%s' "$dbz_why" | tr '\t\r\n' '   ' | cut -c1-300)
    echo "$dbz_why" >&2
    return 1
}
dbz_stop() {
    [ -n "${dpid:-}" ] || return 0
    kill -TERM "$dpid" 2>/dev/null || true
    wait "$dpid" 2>/dev/null || true
    dpid=""
}
slot_retained() {  # bytes of WAL the Debezium slot holds back now
    sql postgresql "$rdb" "SELECT COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, 0) FROM pg_replication_slots WHERE slot_name = 'kbdbz_$idx'"
}
rp_drop() {  # rp_drop BACKEND: the database (and the slots first)
    if [ "$1" = postgresql ]; then
        sql postgresql kinbox "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN ('kbdbz_$idx', 'kbwal_$idx')" >/dev/null 2>&1 || true
    fi
    db_drop "$1" "$rdb"
}
rp_audit() {  # rp_audit N [KEYS] -> sets raud rmsgs rkeys rdups rviol rdist
    local out
    out=$("$KBTOOL" order -b "$KINBOX_KAFKA_BOOTSTRAP" -t "$rtopic" -n "$1" 2> "$rdir/order.log") || true
    read -r rmsgs rkeys rviol rdups rdist <<< "${out:-0 0 0 0 0}"
    local why=""
    [ "${rdist:-0}" = "$1" ] || why="$why rows-on-topic=${rdist:-0}/$1;"
    [ -z "${2:-}" ] || [ "${rkeys:-0}" = "$2" ] || why="$why keys=${rkeys:-0}/$2;"
    [ "${rviol:-1}" = 0 ] || why="$why order-violations=$rviol;"
    raud=ok; [ -n "$why" ] && raud="FAILED:${why% ;}"
    return 0
}
rp_row() {  # rp_row FIELDS...: one line of relay_peers.tsv
    local IFS=$'\t'; echo "$*" >> "$RPRES"
}
rp_notready() {  # rp_notready BACKEND SYSTEM KIND N: the row of a peer that never started (its reason: dbz_why)
    rp_row "$@" - - - - - - - - - - - - - - - - - - - - "FAILED:not-ready: ${dbz_why:-unknown}" - - - -
}

# backlog: rp_backlog BACKEND SYSTEM [KIND N AGGREGATES] (kind hot: every
# row on one aggregate, no slot wait)
rp_backlog() {
    local be=$1 sys=$2 kind=${3:-backlog} NRP=${4:-$NRP} ag=${5:-10000} slot=-
    rp_has "$be" "$sys" || return 0
    rp_db "$be" "$sys"
    rp_logsrc "$be" "$sys"
    if [ "$sys" = debezium ]; then
        dbz_start "$be"
        dbz_ready "$be" || { dbz_stop; rp_drop "$be"; rp_notready "$be" "$sys" "$kind" "$NRP"; return 0; }
        dbz_stop
    fi
    read -r l0 r0 < <(rp_logpos "$be")
    rp_fill "$be" "$sys" "$NRP" "$ag"
    read -r l1 r1 < <(rp_logpos "$be")
    if [ "$sys" = debezium ] && [ "$be" = postgresql ] && [ "$kind" = backlog ]; then
        sleep "$RSTOP"
        slot=$(slot_retained)
    fi
    local dbt0; dbt0=$(db_ticks "$be")
    local t0; t0=$(date +%s.%N)
    local pid
    if [ "$sys" = debezium ]; then
        dbz_start "$be"; pid=$dpid
    else
        rp_relay "$sys" "$NRP"; pid=$rpid
    fi
    rp_sample "$pid" "$rdir/samples.txt"
    local hw; hw=$("$KBTOOL" hw -b "$KINBOX_KAFKA_BOOTSTRAP" -t "$rtopic" -n "$NRP" --timeout 300 --interval-ms 50) || true
    sleep 0.2
    if [ "$sys" = debezium ]; then dbz_stop; else wait "$pid" || true; fi
    wait "$rspid" 2>/dev/null || true
    local dbt1; dbt1=$(db_ticks "$be")
    sleep 1
    read -r l2 r2 < <(rp_logpos "$be")
    local slot_after=-
    [ "$sys" = debezium ] && [ "$be" = postgresql ] && slot_after=$(slot_retained)
    local tbytes; tbytes=$(rp_tablesize "$be" "$sys")
    if [ "$kind" = hot ]; then rp_audit "$NRP" 1; else rp_audit "$NRP"; fi
    read -r tf nf tl nl <<< "${hw:-0 0 0 0}"
    local rate from_start cpu cpus rss
    rate=$(awk -v tf="$tf" -v nf="$nf" -v tl="$tl" -v nl="$nl" 'BEGIN { printf "%.0f", (tl > tf && nl > nf) ? (nl - nf) / (tl - tf) : 0 }')
    from_start=$(awk -v t0="$t0" -v tl="$tl" 'BEGIN { printf "%.2f", (tl > t0 ? tl - t0 : 0) }')
    read -r cpu cpus rss < <(awk -v tf="$tf" -v tl="$tl" -v c="$CLK" '
        $2 > last { last = $2 } $3 > rss { rss = $3 } $1 <= tf && $2 > a { a = $2 } $1 <= tl && $2 > b { b = $2 }
        END { printf "%.2f %.2f %d\n", last / c, (b - a) / c, rss }' "$rdir/samples.txt")
    local dbcpu; dbcpu=$(awk -v a="$dbt0" -v b="$dbt1" -v c="$CLK" 'BEGIN { printf "%.2f", (b - a) / c }')
    rp_row "$be" "$sys" "$kind" "$NRP" "$from_start" "$rate" "$cpu" "$cpus" "$rss" "$dbcpu" \
        $((l1 - l0)) $((l2 - l1)) $((r1 - r0)) $((r2 - r1)) "$slot" "$slot_after" "$tbytes" \
        - - - - "$rmsgs" "$rdups" "$rviol" "$raud" - - - -
    printf '   %-10s %-9s %s %s: %7s rows/s (all published %ss after start), cpu %ss (steady %ss), rss %s KiB, log %s+%s B, slot %s B, keys %s, dups %s, %s\n' \
        "$be" "$sys" "$kind" "$NRP" "$rate" "$from_start" "$cpu" "$cpus" "$rss" $((l1 - l0)) $((l2 - l1)) "$slot" "$rkeys" "$rdups" "$raud"
    rp_drop "$be"
}

# latency: rp_latency BACKEND SYSTEM [KIND N RATE WRITERS TX] (kinbox-1:
# one relay; debezium@MS: the engine's poll.interval.ms = MS instead of its
# default; WRITERS connections, TX rows a multi-row INSERT: kbtool latency)
rp_latency() {
    local be=$1 sys=$2 kind=${3:-latency} NRL=${4:-$NRL} RLRATE=${5:-$RLRATE} wr=${6:-1} tx=${7:-1}
    local pid base=${2%@*} poll=$DBZ_POLL
    [ "$base" != "$sys" ] && poll=${sys#*@}
    rp_has "$be" "$base" || return 0
    rp_db "$be" "$base"
    local opt=--pg; [ "$be" = mysql ] && opt=--mysql
    local table=kinbox; [ "$base" = emit ] && table=emit
    if [ "$base" = debezium ]; then
        table=debezium
        DBZ_POLL=$poll dbz_start "$be"
        dbz_ready "$be" || { dbz_stop; rp_drop "$be"; rp_notready "$be" "$sys" "$kind" "$NRL"; return 0; }
        pid=$dpid
    else
        rp_logsrc "$be" "$base"
        rp_relay "$base" "$NRL"; pid=$rpid
    fi
    rp_sample "$pid" "$rdir/samples.txt"
    local out
    out=$("$KBTOOL" latency "$opt" "$rurl" --table "$table" -b "$KINBOX_KAFKA_BOOTSTRAP" -t "$rtopic" \
        -n "$NRL" --rate "$RLRATE" -w "$wr" --tx "$tx" --append-time 1 --dump "$rdir/latency.rows" 2> "$rdir/latency.log") || true
    sleep 0.2
    if [ "$base" = debezium ]; then dbz_stop; else
        kill -0 "$pid" 2>/dev/null && sleep 2
        kill -TERM "$pid" 2>/dev/null || true; wait "$pid" || true; fi
    wait "$rspid" 2>/dev/null || true
    read -r p50 p99 p999 pmax _ _ arate <<< "${out:-- - - - 0 0 0}"
    local cpu rss
    read -r cpu rss < <(awk -v c="$CLK" '$2 > last { last = $2 } $3 > rss { rss = $3 } END { printf "%.2f %d\n", last / c, rss }' "$rdir/samples.txt")
    rp_audit "$NRL"
    # the same percentiles over the rows due in the run's second half (the
    # relay's start-up and any early backlog behind it)
    local h50 h99 h999
    local a99  # the commit to the broker's append (LogAppendTime): the relay's part
    a99=$(awk '$4 >= 0 { print $4 }' "$rdir/latency.rows" 2>/dev/null | sort -g |
        awk '{ d[k++] = $1 } END { j = int(0.99 * k); if (j > k - 1) j = k - 1; if (k) printf "%.2f", d[j]; else print "-" }')
    read -r h50 h99 h999 < <(awk -v h="$(awk -v n="$NRL" -v r="$RLRATE" 'BEGIN { print n / r / 2 }')" \
        '$2 >= h && $3 >= 0 { print $3 }' "$rdir/latency.rows" 2>/dev/null | sort -g |
        awk '{ d[k++] = $1 } END { if (!k) { print "- - -"; exit }
            split("0.5 0.99 0.999", q, " "); for (i = 1; i <= 3; i++) { j = int(q[i] * k); if (j > k - 1) j = k - 1; printf "%.2f ", d[j] } print "" }')
    rp_row "$be" "$sys" "$kind" "$NRL" - "$arate" "$cpu" - "$rss" - - - - - - - - \
        "$p50" "$p99" "$p999" "$pmax" "$rmsgs" "$rdups" "$rviol" "$raud" "${h50:--}" "${h99:--}" "${h999:--}" "${a99:--}"
    printf '   %-10s %-9s %s %s rows at %s/s, %s writer(s), %s row(s) a commit (achieved %s/s): p50 %s ms, p99 %s ms, p99.9 %s ms, max %s ms (2nd half: %s / %s / %s ms; to the broker'"'"'s append p99 %s ms), rss %s KiB, dups %s, %s\n' \
        "$be" "$sys" "$kind" "$NRL" "$RLRATE" "$wr" "$tx" "$arate" "$p50" "$p99" "$p999" "$pmax" "${h50:--}" "${h99:--}" "${h999:--}" "${a99:--}" "$rss" "$rdups" "$raud"
    rp_drop "$be"
}

relay_peers() {
    RPRES=$W/relay_peers.tsv
    printf 'backend\tsystem\tkind\tn\tall_published_s\trows_s\tcpu_s\tcpu_steady_s\trss_kib\tdb_cpu_s\tlog_fill_b\tlog_drain_b\tredo_fill_b\tredo_drain_b\tslot_retained_stopped_b\tslot_retained_after_b\ttable_b\tp50_ms\tp99_ms\tp999_ms\tmax_ms\tmessages\tduplicates\torder_violations\taudit\tp50_2nd_half_ms\tp99_2nd_half_ms\tp999_2nd_half_ms\tappend_p99_ms\n' > "$RPRES"
    local be s
    for be in ${KINBOX_BENCH_BACKENDS:-postgresql mysql}; do
        echo "== relay side on Apache Kafka: $be (backlog $NRP rows; latency $NRL rows at $RLRATE/s)"
        for s in $RPSYS; do rp_backlog "$be" "$s"; done
        for s in $RPLAT; do rp_latency "$be" "$s"; done
        [ -z "$RPLAT10K" ] || echo "== $be: latency at $R10K/s ($NL10K rows, $W10K writer connections, $TX10K row(s) a commit)"
        for s in $RPLAT10K; do rp_latency "$be" "$s" latency10k "$NL10K" "$R10K" "$W10K" "$TX10K"; done
        [ -z "$RPHOT" ] || echo "== $be: one hot aggregate ($NRH rows backlog, every row on one aggregate id)"
        for s in $RPHOT; do rp_backlog "$be" "$s" hot "$NRH" 1; done
    done
    local out=${KINBOX_BENCH_RELAY_OUT:-/tmp/kinbox-bench-relay-peers.tsv}
    cp "$RPRES" "$out"
    echo "results: $out; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
}
