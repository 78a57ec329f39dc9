"""Time to first token of a long prompt: read from scratch vs restored from a slot file.

Starts ``llamacpy serve --slot-save-path DIR`` on loopback, sends a long prompt with
``n_predict`` 1 (the prefill) and saves the slot; then starts a second server process (a
restart), restores the file and sends the same request again. Prints the wall time of each
step, best of ``--rounds``.

    .venv/bin/python benchmarks/bench_slot_restore.py [-m smollm2-135m] [-t 2] [--words 1200]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from _server_common import free_port, wait_healthy


def _server(model: str, threads: int, ctx: int, slot_dir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "llamacpy", "serve", "-m", model, "--port", str(port), "-np",
           "1", "-c", str(ctx), "-t", str(threads), "--slot-save-path", slot_dir]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    if not wait_healthy(proc, base):
        proc.kill()
        raise SystemExit("the server did not come up")
    return proc, base


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("--words", type=int, default=1200, help="words in the prompt")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    prompt = " ".join(words[i % len(words)] for i in range(a.words))
    body = {"prompt": prompt, "n_predict": 1, "id_slot": 0, "temperature": 0}
    rows: dict[str, list[float]] = {"prefill": [], "save": [], "restore": [], "after restore": []}
    n_prompt = 0
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.rounds):
            for phase in ("first", "restart"):
                proc, base = _server(a.model, a.threads, a.ctx_size, d)
                try:
                    with httpx.Client(base_url=base, timeout=600) as http:
                        http.post("/completion", json={"prompt": "hi", "n_predict": 1,
                                                       "id_slot": 0})  # fmt: skip
                        http.post("/slots/0?action=erase")
                        t0 = time.perf_counter()
                        if phase == "first":
                            r = http.post("/completion", json=body).json()
                            rows["prefill"].append(time.perf_counter() - t0)
                            n_prompt = r["tokens_evaluated"]
                            t0 = time.perf_counter()
                            http.post("/slots/0?action=save", json={"filename": "s.bin"})
                            rows["save"].append(time.perf_counter() - t0)
                        else:
                            http.post("/slots/0?action=restore", json={"filename": "s.bin"})
                            t1 = time.perf_counter()
                            r = http.post("/completion", json=body).json()
                            t2 = time.perf_counter()
                            assert r["timings"]["cache_n"] == n_prompt - 1, r["timings"]
                            rows["restore"].append(t1 - t0)
                            rows["after restore"].append(t2 - t1)
                finally:
                    proc.terminate()
                    proc.wait(30)
        size = (Path(d) / "s.bin").stat().st_size
    best = {k: min(v) for k, v in rows.items()}
    print(
        f"{a.model}: prompt of {n_prompt} tokens, -t {a.threads}, slot file {size / 2**20:.1f} MiB"
    )
    for k, v in best.items():
        print(f"  {k:14s} {1000 * v:9.1f} ms")
    ttft_restored = best["restore"] + best["after restore"]
    print(f"  time to first token: prefill {1000 * best['prefill']:.0f} ms, restore + request "
          f"{1000 * ttft_restored:.0f} ms ({best['prefill'] / ttft_restored:.1f}x faster)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
