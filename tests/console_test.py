#!/usr/bin/env python3
"""console_test.py -- the browser and HTTP side of tests/console_test.c.

A small WebDriver client (the standard library's urllib against
chromedriver's HTTP API) drives Debian's headless Chromium through the
console of a running `kinbox run`; console_test.c prepares the database
and the broker and checks the outcomes in SQL.

  console_test.py headers --base URL --token T --secret S...
      the JSON endpoints' security headers, the token and the Origin rule
      (no browser).
  console_test.py browser --base URL --token T --secret S... --replay ID
      --discard ID --xss ID [--shots DIR]
      the page: no console error, counts shown, <script> inert, a replay
      and a discard done from the page.
  console_test.py relay --base URL --token T --secret S... [--min-published N]
      [--min-lag BYTES]
      /console/api/overview's relay until it has published N or shows a
      slot lag of BYTES or more (no browser).

Prints one JSON object of what it saw on stdout; exits non-zero with the
reason on stderr when something is wrong. Chromium or chromedriver
missing is a failure, never a skip.
"""
import argparse
import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def die(msg):
    print("console_test.py: " + msg, file=sys.stderr)
    sys.exit(1)


def http(method, url, headers=None, body=None):
    req = urllib.request.Request(url, data=body, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def no_secret(body, secrets, what):
    text = body.decode("utf-8", "replace")
    for s in secrets:
        if s and s in text:
            die("%s: the answer holds a secret (%r)" % (what, s))
    low = text.lower()
    for word in ("password", "sasl", "database.url"):
        if word in low:
            die("%s: the answer mentions %r" % (what, word))


CSP_NEEDS = ("default-src 'none'", "script-src 'self'")


def check_headers(a):
    base, token = a.base, a.token
    seen = {}
    for path in ("/console", "/console/app.js", "/console/api/session",
                 "/console/api/overview", "/console/api/dead",
                 "/console/api/parked", "/console/api/outbox?status=dead"):
        code, h, body = http("GET", base + path)
        if code != 200:
            die("GET %s: %d %r" % (path, code, body[:200]))
        csp = h.get("Content-Security-Policy", "")
        for need in CSP_NEEDS:
            if need not in csp:
                die("GET %s: Content-Security-Policy %r lacks %r" %
                    (path, csp, need))
        if "unsafe-inline" in csp or "unsafe-eval" in csp:
            die("GET %s: CSP allows inline script: %r" % (path, csp))
        if h.get("X-Content-Type-Options") != "nosniff":
            die("GET %s: no nosniff" % path)
        if h.get("X-Frame-Options") != "DENY":
            die("GET %s: framing allowed" % path)
        if path.startswith("/console/api/"):
            if not h.get("Content-Type", "").startswith("application/json"):
                die("GET %s: content type %r" % (path, h.get("Content-Type")))
            json.loads(body)
            no_secret(body, a.secret, "GET " + path)
        seen[path] = code
    # The page holds no inline script.
    _, _, page = http("GET", base + "/console")
    if b"<script>" in page or b"onload=" in page or b"onclick=" in page:
        die("the page has inline script")
    act = base + "/console/api/dead/999999999/discard"
    origin = base.split("/console")[0]
    tests = [
        ("no token", {}, 401),
        ("a wrong token", {"Authorization": "Bearer " + "x" * len(token)},
         401),
        ("a token of another length", {"Authorization": "Bearer abc"}, 401),
        ("a foreign Origin", {"Authorization": "Bearer " + token,
                              "Origin": "http://evil.example"}, 403),
        ("a cross-site fetch", {"Authorization": "Bearer " + token,
                                "Sec-Fetch-Site": "cross-site"}, 403),
        ("a rebound Host", {"Authorization": "Bearer " + token,
                            "Host": "evil.example"}, 403),
        ("the token and our Origin", {"Authorization": "Bearer " + token,
                                      "Origin": origin}, 404),
    ]
    for what, hdrs, want in tests:
        code, h, body = http("POST", act, hdrs, b"")
        if code != want:
            die("POST with %s: %d, want %d (%r)" % (what, code, want, body))
        if "Content-Security-Policy" not in h:
            die("POST with %s: no CSP on the refusal" % what)
        no_secret(body, a.secret, "POST " + what)
    # Dead letters: newest first, paginated, filtered.
    def dead(q):
        code, _, body = http("GET", base + "/console/api/dead" + q)
        return code, json.loads(body)
    code, p1 = dead("?limit=1")
    if code != 200 or len(p1["rows"]) != 1 or not p1["next_before"]:
        die("dead?limit=1: %d %r" % (code, p1))
    code, p2 = dead("?limit=1&before=%d" % p1["next_before"])
    if code != 200 or len(p2["rows"]) != 1 or \
            p2["rows"][0]["id"] >= p1["rows"][0]["id"]:
        die("the second page: %r after %r" % (p2, p1))
    code, allrows = dead("?limit=100")
    ids = [r["id"] for r in allrows["rows"]]
    if ids != sorted(ids, reverse=True) or allrows["next_before"]:
        die("dead?limit=100: not newest first, or more pages: %r" % ids)
    topic = allrows["rows"][0]["topic"]
    if len(dead("?topic=" + topic)[1]["rows"]) != len(ids) or \
            dead("?consumer=nobody")[1]["rows"] or \
            dead("?topic=nope")[1]["rows"]:
        die("the dead letters' filters")
    if dead("?status=bogus")[0] != 400:
        die("dead?status=bogus is not refused")
    code, one = http("GET", base + "/console/api/dead/%d" % ids[0])[::2]
    if code != 200 or "payload" not in json.loads(one):
        die("dead/ID: %d" % code)
    # A body over 64 KB is refused before anything runs.
    code, _, _ = http("POST", act, {"Authorization": "Bearer " + token},
                      b"x" * 70000)
    if code != 413:
        die("a 70 KB body: %d, want 413" % code)
    # A selection must be bounded.
    code, _, _ = http("POST", base + "/console/api/dead/discard",
                      {"Authorization": "Bearer " + token}, b"")
    if code != 400:
        die("a selection without max: %d, want 400" % code)
    code, _, _ = http("GET", act)
    if code != 404 and code != 405:
        die("GET of an action: %d" % code)
    code, _, _ = http("PUT", base + "/console/api/overview", {}, b"")
    if code != 405:
        die("PUT: %d, want 405" % code)
    return {"checked": sorted(seen)}


# ---------------------------------------------------------------- WebDriver

class Driver:
    def __init__(self):
        chromium = shutil.which("chromium")
        driver = shutil.which("chromedriver")
        if not chromium or not driver:
            die("chromium and chromedriver are required (Debian packages "
                "chromium, chromium-driver; scripts/setup installs them)")
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.proc = subprocess.Popen([driver, "--port=%d" % self.port],
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.url = "http://127.0.0.1:%d" % self.port
        for _ in range(100):
            try:
                self.cmd("GET", "/status")
                break
            except Exception:
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox",
                         "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,900"]},
            "goog:loggingPrefs": {"browser": "ALL"}}}}
        self.sid = self.cmd("POST", "/session", caps)["sessionId"]

    def cmd(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data,
                                     method=method,
                                     headers={"Content-Type":
                                              "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            raise RuntimeError("webdriver %s %s: %s" %
                               (method, path, e.read()[:500]))

    def s(self, method, path, body=None):
        return self.cmd(method, "/session/%s%s" % (self.sid, path), body)

    def go(self, url):
        self.s("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.s("POST", "/execute/sync",
                      {"script": script, "args": list(args)})

    def find(self, css):
        r = self.s("POST", "/element", {"using": "css selector",
                                        "value": css})
        return list(r.values())[0]

    def click(self, css):
        # The page re-renders its tables every 2 s: an element found just
        # before a refresh is gone when clicked (404, no such element / a
        # stale reference). Find it again.
        for attempt in range(10):
            try:
                self.s("POST", "/element/%s/click" % self.find(css), {})
                return
            except RuntimeError:
                if attempt == 9:
                    raise
                time.sleep(0.2)

    def type(self, css, text):
        self.s("POST", "/element/%s/value" % self.find(css), {"text": text})

    def wait(self, script, what, timeout=30):
        end = time.time() + timeout
        while time.time() < end:
            v = self.js(script)
            if v:
                return v
            time.sleep(0.2)
        die("timed out waiting for " + what)

    def shot(self, path):
        png = base64.b64decode(self.s("GET", "/screenshot"))
        with open(path, "wb") as f:
            f.write(png)

    def logs(self):
        return self.s("POST", "/se/log", {"type": "browser"})

    def quit(self):
        try:
            self.s("DELETE", "")
        finally:
            self.proc.terminate()
            self.proc.wait(10)


def act_from_page(d, row_css, label):
    """Click the row's action button, confirm, wait for the result."""
    d.js("document.getElementById('result').textContent = '';")
    btn = "%s button[data-action*='/%s']" % (row_css, label)
    d.wait("return !!document.querySelector(\"%s\");" % btn, btn)
    if d.js("return document.querySelector(\"%s\").disabled;" % btn):
        die("the %s button is disabled" % label)
    d.click(btn)
    d.wait("return document.getElementById('confirm').open;", "confirm")
    d.click("#confirm-yes")
    return d.wait("const t = document.getElementById('result').textContent;"
                  " return /^(done|refused)/.test(t) ? t : null;",
                  label + " result")


def browser(a):
    out = {}
    d = Driver()
    try:
        d.go(a.base + "/console")
        d.wait("return document.body.dataset.loaded === '1' && "
               "document.querySelector('#consumers tbody tr') !== null;",
               "the consumers view")
        time.sleep(4.5)  # two refreshes more: msg/s and the parked view
        out["dead_shown"] = int(d.js("return document.body.dataset.dead;"))
        out["lag_shown"] = d.js(
            "return document.querySelector('#consumers tbody tr')"
            ".children[3].textContent;")
        out["parked_rows"] = d.js(
            "return document.querySelectorAll('#parked tbody tr').length;")
        if a.shots:
            d.shot(os.path.join(a.shots, "console-consumers.png"))
        d.click("#nav-dead")
        d.wait("return document.querySelectorAll('#dead tbody tr')"
               ".length >= 3;", "the dead letters")
        out["dead_rows"] = d.js(
            "return document.querySelectorAll('#dead tbody tr').length;")
        # The hostile payload: shown as text, never run.
        d.js("window.__kbx = undefined;")
        d.click("#dead tr[data-id='%s'] button" % a.xss)
        d.wait("return !document.getElementById('detail').hidden && "
               "document.getElementById('detail-title').textContent"
               ".endsWith(' %s');" % a.xss, "the detail")
        out["xss_text"] = d.js(
            "return document.getElementById('payload').textContent;")
        out["xss_elements"] = d.js(
            "return document.querySelectorAll('#detail script, #detail img,"
            " #payload *').length;")
        out["xss_ran"] = d.js("return window.__kbx !== undefined;")
        if a.shots:
            d.shot(os.path.join(a.shots, "console-dead-letter.png"))
        # Read-only until the token is given: the buttons are there.
        d.type("#token", a.token)
        d.type("#operator", "console-test")
        out["replay"] = act_from_page(
            d, "#dead tr[data-id='%s']" % a.replay, "replay")
        out["discard"] = act_from_page(
            d, "#dead tr[data-id='%s']" % a.discard, "discard")
        time.sleep(2.5)
        if a.shots:
            d.shot(os.path.join(a.shots, "console-dead.png"))
        # The outbox: requeue a dead row, cancel a pending one, pause the
        # destination.
        d.click("#nav-outbox")
        d.wait("return !!document.querySelector(\"#outbox-rows tr[data-id='%s']\");"
               % a.ob_dead, "the dead outbox row")
        out["requeue"] = act_from_page(
            d, "#outbox-rows tr[data-id='%s']" % a.ob_dead, "requeue")
        d.js("document.getElementById('ob-status').value = 'pending';")
        d.click("#outbox-filter button")
        d.wait("return !!document.querySelector(\"#outbox-rows tr[data-id='%s']\");"
               % a.ob_pend, "the pending outbox row")
        out["cancel"] = act_from_page(
            d, "#outbox-rows tr[data-id='%s']" % a.ob_pend, "cancel")
        out["pause"] = act_from_page(
            d, "#outbox tr[data-dest='%s']" % a.ob_dest, "pause")
        d.wait("return !!document.querySelector(\"#outbox tr[data-dest='%s']"
               " button[data-action*='/resume']\");" % a.ob_dest,
               "the resume button")
        d.js("document.getElementById('ob-status').value = 'any';")
        d.click("#outbox-filter button")
        time.sleep(1)
        if a.shots:
            d.shot(os.path.join(a.shots, "console-outbox.png"))
        # Every JSON answer the page got: no secret (the same URLs).
        for path in ("overview", "dead?status=any", "dead/%s" % a.xss,
                     "parked", "outbox?status=any"):
            _, _, body = http("GET", a.base + "/console/api/" + path)
            no_secret(body, a.secret, path)
        logs = d.logs()
        out["console_errors"] = [x["message"] for x in logs
                                 if x.get("level") in ("SEVERE", "WARNING")]
    finally:
        d.quit()
    return out


def relay(a):
    """The overview's relay object once it shows what the test waits for
    (the overview is sampled every 2 s, the slot every 10 s)."""
    rel = None
    for _ in range(120):
        code, _h, body = http("GET", a.base + "/console/api/overview")
        if code != 200:
            die("GET /console/api/overview: %d %r" % (code, body[:200]))
        no_secret(body, a.secret, "GET /console/api/overview")
        rel = json.loads(body).get("relay")
        lag = rel.get("slot_lag_bytes") if rel else None
        if rel and (a.min_published is None or
                    (rel.get("published") or 0) >= a.min_published) and \
                (a.min_lag is None or (lag is not None and lag >= a.min_lag)):
            return {"relay": rel}
        time.sleep(0.5)
    die("the overview's relay never showed it: %r" % (rel,))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("headers", "browser", "relay"))
    p.add_argument("--base", required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--secret", action="append", default=[])
    p.add_argument("--replay")
    p.add_argument("--discard")
    p.add_argument("--xss")
    p.add_argument("--shots")
    p.add_argument("--ob-dead")
    p.add_argument("--ob-pend")
    p.add_argument("--ob-dest")
    p.add_argument("--min-published", type=int)
    p.add_argument("--min-lag", type=int)
    a = p.parse_args()
    modes = {"headers": check_headers, "browser": browser, "relay": relay}
    out = modes[a.mode](a)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
