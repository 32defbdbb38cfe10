#!/usr/bin/env python3
"""console_poll.py URLFILE -- headless Chromium for bench/run --console-only,
started once before the series (its start-up is not measured): whenever
URLFILE holds a URL, the browser opens it (retrying until `kinbox run`
answers) and leaves the page refreshing itself every 2 s; when URLFILE is
empty it shows about:blank. Ends on SIGTERM. Reports on stderr how long
each page was open and loaded. Uses the WebDriver client of
tests/console_test.py."""
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import console_test  # noqa: E402

stop = False


def on_term(*_):
    global stop
    stop = True


def want(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


signal.signal(signal.SIGTERM, on_term)
d = console_test.Driver()
d.go("about:blank")
print("   (browser ready)", file=sys.stderr, flush=True)
cur, since = "", None
try:
    while not stop:
        w = want(sys.argv[1])
        if w != cur:
            if cur and since:
                print("   (browser on the console for %.1f s)" %
                      (time.time() - since), file=sys.stderr, flush=True)
            cur, since = w, None
            if not w:
                d.go("about:blank")
        if cur and not since:
            try:
                d.go(cur)
                if d.js("return document.body.dataset.loaded === '1';"):
                    since = time.time()
            except Exception:
                pass
        time.sleep(0.2)
finally:
    d.quit()
