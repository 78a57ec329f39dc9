"""Throughput benchmarks with ``llama-bench``'s semantics and output formats.

A test is ``pp N`` (decode N random prompt tokens in ``n_batch`` chunks, the first one BOS
when the vocabulary adds it), ``tg N`` (N single-token decodes) or both (``pp+tg``), at a
depth of ``n_depth`` tokens already in the cache (``pp512 @ d4096``: those are decoded
before the timer starts; the cache holding them is kept and restored for later repetitions,
as llama-bench does). Each test gets a fresh context of ``n_prompt + n_gen + n_depth``
cells, one warm-up run (the prompt, or one generated token), then ``reps`` timed
repetitions with the KV cache cleared before each.
Results carry llama-bench's fields (``avg_ns``, ``stddev_ns``, ``avg_ts``, ``stddev_ts``,
``samples_ns``, ...) and print as markdown, CSV, JSON or JSONL.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__
from ..engine import Batch, Context, ContextParams
from ..errors import UsageError

DEFAULTS = {"n_prompt": 512, "n_gen": 128, "n_batch": 2048, "n_ubatch": 512, "type_k": "f16",
            "type_v": "f16", "flash_attn": -1, "reps": 5}  # fmt: skip

FIELDS = (
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
    "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads",
    "cpu_mask", "cpu_strict", "poll", "type_k", "type_v", "n_gpu_layers", "n_cpu_moe",
    "split_mode", "main_gpu", "no_kv_offload", "flash_attn", "devices", "tensor_split",
    "tensor_buft_overrides", "load_mode", "lazy_mode", "embeddings", "no_op_offload",
    "no_host", "repack", "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
)  # fmt: skip
INT_FIELDS = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size",
              "model_n_params", "n_gpu_layers", "main_gpu", "n_prompt", "n_gen", "n_depth",
              "avg_ns", "stddev_ns", "no_op_offload", "n_cpu_moe", "fit_target",
              "fit_min_ctx", "flash_attn"}  # fmt: skip
BOOL_FIELDS = {"no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"}
FLOAT_FIELDS = {"avg_ts", "stddev_ts"}


@dataclass(frozen=True)
class BenchTest:
    n_prompt: int
    n_gen: int
    n_batch: int = 2048
    n_ubatch: int = 512
    n_threads: int = 0
    type_k: str = "f16"
    type_v: str = "f16"
    n_depth: int = 0
    flash_attn: int = -1  # llama-bench's -fa (-1 auto); attention always runs ggml's FA numerics

    @property
    def name(self) -> str:
        if self.n_prompt > 0 and self.n_gen == 0:
            name = f"pp{self.n_prompt}"
        elif self.n_gen > 0 and self.n_prompt == 0:
            name = f"tg{self.n_gen}"
        else:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        return f"{name} @ d{self.n_depth}" if self.n_depth > 0 else name


@dataclass
class BenchResult:
    test: BenchTest
    values: dict[str, Any]  # every field of FIELDS, typed
    samples_ns: list[int] = field(default_factory=list)

    @property
    def samples_ts(self) -> list[float]:
        n = self.test.n_prompt + self.test.n_gen
        return [1e9 * n / t for t in self.samples_ns]


def avg_int(v: Sequence[int]) -> int:
    return sum(v) // len(v) if v else 0


def stdev_int(v: Sequence[int]) -> int:
    """llama-bench's ``stdev<uint64_t>`` (integer arithmetic, then sqrt)."""
    n = len(v)
    if n <= 1:
        return 0
    mean = avg_int(v)
    var = sum(x * x for x in v) // (n - 1) - mean * mean * n // (n - 1)
    return int(math.sqrt(max(var, 0)))


def avg_float(v: Sequence[float]) -> float:
    return sum(v) / len(v) if v else 0.0


def stdev_float(v: Sequence[float]) -> float:
    n = len(v)
    if n <= 1:
        return 0.0
    mean = avg_float(v)
    var = sum(x * x for x in v) / (n - 1) - mean * mean * n / (n - 1)
    return math.sqrt(var) if var > 0 else 0.0


def cpu_info() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def expand_tests(n_prompt: Sequence[int], n_gen: Sequence[int], pg: Sequence[tuple[int, int]],
                 n_batch: Sequence[int], n_ubatch: Sequence[int], n_threads: Sequence[int],
                 type_k: Sequence[str], type_v: Sequence[str], n_depth: Sequence[int] = (0,),
                 flash_attn: Sequence[int] = (-1,)) -> list[BenchTest]:  # fmt: skip
    """llama-bench's instance order: parameters outer (batch, ubatch, cache types, flash
    attention, threads, depth), then pp tests, tg tests, pg pairs."""
    out = []
    for nb, nub, tk, tv, fa, nt, nd in itertools.product(
        n_batch, n_ubatch, type_k, type_v, flash_attn, n_threads, n_depth
    ):
        common = dict(n_batch=nb, n_ubatch=nub, n_threads=nt, type_k=tk, type_v=tv,
                      n_depth=nd, flash_attn=fa)  # fmt: skip
        out += [BenchTest(p, 0, **common) for p in n_prompt if p > 0]
        out += [BenchTest(0, g, **common) for g in n_gen if g > 0]
        out += [BenchTest(p, g, **common) for p, g in pg if p or g]
    return out


