#!/usr/bin/env python
"""The engine side by side with llama.cpp, in one run: prefill and decode speed, peak RSS,
time to first token (warm start) and the first-start compile time.

    .venv/bin/python benchmarks/bench_engine.py [-m smollm2-135m] [-p 512] [-n 128] [-t 2]
        [-r 3] [--llama-bin DIR] [--ctx 4096] [--skip-cold]

Speed is measured as ``llama-bench -p 512 -n 128`` does: pp = one batch of ``p`` random
tokens from an empty cache, logits of the last token only; tg = ``n`` single-token decodes
from an empty cache; ``r`` repetitions after a warm-up, mean +- std. Each side runs in its
own process, alternating, so both see the same machine load; the machine is shared, so
look at the ratios and repeat when ``uptime`` shows other load.

Peak RSS and time to first token are whole-process figures of the two command-line tools
on the same prompt and flags: ``llama-completion -c CTX --temp 0 -n 64`` (RSS) and ``-n 1``
(TTFT, best of 3) against ``llamacpy run`` with the same flags; a third row is the engine
API from token ids (no tokenizer, no sampler chain). Before the RSS runs the shared
libraries of both sides and the model are dropped from the page cache (``--page-cache
keep`` skips that): how many pages a process maps from a library depends on the size of the
page-cache folios holding it (a library just written by ``pip install`` sits in large folios
and is mapped in 2 MiB pieces; read back from disk it is mapped in small ones), which
would make the figure depend on the machine's history rather than on the program.
The llama.cpp tools directory comes from ``--llama-bin`` or ``$LLAMA_CPP_BIN``; without the
tools the llama.cpp side is skipped with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_BIN = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
PROMPT = "The history of the city begins with a small settlement on the river, where"

_OURS_SPEED = r"""
import json, sys, time, numpy as np
from llamacpy.engine import Batch, Context, ContextParams
model, p, n, t, r = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ctx = Context(model, ContextParams(n_ctx=max(p, n) + 16, n_batch=max(p, 1), n_threads=t))
rng = np.random.default_rng(0)
toks = rng.integers(0, ctx.n_vocab, p).tolist()
def pp():
    ctx.clear()
    t0 = time.perf_counter(); ctx.decode(Batch.from_tokens(toks)); return p / (time.perf_counter() - t0)
def tg():
    ctx.clear()
    t0 = time.perf_counter()
    for i in range(n):
        ctx.decode(Batch.from_tokens([int(toks[i % p])], pos0=i))
    return n / (time.perf_counter() - t0)
# warm-up as llama-bench: one whole prompt run (pp), one token (tg)
if p:
    ctx.decode(Batch.from_tokens(toks)); ctx.clear()
