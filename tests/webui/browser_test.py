#!/usr/bin/env python3
"""Drives the built-in web page in headless Chromium against `strata serve` on the demo model.

Usage: browser_test.py --strata target/debug/strata --out target/webui-artifacts

Starts two servers (one open, one with --api-key), runs each check below in a real browser,
saves a screenshot after each, and ends with `webui: N passed, M failed` (exit 1 on any failure).
"""

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

API_KEY = "webui-test-key"
WAIT = 30


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, key=None):
    """(status, body text) of a GET; HTTP errors are answers, not exceptions."""
    request = urllib.request.Request(url)
    if key:
        request.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Server:
    def __init__(self, strata, log_dir, name, extra):
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = open(os.path.join(log_dir, name + ".log"), "w")
        cmd = [strata, "serve", "--backend", "cpu", "--port", str(self.port)] + extra
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("strata serve exited with %s" % self.proc.returncode)
            try:
                status, _ = http_get(self.url + "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("strata serve was not ready after %d s" % timeout)

    def metric(self, name, key=None):
        status, text = http_get(self.url + "/metrics", key)
        if status != 200:
            raise AssertionError("/metrics answered %d" % status)
        match = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
        if not match:
            raise AssertionError("%s missing from /metrics" % name)
        return float(match.group(1))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def make_driver():
    options = webdriver.ChromeOptions()
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,860", "--force-device-scale-factor=1"]:
        options.add_argument(arg)
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser:
        options.binary_location = browser
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(service=Service(executable_path=driver_path), options=options)


def wait_for(driver, condition, message, timeout=WAIT):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: condition(d), message=message)


def reply_state(driver):
    """(status text, content text, reasoning text) of the last assistant message, read in one
    script call: the page re-renders messages while streaming, so element handles go stale."""
    return tuple(driver.execute_script("""
        const all = document.querySelectorAll('.msg.assistant');
        const m = all[all.length - 1];
        if (!m) { return ['', '', '']; }
        const text = (sel) => { const e = m.querySelector(sel); return e ? e.textContent : ''; };
        return [text('.msg-meta'), text('.msg-content'), text('.reasoning-body')];
    """))


def streamed_so_far(driver):
    """Characters shown in the last reply while it is still generating (0 once it ended)."""
    status, content, reasoning = reply_state(driver)
    return len(content) + len(reasoning) if status == "generating…" else 0


def set_field(driver, name, value):
    settings = driver.find_element(By.ID, "settings")
    if not settings.get_attribute("open"):
        settings.find_element(By.TAG_NAME, "summary").click()
    field = driver.find_element(By.ID, "set-" + name)
    field.clear()
    field.send_keys(str(value))


def set_max_tokens(driver, n):
    set_field(driver, "max_tokens", n)


def send(driver, text):
    box = driver.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


