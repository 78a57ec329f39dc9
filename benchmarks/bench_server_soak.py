"""Soak test of ``llamacpy serve`` on loopback: a steady load for a given duration, checking
that the server's memory does not grow and that no slot is leaked.

Starts the server as a subprocess with ``-np P`` and keeps P + 1 clients busy (one more than
the slots, so the queue is used too) with a mix of streamed and non-streamed completions and
chat completions of varied lengths, some streams closed by the client halfway. After a
warm-up at the same load, RssAnon of the server process (``/proc/PID/status``) is sampled at
the start, every minute and at the end; afterwards ``/slots`` must be all idle and
``/health`` must answer. Prints the growth in percent from the start and from minute 2 (the
plateau: the first minutes fill caches, arenas and the kernel registry); exits 1 if the growth
from minute 2 is 2% or more (5% from the start on runs too short to have a minute 2), if a
request failed, or if a slot is still busy.

    .venv/bin/python benchmarks/bench_server_soak.py [--duration 600] [-m smollm2-135m]
        [-np 4] [-c 2048] [-t 2] [--warmup 30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import subprocess
import sys
import time

import httpx

from _server_common import PROMPTS, free_port, rss_anon_kib, wait_healthy

MAX_GROWTH = 5.0  # percent, from the start of the measured load
MAX_PLATEAU_GROWTH = 2.0  # percent, from minute 2 to the end
PLATEAU_FROM = 120.0  # seconds


async def one_request(client: httpx.AsyncClient, rng: random.Random, stats: dict) -> None:
    """One request of a random kind; counts it in ``stats``."""
    prompt = rng.choice(PROMPTS)
    n = rng.randint(8, 64)
    chat = rng.random() < 0.5
    stream = rng.random() < 0.75
    abort = stream and rng.random() < 0.15
    if chat:
        url, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]}
    else:
        url, body = "/v1/completions", {"prompt": prompt}
    body.update({"model": "m", "max_tokens": n, "temperature": rng.choice([0.0, 0.8]),
                 "seed": rng.randint(0, 1 << 30), "stream": stream})  # fmt: skip
    if not stream:
        r = await client.post(url, json=body)
        stats[r.status_code] = stats.get(r.status_code, 0) + 1
        return
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            stats[r.status_code] = stats.get(r.status_code, 0) + 1
            return
        done, chunks = False, 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            if "error" in json.loads(line[6:]):
                stats["stream_error"] = stats.get("stream_error", 0) + 1
            chunks += 1
            if abort and chunks >= 3:
                break  # closing the stream early cancels the request on the server
        if abort:
            stats["aborted"] = stats.get("aborted", 0) + 1
        elif done:
            stats[200] = stats.get(200, 0) + 1
        else:
            stats["incomplete"] = stats.get("incomplete", 0) + 1


async def steady_load(base: str, clients: int, seconds: float, seed: int, stats: dict) -> None:
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=300) as client:
        end = time.monotonic() + seconds

        async def worker(c: int) -> None:
            rng = random.Random(seed * 1000 + c)
            while time.monotonic() < end:
                try:
                    await one_request(client, rng, stats)
                except httpx.HTTPError as e:
                    stats[type(e).__name__] = stats.get(type(e).__name__, 0) + 1

        await asyncio.gather(*(worker(c) for c in range(clients)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of measured load")
    ap.add_argument("--warmup", type=float, default=30.0, help="seconds of load before")
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("-c", "--ctx-size", type=int, default=2048)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "llamacpy", "serve", "-m", args.model, "--port", str(port),
           "-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    clients = args.parallel + 1
    stats: dict = {}
    samples: list[tuple[float, int]] = []
    try:
        if not wait_healthy(proc, base):
            print("the server did not come up", file=sys.stderr)
            return 1
        asyncio.run(steady_load(base, clients, args.warmup, args.seed, {}))

        async def measured() -> None:
            t0 = time.monotonic()
            samples.append((0.0, rss_anon_kib(proc.pid)))
            load = asyncio.create_task(
                steady_load(base, clients, args.duration, args.seed + 1, stats)
            )
            while not load.done():
                await asyncio.wait({load}, timeout=60)
                samples.append((time.monotonic() - t0, rss_anon_kib(proc.pid)))
            await load

        asyncio.run(measured())
        time.sleep(1.0)  # let the last cancelled requests be reaped
        slots = httpx.get(base + "/slots", timeout=10).json()
        busy = [s.get("id") for s in slots if s.get("is_processing")]
        health = httpx.get(base + "/health", timeout=10).status_code
        samples.append((samples[-1][0] + 1.0, rss_anon_kib(proc.pid)))
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            proc.kill()

    start, end = samples[0][1], samples[-1][1]
    growth = 100.0 * (end - start) / start
    later = [kib for t, kib in samples if t >= PLATEAU_FROM - 5.0]
    plateau = 100.0 * (end - later[0]) / later[0] if len(later) >= 2 else None
    ok = stats.get(200, 0)
    failed = {k: v for k, v in stats.items() if k not in (200, "aborted")}
    print(
        f"server soak: {args.duration:.0f} s steady load after {args.warmup:.0f} s warm-up, "
        f"{clients} clients vs -np {args.parallel}, -c {args.ctx_size}, -t {args.threads}"
    )
    n_all = sum(v for v in stats.values())
    print(
        f"  requests: {n_all} ({n_all / args.duration:.1f}/s); complete: {ok}, "
        f"closed early by the client: {stats.get('aborted', 0)}"
    )
    print(f"  failed or other answers: {failed or 'none'}")
    print("  RssAnon (MiB) at " + ", ".join(f"{t:.0f}s {kib / 1024:.1f}" for t, kib in samples))
    print(f"  RssAnon growth from the start: {growth:+.2f}%")
    if plateau is None:
        grown = growth >= MAX_GROWTH
        print(
            f"  (no minute-2 sample: the run is too short; limit {MAX_GROWTH:.0f}% from the start)"
        )
    else:
        grown = plateau >= MAX_PLATEAU_GROWTH
        print(
            f"  RssAnon growth from minute 2 to the end: {plateau:+.2f}% "
            f"(limit {MAX_PLATEAU_GROWTH:.0f}%)"
        )
    print(f"  slots idle afterwards: {not busy} (busy: {busy}); /health {health}")
    return 0 if not grown and not failed and not busy and health == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