ctx.decode(Batch.from_tokens(toks[:1])); ctx.clear()
res = {"pp": [pp() for _ in range(r)] if p else [], "tg": [tg() for _ in range(r)] if n else []}
print(json.dumps(res))
"""

_OURS_GEN = r"""
import sys, time
t0 = time.perf_counter()
from llamacpy.engine import Context, ContextParams, generate
model, ctxn, n, prompt_ids = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ctx = Context(model, ContextParams(n_ctx=ctxn, n_threads=int(sys.argv[5])))
out = generate(ctx, [int(x) for x in prompt_ids.split(",")], n)
print(time.perf_counter() - t0)
"""


def _run_rss(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Run and wait with ``wait4`` to read the child's own peak RSS (KiB)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"{cmd[0]} failed: {err.read()[-2000:]}")
        return wall, ru.ru_maxrss, out.read()


def _evict(roots: list[Path]) -> int:
    """Drop the shared libraries under ``roots`` (and model files) from the page cache."""
    n = 0
    for root in roots:
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for f in files:
            if ".so" not in f.name and f.suffix != ".gguf" and f != root:
                continue
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def llama_bench(bin_dir: Path, model: str, a) -> dict[str, list[float]]:
    _, _, out = _run_rss(
        [
            str(bin_dir / "llama-bench"),
            "-m",
            model,
            "-p",
            str(a.p),
            "-n",
            str(a.n),
            "-t",
            str(a.t),
            "-r",
            str(a.r),
            "-o",
            "json",
        ]
    )
    res: dict[str, list[float]] = {"pp": [], "tg": []}
    for row in json.loads(out):
        key = "pp" if row["n_prompt"] else "tg"
        res[key] = row.get("samples_ts") or [row["avg_ts"]]
    return res


def ours_speed(model: str, a) -> dict[str, list[float]]:
    _, _, out = _run_rss(
        [sys.executable, "-c", _OURS_SPEED, model, str(a.p), str(a.n), str(a.t), str(a.r)]
    )
    return json.loads(out.strip().splitlines()[-1])


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):8.1f} +- {sd:5.1f}"


def speed_table(model: str, a, bin_dir: Path | None) -> dict[str, dict[str, float]]:
    """Alternate the two sides ``a.r`` times (one repetition each, so both see the same
    load) and print their pp / tg tokens per second and the ratios (``bin_dir`` None: the
    llama.cpp side is skipped); returns the mean tokens per second per side and kind."""
    speed = {"llama.cpp": {"pp": [], "tg": []}, "llamacpy": {"pp": [], "tg": []}}
    one = argparse.Namespace(**{**vars(a), "r": 1})
    for _ in range(a.r):
        if bin_dir is not None:
            for k, v in llama_bench(bin_dir, model, one).items():
                speed["llama.cpp"][k] += v
        for k, v in ours_speed(model, one).items():
            speed["llamacpy"][k] += v
    print(f"\n{'':10s} {'pp' + str(a.p) + ' t/s':>18s} {'tg' + str(a.n) + ' t/s':>18s}")
    for name, s in speed.items():
        if s["pp"] or s["tg"]:
            print(f"{name:10s} {_fmt(s['pp']):>18s} {_fmt(s['tg']):>18s}")
    if bin_dir is not None:
        for k in ("pp", "tg"):
            r = statistics.mean(speed["llamacpy"][k]) / statistics.mean(speed["llama.cpp"][k])
            print(f"ratio {k}: {r:.2f}x llama.cpp")
    return {n: {k: statistics.mean(v) for k, v in s.items() if v} for n, s in speed.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=4096, help="context for the RSS / TTFT runs")
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN", DEFAULT_BIN))
    ap.add_argument("--skip-cold", action="store_true", help="skip the cold-compile run")
    ap.add_argument(
        "--page-cache",
        choices=("evict", "keep"),
        default="evict",
        help="drop both sides' libraries and the model from the page cache before RSS",
    )
    a = ap.parse_args()

    from llamacpy.registry import resolve_model

    model = str(resolve_model(a.model))
    bin_dir = Path(a.llama_bin)
    have_llama = (bin_dir / "llama-bench").exists()
    if not have_llama:
        print(
            f"llama.cpp tools not found in {bin_dir}: skipping the llama.cpp side "
            "(pass --llama-bin or set LLAMA_CPP_BIN)"
        )
    print(f"model {model}\nthreads {a.t}, load: {os.getloadavg()}")

    speed_table(model, a, bin_dir if have_llama else None)

    # whole-process runs: peak RSS while generating, warm time to first token
    ids = ",".join(str(i) for i in range(100, 116))  # 16 tokens, like the prompt
    api_cmd = [sys.executable, "-c", _OURS_GEN, model, str(a.ctx)]
    flags = ["-m", model, "-p", PROMPT, "-t", str(a.t), "-c", str(a.ctx), "--temp", "0"]
    ours = [sys.executable, "-m", "llamacpy", "run", *flags, "--ignore-eos"]
    if a.page_cache == "evict":
        dropped = _evict([Path(model), bin_dir, Path(sys.prefix), Path(sys.base_prefix) / "lib"])
        print(f"\npage cache: dropped {dropped} library/model files of both sides before RSS")
    rows = []
    if have_llama:
        comp = [str(bin_dir / "llama-completion"), *flags, "-no-cnv", "--no-warmup",
                "--ignore-eos"]  # fmt: skip
        rss_l = _run_rss([*comp, "-n", "64"])[1]
        ttft_l = min(_run_rss([*comp, "-n", "1"])[0] for _ in range(3))
        rows.append(("llama.cpp", rss_l, ttft_l))
    rss_o = _run_rss([*ours, "-n", "64"])[1]
    ttft_o = min(_run_rss([*ours, "-n", "1"])[0] for _ in range(3))
    rows.append(("llamacpy", rss_o, ttft_o))
    rss_a = _run_rss([*api_cmd, "64", ids, str(a.t)])[1]
    ttft_a = min(_run_rss([*api_cmd, "1", ids, str(a.t)])[0] for _ in range(3))
    rows.append(("  (API)", rss_a, ttft_a))
    print(f"\n{'':10s} {'peak RSS (MiB)':>15s} {'TTFT warm (s)':>14s}   (n_ctx {a.ctx})")
    for name, rss, ttft in rows:
        print(f"{name:10s} {rss / 1024:15.1f} {ttft:14.3f}")
    if have_llama:
        print(f"ratio RSS: {rss_o / rss_l:.2f}x, TTFT: {ttft_o / ttft_l:.2f}x llama.cpp "
              f"(API: {rss_a / rss_l:.2f}x, {ttft_a / ttft_l:.2f}x)")  # fmt: skip

    if not a.skip_cold:  # first start: empty kernel cache (numba's NUMBA_CACHE_DIR override)
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache}
            cold = _run_rss([*ours, "-n", "1"], env=env)[0]
            warm = _run_rss([*ours, "-n", "1"], env=env)[0]
        print(
            f"\nfirst start (kernels compiled): {cold:.1f} s; second start (cached): {warm:.2f} s"
        )


if __name__ == "__main__":
    main()
