#!/usr/bin/env python3
"""console_poll.py URL -- keep headless Chromium open on the console at URL
(bench/run --console-only): retries until the page loads (kinbox run may
not be up yet), then leaves it refreshing itself (every 2 s) until
SIGTERM. Uses the WebDriver client of tests/console_test.py."""
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


signal.signal(signal.SIGTERM, on_term)
d = console_test.Driver()
try:
    loaded = False
    while not stop:
        if not loaded:
            try:
                d.go(sys.argv[1])
                loaded = d.js("return document.body.dataset.loaded === '1';")
            except Exception:
                loaded = False
        time.sleep(0.5)
finally:
    d.quit()
