#!/usr/bin/env python3
"""bench/partition_consumer.py -- the kinbox consumer's side of
bench/partition's phase C, from its metrics endpoint. Standard library only.

  partition_consumer.py sample URL OUT
      Scrapes URL (kinbox run's /metrics) every 0.25 s until killed and
      appends one JSON line per scrape to OUT: the time, the sum of
      kinbox_consumer_messages_total (every result) and the cumulative
      buckets of kinbox_consumer_transaction_seconds.

  partition_consumer.py report OUT TOTAL BF BT DF DT AF AT
      Prints "key value" lines for the windows before [BF, BT), during
      [DF, DT) and after [AF, AT) the prune: messages/s, and the p50 / p99
      of the consumer's transactions (BEGIN to COMMIT) by linear
      interpolation inside the histogram's buckets, as Prometheus'
      histogram_quantile() does; "without" is before and after together.
      ran_dry is 1 when the consumer had consumed all TOTAL messages before
      AT (the windows are then not saturated and the ratio means nothing).
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


def report(out, total, bf, bt, df, dt, af, at_):
    s = load(out)
    if not s:
        print("samples 0")
        return
    print("samples %d" % len(s))
    res = {}
    for name, spans in (("before", [(bf, bt)]), ("during", [(df, dt)]),
                        ("after", [(af, at_)]),
                        ("without", [(bf, bt), (af, at_)])):
        m, secs, h = window(s, spans)
        rate = m / secs if secs > 0 else float("nan")
        res[name] = rate
        print("%s_window_s %.1f" % (name, secs))
        print("%s_msg_per_s %.0f" % (name, rate))
        print("%s_tx_p50_ms %.2f" % (name, quantile(0.50, h) * 1000))
        print("%s_tx_p99_ms %.2f" % (name, quantile(0.99, h) * 1000))
    ratio = res["during"] / res["without"] if res["without"] > 0 else float("nan")
    print("ratio_msg_per_s %.3f" % ratio)
    print("ran_dry %d" % (1 if at(s, at_)[1] >= total else 0))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "sample":
        sample(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 10 and sys.argv[1] == "report":
        report(sys.argv[2], float(sys.argv[3]), *map(float, sys.argv[4:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
