"""Check the chat page of ``llamacpy serve`` in headless Chromium: it loads, sends a message,
and shows a streamed reply.

Starts the server (``-n`` bounds the reply) and ``chromedriver``, then drives Chromium over
the WebDriver protocol with plain HTTP requests (no Selenium). A MutationObserver put on the
reply element records its text length at every change, so the check can tell a streamed
reply (several growing, non-empty states before the page marks it done) from one that
arrives at once. Exits 1 if the page does not load, shows an error, or the reply is not
streamed. Needs Debian's ``chromium`` and ``chromium-driver`` packages.

    .venv/bin/python benchmarks/check_webui_chromium.py [-m smollm2-135m] [-n 48]
        [--message "Hello! Who are you?"] [--timeout 180]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import subprocess
import sys
import time

import httpx

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C WebDriver element key

OBSERVE = """
const log = document.getElementById("log");
window.__lens = []; window.__t0 = performance.now();
new MutationObserver(() => {
  const out = log.querySelector(".msg.assistant, .msg.error");
  if (out) window.__lens.push([performance.now() - window.__t0, out.textContent.length]);
}).observe(log, {childList: true, subtree: true, characterData: true});
"""
STATE = """
const out = document.querySelector("#log .msg:last-child");
return out ? {cls: out.className, text: out.textContent, done: out.dataset.done === "1",
              lens: window.__lens, user: document.querySelectorAll("#log .msg.user").length}
           : null;
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(url: str, seconds: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + seconds
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up")
        time.sleep(0.2)


class WebDriver:
    """The few W3C WebDriver commands the check needs."""

    def __init__(self, base: str, browser: str) -> None:
        self.http = httpx.Client(base_url=base, timeout=120)
        caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": browser, "args": [
            "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]}}  # fmt: skip
        r = self.cmd("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.sid = r["sessionId"]

    def cmd(self, method: str, path: str, body: dict | None = None):
        r = self.http.request(method, path, json=body if method == "POST" else None)
        value = r.json().get("value")
        if r.status_code != 200:
            raise RuntimeError(f"webdriver {method} {path}: {value}")
        return value

    def session(self, method: str, path: str, body: dict | None = None):
        return self.cmd(method, f"/session/{self.sid}{path}", body)

    def find(self, css: str) -> str:
        found = self.session("POST", "/element", {"using": "css selector", "value": css})
        if not isinstance(found, dict) or ELEMENT not in found:
            raise RuntimeError(f"no element {css!r}: {found}")
        return found[ELEMENT]

    def script(self, js: str):
        return self.session("POST", "/execute/sync", {"script": js, "args": []})

    def quit(self) -> None:
        with contextlib.suppress(Exception):
            self.session("DELETE", "")
        self.http.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-n", "--n-predict", type=int, default=48, help="reply length bound")
    ap.add_argument("--message", default="Hello! Who are you?")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds for the reply")
    ap.add_argument("--browser", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--driver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    args = ap.parse_args()

    port, dport = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "llamacpy", "serve", "-m", args.model, "--port", str(port),
         "-n", str(args.n_predict), "-c", "2048", "-t", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    driver = subprocess.Popen([args.driver, f"--port={dport}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    wd = None
    try:
        wait_until(base + "/health", 180, server, "the server")
        wait_until(f"http://127.0.0.1:{dport}/status", 60, driver, "chromedriver")
        wd = WebDriver(f"http://127.0.0.1:{dport}", args.browser)
        t0 = time.perf_counter()
        wd.session("POST", "/url", {"url": base + "/"})
        title = wd.session("GET", "/title")
        wd.find("#input")  # the page's form is there
        print(f"page loaded: title {title!r} in {time.perf_counter() - t0:.2f} s")
        wd.script(OBSERVE)
        wd.session("POST", f"/element/{wd.find('#input')}/value", {"text": args.message})
        t0 = time.perf_counter()
        wd.session("POST", f"/element/{wd.find('#send')}/click", {})
        t_click = time.perf_counter() - t0
        state, t_first = None, None
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            state = wd.script(STATE)
            if state and state["text"] and t_first is None:
                t_first = time.perf_counter() - t0
            if state and state["done"]:
                break
            time.sleep(0.05)
        wall = time.perf_counter() - t0
    finally:
        if wd is not None:
            wd.quit()
        for proc in (driver, server):
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            if proc.poll() is None:
                proc.kill()

    if not state or not state["done"]:
        print(f"no finished reply within {args.timeout:.0f} s: {state}")
        return 1
    seen = [(t / 1000, n) for t, n in state["lens"] if n > 0]
    lens = [n for _, n in seen]
    states = len(set(lens))
    print(f"message sent: {args.message!r} ({state['user']} user message shown)")
    print(f"reply ({state['cls']}): {state['text']!r}")
    first = f"{t_first:.2f} s" if t_first is not None else "n/a"
    print(f"  click returned after {t_click:.2f} s, first text seen after {first}, done after "
          f"{wall:.2f} s")  # fmt: skip
    span = seen[-1][0] - seen[0][0] if seen else 0.0
    print(f"  in the page: {states} growing states over {span:.2f} s (first at "
          f"{seen[0][0] if seen else 0:.2f} s after sending)")  # fmt: skip
    streamed = states >= 2 and lens == sorted(lens) and span > 0
    ok = state["cls"] == "msg assistant" and state["text"].strip() and state["user"] == 1
    print(f"streamed reply shown: {bool(ok and streamed)}")
    return 0 if ok and streamed else 1


if __name__ == "__main__":
    sys.exit(main())
