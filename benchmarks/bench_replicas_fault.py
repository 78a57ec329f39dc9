"""Replicas behind HAProxy under load, with one replica killed (SIGKILL) and restarted.

Starts ``--replicas`` ``llamacpy serve`` processes (ports 8081...) and HAProxy with
``deploy/haproxy/haproxy.cfg`` (its server lines rewritten for the replica count), then runs
``--clients`` client threads for ``--seconds``: each sends, in turn, a non-streamed and a
streamed ``/v1/completions`` request (``--tokens`` greedy tokens, ``ignore_eos``) through the
balancer, half of them with an ``X-Session-Id`` so affinity applies. At 1/3 of the run one
replica is killed with SIGKILL; at 2/3 it is started again. Every request is classified:

* complete: a 200 with all its tokens (a stream that ended with ``[DONE]`` and every token);
* clear error: an HTTP error status, or a stream that ended early (its replica died);
* hung: no answer within ``--timeout`` seconds (must be 0).

Prints the counts and the completed tokens/s before, during and after the outage.

``--affinity`` measures instead what the balancer's affinity is worth: ``--clients``
conversations of ``--turns`` chat turns each (the history grows every turn), run once with
an ``X-Session-Id`` per conversation and once without (round robin), each time with new
conversations; the prompt-cache hit rate is the prompt tokens the replicas found in their
KV caches over all prompt tokens (``/metrics`` of every replica).

Needs Debian's ``haproxy`` on the PATH.

    .venv/bin/python benchmarks/bench_replicas_fault.py [-m smollm2-135m] [--replicas 3]
        [--clients 6] [--seconds 60] [--tokens 24] [--affinity --turns 6]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
CFG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"


def start_replica(model: str, port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "llamacpy", "serve", "-m", model, "--port", str(port),
           "-c", "2048", "-np", "2", "-t", "1", "--drain-seconds", "2", "--metrics"]  # fmt: skip
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    out = open(log, "a")  # noqa: SIM115  (the child writes to it until it exits)
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_healthy(url: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not become healthy")


def haproxy_config(n: int, tmp: Path) -> Path:
    text = CFG.read_text()
    text = re.sub(r"^\s+server r\d+ .*\n", "", text, flags=re.M)
    text += "".join(f"    server r{i + 1} 127.0.0.1:{8081 + i} check\n" for i in range(n))
    path = tmp / "haproxy.cfg"
    path.write_text(text)
    return path


def one_request(client: httpx.Client, base: str, stream: bool, n_tok: int, session: str | None,
                timeout: float) -> tuple[str, int]:  # fmt: skip
    """``(outcome, tokens)``: outcome is complete, error or hung."""
    body = {"prompt": "Write a list of fruits:", "max_tokens": n_tok, "temperature": 0,
            "ignore_eos": True, "stream": stream}  # fmt: skip
    headers = {"X-Session-Id": session} if session else {}
    try:
        if not stream:
            r = client.post(base + "/v1/completions", json=body, headers=headers, timeout=timeout)
            if r.status_code != 200:
                return "error", 0
            n = r.json()["usage"]["completion_tokens"]
            return ("complete" if n == n_tok else "error"), n
        n, done = 0, False
        with client.stream("POST", base + "/v1/completions", json=body, headers=headers,
                           timeout=timeout) as r:  # fmt: skip
            if r.status_code != 200:
                return "error", 0
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: ") and '"error"' not in line:
                    n += 1 if json.loads(line[6:])["choices"][0]["text"] else 0
        return ("complete" if done else "error"), n
    except httpx.TimeoutException:
        return "hung", 0
    except httpx.HTTPError:
        return "error", 0


def cache_counts(n: int) -> tuple[float, float]:
    """``(prompt tokens found in the cache, prompt tokens decoded)`` over the replicas."""
    hit = done = 0.0
    for i in range(n):
        text = httpx.get(f"http://127.0.0.1:{8081 + i}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("llamacpp:prompt_cache_hit_tokens_total"):
                hit += float(line.rsplit(" ", 1)[1])
            elif line.startswith("llamacpp:prompt_tokens_total "):
                done += float(line.rsplit(" ", 1)[1])
    return hit, done


def affinity(base: str, args: argparse.Namespace) -> None:
    """Prompt-cache hit rate of multi-turn conversations with and without a session key."""
    for label, sessions in (("with X-Session-Id", True), ("without (round robin)", False)):
        h0, d0 = cache_counts(args.replicas)

        def talk(k: int, sessions: bool = sessions, label: str = label) -> None:
            c = httpx.Client(timeout=args.timeout)
            msgs = [{"role": "system", "content": f"Conversation {k} ({label})."}]
            for turn in range(args.turns):
                msgs.append({"role": "user", "content": f"Tell me fact number {turn}."})
                headers = {"X-Session-Id": f"{label}-{k}"} if sessions else {}
                r = c.post(base + "/v1/chat/completions", headers=headers, json={
                    "messages": msgs, "max_tokens": args.tokens, "temperature": 0})  # fmt: skip
                msgs.append(r.json()["choices"][0]["message"])

        threads = [threading.Thread(target=talk, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        h1, d1 = cache_counts(args.replicas)
        hit, done = h1 - h0, d1 - d0
        print(
            f"  {label:22s} prompt tokens {hit + done:7.0f}, found cached {hit:7.0f}: "
            f"hit rate {hit / max(hit + done, 1):.1%}"
        )


def busy(url: str) -> bool:
    """Whether the replica at ``url`` has a request in a slot."""
    try:
        return any(s["is_processing"] for s in httpx.get(url + "/slots", timeout=2).json())
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=60.0, help="a request this slow is hung")
    ap.add_argument(
        "--affinity",
        action="store_true",
        help="measure the prompt-cache hit rate with and without affinity instead of the fault run",
    )
    ap.add_argument("--turns", type=int, default=6, help="--affinity: turns per conversation")
    args = ap.parse_args()
    if shutil.which("haproxy") is None:
        print("haproxy is not installed (apt-get install haproxy)", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="llamacpy-replicas-"))
    reps = [start_replica(args.model, 8081 + i, tmp / f"r{i}.log") for i in range(args.replicas)]
    hap = None
    try:
        for i in range(args.replicas):
            wait_healthy(f"http://127.0.0.1:{8081 + i}")
        hap_log = open(tmp / "haproxy.log", "w")  # noqa: SIM115  (written until it exits)
        hap = subprocess.Popen(["haproxy", "-f", str(haproxy_config(args.replicas, tmp))],
                               stdout=hap_log, stderr=subprocess.STDOUT)  # fmt: skip
        wait_healthy("http://127.0.0.1:8080", 30)
        base = "http://127.0.0.1:8080"
        if args.affinity:
            affinity(base, args)
            return 0
        t0 = time.monotonic()
        t_kill, t_back = t0 + args.seconds / 3, t0 + 2 * args.seconds / 3
        results: list[tuple[float, str, bool, int]] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            c, j = httpx.Client(), 0
            while time.monotonic() < t0 + args.seconds:
                stream = j % 2 == 1
                session = f"s{k}" if k % 2 == 0 else None
                out, n = one_request(c, base, stream, args.tokens, session, args.timeout)
                with lock:
                    results.append((time.monotonic() - t0, out, stream, n))
                j += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(max(0.0, t_kill - time.monotonic()))
        busy_by = time.monotonic() + 5  # kill it while it works on a request, if it gets one
        while time.monotonic() < busy_by and not busy("http://127.0.0.1:8081"):
            time.sleep(0.01)
        reps[0].send_signal(signal.SIGKILL)
        reps[0].wait()
        print(
            f"t={time.monotonic() - t0:.1f}s: replica 1 killed (SIGKILL), busy: "
            f"{'no' if time.monotonic() >= busy_by else 'yes'}"
        )
        time.sleep(max(0.0, t_back - time.monotonic()))
        reps[0] = start_replica(args.model, 8081, tmp / "r0.log")
        print(f"t={time.monotonic() - t0:.1f}s: replica 1 restarted")
        for t in threads:
            t.join()
        report(results, args.seconds)
        log = (tmp / "haproxy.log").read_text()
        served = collections.Counter(re.findall(r"llamacpy/(r\d+)", log))
        print("  served by: " + ", ".join(f"{k} {v}" for k, v in sorted(served.items())))
        # httplog's "actconn/feconn/beconn/srv_conn/retries" field after the termination
        # state: retries > 0 ("+": redispatched to another server) were sent again
        retried = [m for m in re.findall(r" [A-Za-z-]{4} \d+/\d+/\d+/\d+/(\+?\d+) ", log)
                   if m.lstrip("+") != "0"]  # fmt: skip
        print(f"  requests the balancer retried on another replica: {len(retried)}")
        return 0 if not any(o == "hung" for _, o, _, _ in results) else 1
    finally:
        for p in [*reps, hap]:
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()


def report(results: list[tuple[float, str, bool, int]], seconds: float) -> None:
    phases = (("before", 0, seconds / 3), ("during", seconds / 3, 2 * seconds / 3),
              ("after", 2 * seconds / 3, seconds + 1e9))  # fmt: skip
    total = collections.Counter((o, s) for _, o, s, _ in results)
    print(f"{len(results)} requests: " + ", ".join(
        f"{o} {'streamed' if s else 'whole'} {n}" for (o, s), n in sorted(total.items())))  # fmt: skip
    for name, a, b in phases:
        rows = [r for r in results if a <= r[0] < b]
        toks = sum(n for _, o, _, n in rows if o == "complete")
        span = min(b, seconds) - a
        errs = sum(1 for _, o, _, _ in rows if o != "complete")
        print(
            f"  {name:7s} {len(rows):4d} requests, {errs} not complete, "
            f"{toks / span:7.1f} completed tokens/s"
        )


if __name__ == "__main__":
    raise SystemExit(main())