class Bench:
    """Runs :class:`BenchTest`s on one model (loaded once, a new context per test)."""

    def __init__(self, model_path: str, *, use_mmap: bool = True,
                 progress: Callable[[str], None] | None = None, seed: int = 0) -> None:  # fmt: skip
        from ..api.model import ModelInfo

        self.info, self.tokenizer = ModelInfo.read(model_path)
        self.use_mmap = use_mmap
        self.progress = progress or (lambda msg: None)
        self.rng = np.random.default_rng(seed)
        self._model: Any = None
        self._depth: tuple[tuple, dict] | None = None  # (context key, cache state at depth)

    def _context(self, t: BenchTest) -> Context:
        params = ContextParams(n_ctx=t.n_prompt + t.n_gen + t.n_depth, n_batch=t.n_batch,
                               n_ubatch=t.n_ubatch, n_threads=t.n_threads,
                               n_threads_batch=t.n_threads, type_k=t.type_k, type_v=t.type_v,
                               use_mmap=self.use_mmap)  # fmt: skip
        ctx = Context(self.info.path, params, model=self._model)
        self._model = ctx.model
        return ctx

    def _prompt(self, ctx: Context, n_prompt: int, n_batch: int) -> None:
        """``n_prompt`` random tokens after what the cache holds (llama-bench's test_prompt:
        the first one BOS when the vocabulary adds it)."""
        n_vocab, tok = ctx.n_vocab, self.tokenizer
        pos0 = ctx.kv.seq_pos_max(0) + 1
        done = 0
        while done < n_prompt:
            n = min(n_prompt - done, n_batch)
            ids = self.rng.integers(0, n_vocab, n).tolist()
            if done == 0 and tok.add_bos:
                ids[0] = tok.bos
            ctx.decode(Batch.from_tokens(ids, pos0=pos0 + done))
            done += n

    def _fill_depth(self, ctx: Context, t: BenchTest) -> None:
        """Put ``t.n_depth`` tokens in the (cleared) cache: decoded the first time, restored
        from the kept state afterwards (llama-bench keeps one depth state)."""
        key = (t.n_depth, t.n_batch, t.n_ubatch, t.type_k, t.type_v, ctx.n_ctx)
        if self._depth is not None and self._depth[0] == key:
            self.progress(f"{t.name}: depth run (cached)")
            ctx.kv.set_state(self._depth[1])
            return
        self.progress(f"{t.name}: depth run")
        self._prompt(ctx, t.n_depth, ctx.n_batch)
        self._depth = (key, ctx.kv.get_state())

    def _gen(self, ctx: Context, n_gen: int) -> None:
        tok = self.tokenizer
        token = tok.bos if tok.add_bos else int(self.rng.integers(0, ctx.n_vocab))
        pos = ctx.kv.seq_pos_max(0) + 1
        for _ in range(n_gen):
            ctx.decode(Batch().add(token, pos, 0, True))
            pos += 1
            token = int(self.rng.integers(0, ctx.n_vocab))

    def run(self, t: BenchTest, reps: int = 5, warmup: bool = True) -> BenchResult:
        if t.n_prompt < 0 or t.n_gen < 0 or t.n_prompt + t.n_gen == 0:
            raise UsageError(f"invalid test {t.name}: token counts must be positive")
        ctx = self._context(t)
        n_batch = ctx.n_batch
        ctx.clear()
        if warmup:
            if t.n_prompt > 0:
                self.progress(f"{t.name}: warmup prompt run")
                self._prompt(ctx, t.n_prompt, n_batch)
            if t.n_gen > 0:
                self.progress(f"{t.name}: warmup generation run")
                self._gen(ctx, 1)
        samples = []
        for i in range(reps):
            ctx.clear()
            if t.n_depth > 0:
                self._fill_depth(ctx, t)
            t0 = time.perf_counter_ns()
            if t.n_prompt > 0:
                self.progress(f"{t.name}: prompt run {i + 1}/{reps}")
                self._prompt(ctx, t.n_prompt, n_batch)
            if t.n_gen > 0:
                self.progress(f"{t.name}: generation run {i + 1}/{reps}")
                self._gen(ctx, t.n_gen)
            samples.append(time.perf_counter_ns() - t0)
        return BenchResult(t, self._values(t, ctx, samples), samples)

    def _values(self, t: BenchTest, ctx: Context, samples: list[int]) -> dict[str, Any]:
        n = t.n_prompt + t.n_gen
        ts = [1e9 * n / s for s in samples]
        return {
            "build_commit": f"llamacpy-{__version__}", "build_number": 0,
            "cpu_info": cpu_info(), "gpu_info": "", "backends": "CPU",
            "model_filename": str(self.info.path), "model_type": self.info.desc,
            "model_size": self.info.size, "model_n_params": self.info.n_params,
            "n_batch": t.n_batch, "n_ubatch": t.n_ubatch, "n_threads": ctx.n_threads,
            "cpu_mask": "0x0", "cpu_strict": False, "poll": 50,
            "type_k": t.type_k, "type_v": t.type_v, "n_gpu_layers": 0, "n_cpu_moe": 0,
            "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False,
            "flash_attn": t.flash_attn,
            "devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none",
            "load_mode": "mmap" if self.use_mmap else "none", "lazy_mode": "auto",
            "embeddings": False, "no_op_offload": 0, "no_host": False, "repack": True,
            "fit_target": 0, "fit_min_ctx": 0,
            "n_prompt": t.n_prompt, "n_gen": t.n_gen, "n_depth": t.n_depth,
            "test_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "avg_ns": avg_int(samples), "stddev_ns": stdev_int(samples),
            "avg_ts": avg_float(ts), "stddev_ts": stdev_float(ts),
        }  # fmt: skip