class Suite:
    def __init__(self, args):
        self.out = args.out
        self.strata = args.strata
        self.results = []
        self.open = Server(self.strata, self.out, "server", [])
        self.keyed = Server(self.strata, self.out, "server-key", ["--api-key", API_KEY])
        self.open.wait_ready()
        self.keyed.wait_ready()
        self.driver = make_driver()
        self.context = json.loads(http_get(self.open.url + "/health")[1])["context_length"]

    def shot(self, name):
        self.driver.save_screenshot(os.path.join(self.out, name + ".png"))

    def run(self, name, check):
        started = time.time()
        try:
            check()
            self.results.append((name, True))
            print("PASS %s (%.1f s)" % (name, time.time() - started), flush=True)
        except Exception:  # noqa: BLE001 - every failure is reported, then the next check runs
            self.results.append((name, False))
            print("FAIL %s\n%s" % (name, traceback.format_exc()), flush=True)
            try:
                self.shot("failed-" + name)
            except Exception:  # noqa: BLE001
                pass

    # ----- the checks -----

    def page_loads(self):
        d = self.driver
        d.get(self.open.url + "/")
        wait_for(d, lambda d: " · " in d.find_element(By.ID, "model-name").text,
                 "the model name never appeared")
        assert d.find_element(By.ID, "demo-banner").is_displayed(), "no first-run banner"
        assert "--model" in d.find_element(By.ID, "demo-banner").text
        self.shot("01-chat-empty")

    def markdown_is_safe(self):
        html = self.driver.execute_script(
            "return window.strataMarkdown.render(arguments[0]);",
            "# Title\n**bold** and *it* `x<y`\n\n- one\n- two\n\n```rust\nfn main() {}\n```\n"
            "<img src=x onerror=alert(1)> [ok](https://example.com/a_b_c) [bad](javascript:alert(1))")
        for want in ["<h1>Title</h1>", "<strong>bold</strong>", "<em>it</em>", "<code>x&lt;y</code>",
                     "<ul><li>one</li><li>two</li></ul>", '<pre><code class="lang-rust">fn main() {}',
                     "&lt;img", 'href="https://example.com/a_b_c"']:
            assert want in html, "missing %r in %s" % (want, html)
        assert "<img" not in html and "javascript:alert(1)\"" not in html, html
        assert 'href="javascript' not in html, html

    def chat_streams_a_reply(self):
        d = self.driver
        # Greedy decoding makes the conversation the same on every run: sampled, the demo model
        # sometimes ends the long story of the next check before Stop can be clicked.
        set_field(d, "temperature", 0)
        set_max_tokens(d, 24)
        send(d, "Hello there")
        wait_for(d, lambda d: reply_state(d)[0].startswith("finished"),
                 "the reply never finished: %r" % (reply_state(d),), timeout=60)
        _, text, reasoning = reply_state(d)
        assert text.strip() or reasoning.strip(), "the reply is empty"
        self.shot("02-chat-reply")

    def stop_cancels_generation(self):
        d = self.driver
        before = self.open.metric("strata_generations_cancelled_total")
        set_max_tokens(d, max(64, self.context // 2))
        send(d, "Write a very long story")
        # Text arriving while the reply is still marked generating is text streamed in.
        wait_for(d, lambda d: streamed_so_far(d) > 20,
                 "no streamed text while generating: %r" % (reply_state(d),), timeout=60)
        self.shot("03-chat-streaming")
        d.find_element(By.ID, "stop").click()
        wait_for(d, lambda d: reply_state(d)[0] == "stopped", "the reply was not marked stopped")
        assert d.find_element(By.ID, "send").is_displayed(), "Send did not come back"
        deadline = time.time() + 15
        while self.open.metric("strata_generations_cancelled_total") <= before:
            assert time.time() < deadline, "/metrics never counted the cancel"
            time.sleep(0.2)
        assert self.open.metric("strata_requests_running") == 0
        self.shot("04-chat-stopped")

    def reload_keeps_conversation(self):
        d = self.driver
        d.refresh()
        wait_for(d, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#conversations li")) >= 1,
                 "no conversation after reload")
        titles = [e.text for e in d.find_elements(By.CSS_SELECTOR, "#conversations .conv-title")]
        assert "Hello there" in titles, titles
        d.find_element(By.CSS_SELECTOR, "#conversations li .conv-title").click()
        wait_for(d, lambda d: "Hello there" in d.find_element(By.ID, "messages").text,
                 "the conversation's messages were not restored")
        metas = [e.text for e in d.find_elements(By.CSS_SELECTOR, ".msg.assistant .msg-meta")]
        assert "stopped" in metas and any(m.startswith("finished") for m in metas), metas
        self.shot("05-chat-reloaded")

    def monitor_chart_updates(self):
        d = self.driver
        d.find_element(By.ID, "tab-monitor").click()
        canvas = d.find_element(By.ID, "chart-tps")
        first = int(canvas.get_attribute("data-samples") or 0)
        wait_for(d, lambda d: int(canvas.get_attribute("data-samples") or 0) >= first + 3,
                 "the chart did not take new samples")
        last = json.loads(canvas.get_attribute("data-last"))
        assert last[1] and last[1] > 0, "no decode tok/s after two generations: %s" % last
        assert last[2] and last[2] > 0, "no prefill tok/s after two generations: %s" % last
        text = d.find_element(By.ID, "view-monitor").text
        assert "Backend / adapter" in text and "cpu" in text and "n/a" in text, text
        # Generate while watching: the live decode line must rise above zero.
        status, _ = http_get(self.open.url + "/v1/monitor")
        assert status == 200, status
        body = json.dumps({"messages": [{"role": "user", "content": "count"}], "max_tokens": 200})
        req = urllib.request.Request(self.open.url + "/v1/chat/completions", body.encode(),
                                     {"Content-Type": "application/json"})
        worker = threading.Thread(target=lambda: urllib.request.urlopen(req, timeout=120).read())
        worker.start()
        peak = 0.0
        # Each poll counts the tokens made since the one before, so watch until a poll after the end.
        deadline = time.time() + 120
        while worker.is_alive() and time.time() < deadline:
            values = json.loads(canvas.get_attribute("data-last"))
            peak = max(peak, values[0] or 0)
            time.sleep(0.25)
        worker.join()
        deadline = time.time() + 2.5
        while time.time() < deadline:
            values = json.loads(canvas.get_attribute("data-last"))
            peak = max(peak, values[0] or 0)
            time.sleep(0.25)
        assert peak > 0, "the live decode line never rose"
        self.shot("06-monitor")

    def api_key_is_asked_and_used(self):
        d = self.driver
        status, _ = http_get(self.keyed.url + "/v1/monitor")
        assert status == 401, "monitor without key answered %d" % status
        assert http_get(self.keyed.url + "/v1/monitor", API_KEY)[0] == 200
        assert http_get(self.keyed.url + "/")[0] == 200, "the page itself must be public"
        d.get(self.keyed.url + "/")
        wait_for(d, lambda d: d.find_element(By.ID, "key-dialog").is_displayed(), "no key dialog")
        d.find_element(By.ID, "key-input").send_keys("wrong")
        d.find_element(By.ID, "key-submit").click()
        wait_for(d, lambda d: d.find_element(By.ID, "key-error").is_displayed(), "wrong key accepted")
        self.shot("07-api-key")
        box = d.find_element(By.ID, "key-input")
        box.clear()
        box.send_keys(API_KEY)
        d.find_element(By.ID, "key-submit").click()
        wait_for(d, lambda d: " · " in d.find_element(By.ID, "model-name").text,
                 "the page did not load with the key")
        set_max_tokens(d, 8)
        send(d, "hi with a key")
        wait_for(d, lambda d: reply_state(d)[0].startswith("finished"),
                 "the keyed reply never finished: %r" % (reply_state(d),), timeout=60)

    def no_console_errors(self):
        errors = [e for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"
                  and "401" not in e.get("message", "") and "favicon" not in e.get("message", "")]
        assert not errors, errors

    def close(self):
        self.driver.quit()
        self.open.stop()
        self.keyed.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    try:
        suite = Suite(args)
    except Exception:  # noqa: BLE001 - no server or no browser: say so and fail
        traceback.print_exc()
        print("webui: 0 passed, 1 failed (setup)")
        return 1
    try:
        for name in ["page_loads", "markdown_is_safe", "chat_streams_a_reply",
                     "stop_cancels_generation", "reload_keeps_conversation",
                     "monitor_chart_updates", "api_key_is_asked_and_used", "no_console_errors"]:
            suite.run(name, getattr(suite, name))
    finally:
        suite.close()
    passed = sum(1 for _, ok in suite.results if ok)
    failed = len(suite.results) - passed
    print("screenshots and server logs: %s" % args.out)
    print("webui: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
