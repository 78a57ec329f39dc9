"""Aggregate generated tokens/s of ``llamacpy serve`` and llama.cpp's ``llama-server``, side
by side, with P parallel streaming clients (default 4 and 8) on loopback.

For each P, both servers are started with the same model, ``-np P``, ``-c`` (total context,
shared by the slots on both sides) and ``-t``; then R rounds run, alternating which side goes
first. A round is P clients each streaming one ``/v1/completions`` request of N tokens
(greedy, ``ignore_eos``) at the same time; its figure is all generated tokens over the
round's wall time; the server's CPU time over the round gives the cores it used. Prints the per-side median, best and the ratio (ours / llama-server).
Give ``-t`` no more threads than there are idle cores: llama-server's thread pool spins at
its barriers, so on an oversubscribed machine it stalls and the comparison means nothing.

    .venv/bin/python benchmarks/bench_server_throughput.py [-m PATH] [-p 4 8] [-r 3]
        [-n 64] [-c 2048] [-t 1] [--llama-server PATH] [--variant NAME=FLAGS]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from _server_common import PROMPTS, free_port

MODEL = Path.home() / ".cache/llamacpy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_SERVER = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server")


def start(cmd: list[str], base: str, what: str, env: dict | None = None) -> subprocess.Popen:
    """Start a server and wait (up to 180 s) until ``/health`` answers 200."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 180
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=2).status_code == 200:
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"{what} did not come up: {' '.join(cmd)}")
        time.sleep(0.2)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, from ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def stream_one(client: httpx.AsyncClient, prompt: str, n: int) -> int:
    """Stream one completion; return its generated token count."""
    body = {"model": "m", "prompt": prompt, "max_tokens": n, "n_predict": n, "temperature": 0,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    chunks, usage = 0, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"].get("completion_tokens")
            if any(ch.get("text") for ch in ev.get("choices", [])):
                chunks += 1
    return usage if usage is not None else chunks


async def round_(base: str, parallel: int, n: int, offset: int) -> tuple[int, float]:
    """P concurrent streamed requests; return (tokens, wall seconds)."""
    limits = httpx.Limits(max_connections=parallel + 4)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=600) as client:
        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *(stream_one(client, PROMPTS[(offset + i) % len(PROMPTS)], n) for i in range(parallel))
        )
        return sum(counts), time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default=str(MODEL), help="GGUF path")
    ap.add_argument("-p", "--parallel", type=int, nargs="+", default=[4, 8])
    ap.add_argument("-r", "--rounds", type=int, default=3)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-c", "--ctx-size", type=int, default=2048, help="total context")
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER))
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="also serve with extra flags, e.g. spec='--spec-type ngram-simple'; "
                    "repeatable")  # fmt: skip
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=SRC",
                    help="also serve from another tree's src folder (PYTHONPATH), e.g. "
                    "before=/tmp/before/src; repeatable")  # fmt: skip
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    have_llama = Path(args.llama_server).exists()
    if not have_llama:
        print(f"  {args.llama_server} not found: llamacpy sides only")

    print(
        f"server throughput: {args.n_predict} tokens per streamed request, {args.rounds} rounds, "
        f"-c {args.ctx_size}, -t {args.threads}, model {Path(args.model).name}"
    )
    print(f"  load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}", flush=True)
    worst = None
    for p in args.parallel:
        common = ["-m", args.model, "--host", "127.0.0.1", "-np", str(p),
                  "-c", str(args.ctx_size), "-t", str(args.threads)]  # fmt: skip
        ours = [sys.executable, "-m", "llamacpy", "serve", *common]
        sides: dict[str, tuple[list[str], dict | None]] = {"llamacpy": (ours, None)}
        for name, src in trees.items():
            sides[name] = (ours, {**os.environ, "PYTHONPATH": src})
        for name, flags in (v.split("=", 1) for v in args.variant):
            sides[name] = ([*ours, *shlex.split(flags)], None)
        if have_llama:
            sides["llama-server"] = ([args.llama_server, *common], None)
        bases, procs = {}, {}
        try:
            for name, (cmd, env) in sides.items():
                port = free_port()
                bases[name] = f"http://127.0.0.1:{port}"
                procs[name] = start([*cmd, "--port", str(port)], bases[name], name, env)
            for name in sides:  # warm-up: one request alone, then one full round
                asyncio.run(round_(bases[name], 1, 8, 0))
                asyncio.run(round_(bases[name], p, 8, 0))
            rates: dict[str, list[float]] = {name: [] for name in sides}
            cores: dict[str, list[float]] = {name: [] for name in sides}
            order = list(sides)
            for k in range(args.rounds):
                for name in order if k % 2 == 0 else order[::-1]:
                    cpu0 = cpu_seconds(procs[name].pid)
                    tokens, wall = asyncio.run(round_(bases[name], p, args.n_predict, k))
                    cores[name].append((cpu_seconds(procs[name].pid) - cpu0) / wall)
                    if tokens != p * args.n_predict:
                        print(f"  note: {name} generated {tokens} tokens, not {p * args.n_predict}")
                    rates[name].append(tokens / wall)
                    print(
                        f"    -np {p} round {k + 1} {name}: {tokens / wall:.1f} tok/s", flush=True
                    )
        finally:
            for proc in procs.values():
                stop(proc)
        med = {name: statistics.median(v) for name, v in rates.items()}
        ref = "llama-server" if have_llama else "llamacpy"
        ratio = med["llamacpy"] / med[ref]
        worst = ratio if worst is None else min(worst, ratio)
        print(f"  {p} parallel streams (-np {p}):")
        for name, v in rates.items():
            rounds = " ".join(f"{x:.1f}" for x in v)
            print(
                f"    {name:13s} median {med[name]:7.1f} tok/s  best {max(v):7.1f}  ({rounds}); "
                f"{statistics.mean(cores[name]):.2f} cores used"
            )
        for name in sides:
            if name != ref:
                print(f"    ratio {name} / {ref}: {med[name] / med[ref]:.2f}x")
    print(f"  load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
