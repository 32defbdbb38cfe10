#!/usr/bin/env python3
"""bench/partition_consumer.py -- the kinbox consumer's side of
bench/partition's phase C, from its metrics endpoint. Standard library only.

  partition_consumer.py sample URL OUT
      Scrapes URL (kinbox run's /metrics) every 0.25 s until killed and
      appends one JSON line per scrape to OUT: the time, the sum of
      kinbox_consumer_messages_total (every result) and the cumulative
      buckets of kinbox_consumer_transaction_seconds.

  partition_consumer.py report OUT TOTAL T0 T1 [T0 T1 ...]
      Prints "key value" lines for the windows [T0, T1) given, which
      alternate: without pruning, during a prune, without, during, ...,
      without. Per round k (a prune's window against the windows either
      side of it) and over all rounds: messages/s and the p50 / p99 of the
      consumer's transactions (BEGIN to COMMIT) by linear interpolation
      inside the histogram's buckets, as Prometheus' histogram_quantile()
      does. ran_dry is 1 when the consumer had consumed all TOTAL messages
      before the last window ended (the windows are then not saturated and
      the ratios mean nothing).
"""
import json
import math
import sys
import time
import urllib.request

MSGS = "kinbox_consumer_messages_total"
HIST = "kinbox_consumer_transaction_seconds_bucket"


def scrape(url):
    text = urllib.request.urlopen(url, timeout=2).read().decode()
    msgs, buckets = 0.0, {}
    for line in text.splitlines():
        if line.startswith(MSGS + "{") or line.startswith(MSGS + " "):
            msgs += float(line.rsplit(None, 1)[1])
        elif line.startswith(HIST + "{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            key = math.inf if le == "+Inf" else float(le)
            buckets[key] = buckets.get(key, 0.0) + float(line.rsplit(None, 1)[1])
    return msgs, buckets


def sample(url, out):
    with open(out, "a") as f:
        while True:
            t = time.time()
            try:
                m, b = scrape(url)
                f.write(json.dumps({"t": t, "m": m,
                                    "b": [[("inf" if k == math.inf else k), v]
                                          for k, v in sorted(b.items())]}) + "\n")
                f.flush()
            except OSError:
                pass  # not listening yet, or stopping
            time.sleep(0.25)


def load(out):
    s = []
    for line in open(out):
        j = json.loads(line)
        b = {(math.inf if k == "inf" else k): v for k, v in j["b"]}
        s.append((j["t"], j["m"], b))
    return s


def at(s, t):
    """The last sample at or before t (the first if none)."""
    best = s[0]
    for x in s:
        if x[0] <= t:
            best = x
    return best


def quantile(q, buckets):
    les = sorted(buckets)
    total = buckets[les[-1]] if les else 0
    if total <= 0:
        return float("nan")
    rank, prev_le, prev_c = q * total, 0.0, 0.0
    for le in les:
        c = buckets[le]
        if c >= rank:
            if le == math.inf:
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


def window(s, spans):
    msgs, secs, hist = 0.0, 0.0, {}
    for a, b in spans:
        x, y = at(s, a), at(s, b)
        msgs += y[1] - x[1]
        secs += y[0] - x[0]
        for le, c in y[2].items():
            hist[le] = hist.get(le, 0.0) + c - x[2].get(le, 0.0)
    return msgs, secs, hist


def stats(s, spans):
    m, secs, h = window(s, spans)
    return (m / secs if secs > 0 else float("nan"), secs,
            quantile(0.50, h) * 1000, quantile(0.99, h) * 1000)


def ratio(a, b):
    return a / b if b > 0 else float("nan")


def report(out, total, times):
    s = load(out)
    print("samples %d" % len(s))
    if not s:
        return
    spans = list(zip(times[0::2], times[1::2]))
    without, during = spans[0::2], spans[1::2]
    for k, d in enumerate(during, 1):
        w = [without[k - 1], without[k]]
        dr, ds, _, dq = stats(s, [d])
        wr, _, _, wq = stats(s, w)
        print("r%d_window_s %.1f" % (k, ds))
        print("r%d_without_msg_per_s %.0f" % (k, wr))
        print("r%d_during_msg_per_s %.0f" % (k, dr))
        print("r%d_ratio_msg_per_s %.3f" % (k, ratio(dr, wr)))
        print("r%d_without_tx_p99_ms %.2f" % (k, wq))
        print("r%d_during_tx_p99_ms %.2f" % (k, dq))
    res = {}
    for name, sp in (("without", without), ("during", during)):
        r, secs, p50, p99 = stats(s, sp)
        res[name] = r
        print("%s_window_s %.1f" % (name, secs))
        print("%s_msg_per_s %.0f" % (name, r))
        print("%s_tx_p50_ms %.2f" % (name, p50))
        print("%s_tx_p99_ms %.2f" % (name, p99))
    print("ratio_msg_per_s %.3f" % ratio(res["during"], res["without"]))
    print("ran_dry %d" % (1 if at(s, spans[-1][1])[1] >= total else 0))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3])
    elif (len(sys.argv) >= 10 and sys.argv[1] == "report" and
          len(sys.argv[4:]) % 4 == 2):
        report(sys.argv[2], float(sys.argv[3]),
               [float(x) for x in sys.argv[4:]])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
