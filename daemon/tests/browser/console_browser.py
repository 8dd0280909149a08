"""Drives the qd web console in headless Chromium (Selenium + chromedriver).

Run by daemon/tests/console_browser.rs against a real qd; every check raises on
failure (exit status 1), and each page's screenshot is saved under SHOTS.
Environment: CONSOLE (base URL with the prefix), API, TOKEN (roles produce, work,
read, admin), SHOTS (a directory), PROFILE (a fresh user-data-dir).
"""

import http.server
import json
import os
import sys
import threading
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

CONSOLE = os.environ["CONSOLE"]
API = os.environ["API"]
TOKEN = os.environ["TOKEN"]
SHOTS = os.environ["SHOTS"]


def api(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        API + path,
        method=method,
        data=data,
        headers={"authorization": "Bearer " + TOKEN, "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def step(name):
    print("STEP " + name, flush=True)


opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for arg in [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--user-data-dir=" + os.environ["PROFILE"],
    "--window-size=1280,900",
]:
    opts.add_argument(arg)
d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
wait = WebDriverWait(d, 30)


def shot(name):
    d.save_screenshot(os.path.join(SHOTS, name + ".png"))


def ready():
    # Read in one script call: live mode replaces the table's rows, so an element
    # found in one WebDriver call may be gone by the next (stale reference).
    return d.execute_script(
        "const c = document.querySelector('tr[data-queue=\"ext\"] td.ready');"
        "return c ? parseInt(c.textContent, 10) : -1;"
    )


try:
    step("login")
    d.get(CONSOLE + "/")
    assert d.current_url.endswith("/login"), d.current_url
    d.find_element(By.NAME, "token").send_keys(TOKEN)
    d.find_element(By.CSS_SELECTOR, "main form button").click()
    wait.until(lambda d: ready() >= 0)
    shot("overview")

    step("live overview")
    d.execute_script("window.__same_page = 42;")
    before = ready()
    for i in range(3):
        api("POST", "/v1/queues/ext/jobs", {"payload": "live %d" % i})
    wait.until(lambda d: ready() >= before + 3)
    assert d.execute_script("return window.__same_page") == 42, "the page was reloaded"
    print("live mode: " + str(d.find_element(By.ID, "live").get_attribute("data-mode")))
    shot("overview-live")

    step("payload shown as text")
    evil = "<script>window.__pwned=1;document.title='pwned'</script><img src=x onerror=\"window.__pwned=2\">"
    evil_id = api("POST", "/v1/queues/ext/jobs", {"payload": evil})["id"]
    d.get(CONSOLE + "/jobs/" + evil_id)
    shown = d.find_element(By.CSS_SELECTOR, "pre.payload").text
    assert evil in shown, shown
    assert d.execute_script("return window.__pwned === undefined"), "the payload ran"
    assert d.title != "pwned"
    assert not d.find_elements(By.CSS_SELECTOR, "pre.payload script, pre.payload img")
    shot("job")

    step("redrive by filter")
    leased = api("POST", "/v1/queues/ext/leases", {"worker_id": "browser", "max_jobs": 100, "wait": "2s"})
    ids = [j["id"] for j in leased["jobs"]]
    assert len(ids) >= 4, leased
    for j in leased["jobs"]:
        api("POST", "/v1/jobs/%s/nack" % j["id"],
            {"token": j["token"], "error": "smtp refused the message", "kind": "permanent"})
    d.get(CONSOLE + "/dlq?error=smtp+refused")
    shot("dlq")
    d.find_element(By.XPATH, "//button[starts-with(normalize-space(.), 'Redrive')]").click()
    wait.until(lambda d: "dead jobs match" in d.page_source)
    assert "<b>%d</b> dead jobs match" % len(ids) in d.page_source, d.page_source
    shot("redrive-confirm")
    d.find_element(By.XPATH, "//button[starts-with(normalize-space(.), 'Redrive %d')]" % len(ids)).click()
    wait.until(lambda d: "Redrove" in d.page_source)
    for i in ids:
        state = api("GET", "/v1/jobs/" + i)["state"]
        assert state == "ready", (i, state)

    step("pause")
    d.get(CONSOLE + "/queues/ext")
    d.find_element(By.XPATH, "//button[normalize-space(.)='Pause']").click()
    wait.until(lambda d: "paused." in d.page_source)
    assert d.find_element(By.CSS_SELECTOR, "b.paused").text == "paused"
    shot("queue-paused")

    step("attacker page")
    attack = """<!doctype html><html><body>
<form id="f" method="post" action="%s/queues/ext/resume"><input name="x" value="1"></form>
<script>document.getElementById('f').submit();</script></body></html>""" % CONSOLE

    class Attacker(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = attack.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # "localhost" against the console's 127.0.0.1: another site, not just another port.
    d.get("http://localhost:%d/" % server.server_port)
    wait.until(lambda d: "/queues/ext/resume" in d.current_url)
    shot("attacker-refused")
    assert "Forbidden" in d.title, d.title
    assert "cross-site request refused" in d.page_source, d.page_source
    server.shutdown()

    step("pages")
    for name, path in [("jobs", "/jobs?queue=ext"), ("limits", "/limits"), ("queue", "/queues/ext")]:
        d.get(CONSOLE + path)
        assert "qd" in d.title
        shot(name)
    print("ALL OK", flush=True)
finally:
    d.quit()