# --------------------------------------------------------------------------- printers
def _str(name: str, v: Any) -> str:
    """A value as llama-bench's ``get_values`` strings it."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if name in FLOAT_FIELDS:
        return f"{v:f}"
    return str(v)


def _json_value(name: str, v: Any) -> str:
    if name in BOOL_FIELDS:
        return "true" if v else "false"
    if name in INT_FIELDS or name in FLOAT_FIELDS:
        return _str(name, v)
    return json.dumps(_str(name, v), ensure_ascii=False)


def format_csv_header() -> str:
    return ",".join(FIELDS)


def format_csv(r: BenchResult) -> str:
    return ",".join('"' + _str(f, r.values[f]).replace('"', '""') + '"' for f in FIELDS)


def _samples(r: BenchResult) -> tuple[str, str]:
    return (", ".join(str(s) for s in r.samples_ns),
            ", ".join(f"{t:g}" for t in r.samples_ts))  # fmt: skip


def format_json(results: Sequence[BenchResult]) -> str:
    items = []
    for r in results:
        lines = [f'    "{f}": {_json_value(f, r.values[f])},' for f in FIELDS]
        ns, ts = _samples(r)
        lines += [f'    "samples_ns": [ {ns} ],', f'    "samples_ts": [ {ts} ]']
        items.append("  {\n" + "\n".join(lines) + "\n  }")
    return "[\n" + ",\n".join(items) + "\n]"


def format_jsonl(r: BenchResult) -> str:
    body = "".join(f'"{f}": {_json_value(f, r.values[f])}, ' for f in FIELDS)
    ns, ts = _samples(r)
    return "{" + body + f'"samples_ns": [ {ns} ],"samples_ts": [ {ts} ]' + "}"


_MD_NAMES = {"n_threads": "threads", "type_k": "type_k", "type_v": "type_v", "flash_attn": "fa"}
_MD_WIDTH = {"model": -30, "t/s": 20, "size": 10, "params": 10, "n_threads": 7,
             "n_batch": 7, "n_ubatch": 8, "type_k": 6, "type_v": 6, "flash_attn": 3,
             "test": 15}  # fmt: skip


def md_fields(tests: Sequence[BenchTest]) -> list[str]:
    """Columns llama-bench shows: the fixed ones plus parameters that differ from defaults."""
    fields = ["model", "size", "params", "backend", "n_threads"]
    for name in ("n_batch", "n_ubatch", "type_k", "type_v", "flash_attn"):
        vals = {getattr(t, name) for t in tests}
        if len(vals) > 1 or vals != {DEFAULTS[name]}:
            fields.append(name)
    return [*fields, "test", "t/s"]


def _md_width(f: str) -> int:
    if f in _MD_WIDTH:
        return _MD_WIDTH[f]
    w = max(len(f), 10)
    return w if f in INT_FIELDS or f in FLOAT_FIELDS or f in BOOL_FIELDS else -w


def _cell(text: str, width: int) -> str:
    return f" {text:>{width}} |" if width > 0 else f" {text:<{-width}} |"


def format_md_header(fields: Sequence[str]) -> str:
    head = "|" + "".join(_cell(_MD_NAMES.get(f, f), _md_width(f)) for f in fields)
    rule = "|" + "".join(
        " " + "-" * (abs(_md_width(f)) - 1) + (":" if _md_width(f) > 0 else "-") + " |"
        for f in fields
    )
    return head + "\n" + rule


def format_md_row(fields: Sequence[str], r: BenchResult) -> str:
    v = r.values
    out = "|"
    for f in fields:
        if f == "model":
            text = v["model_type"]
        elif f == "size":
            size = v["model_size"]
            text = f"{size / 1024**2:.2f} MiB" if size < 1024**3 else f"{size / 1024**3:.2f} GiB"
        elif f == "params":
            n = v["model_n_params"]
            text = f"{n / 1e6:.2f} M" if n < 1e9 else f"{n / 1e9:.2f} B"
        elif f == "backend":
            text = v["backends"]
        elif f == "test":
            text = r.test.name
        elif f == "t/s":
            text = f"{v['avg_ts']:.2f} ± {v['stddev_ts']:.2f}"
        else:
            text = _str(f, v[f])
        out += _cell(text, _md_width(f))
    return out
