"""Importance matrices as ``llama-imatrix`` computes them.

The text is tokenized once (BOS per the vocabulary; special tokens parsed with
``parse_special``) and cut into chunks of ``n_ctx`` tokens, evaluated as llama-perplexity
evaluates them (``eval.perplexity.eval_chunks``: ``n_batch // n_ctx`` chunks side by side,
the first token of each replaced by BOS). llama-imatrix asks for every token's logits, so its
last layer runs every row: the collecting forward's last layer does too (it has no
``out_rows``), and only the logits that are scored are computed (all of them with
``--process-output``, whose matrix then sees every row, as llama-imatrix's). The model's collecting forward
(``models.imatrix``) adds the squares of each matmul input to per-matrix sums; the
perplexity of each chunk's second half is reported along the way (``[1]x,[2]y,...``).

:class:`ImatrixStats` holds what a GGUF imatrix file holds (raw sums and counts per
matrix), is combined with earlier files (``--in-file``) and written by
``quantize.imatrix.save_imatrix``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ModelError, UsageError
from .perplexity import (
    FirstPass,
    NllTally,
    chunk_batch,
    chunk_count,
    chunk_nll,
    eval_chunks,
    n_seq_for,
)

_BLK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
OUTPUT = "output.weight"


@dataclass
class ImatrixStats:
    """Raw statistics per matrix: ``sums[name]`` float32 ``[n_mat, n]`` (squares of the
    inputs summed), ``counts[name]`` int64 ``[n_mat]`` (rows summed), the datasets and the
    chunks they came from."""

    sums: dict[str, np.ndarray] = field(default_factory=dict)
    counts: dict[str, np.ndarray] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)

    def add(self, name: str, sums: np.ndarray, counts: np.ndarray) -> None:
        """Add one matrix's sums and counts (a file's, or a run's) to these."""
        sums = np.asarray(sums, np.float32).reshape(len(counts), -1)
        counts = np.asarray(counts, np.int64)
        have = self.sums.get(name)
        if have is None:
            self.sums[name], self.counts[name] = sums.copy(), counts.copy()
            return
        if have.shape[1] != sums.shape[1]:
            raise UsageError(
                f"imatrix entry {name!r}: {sums.shape[1]} values per matrix where earlier "
                f"data has {have.shape[1]}"
            )
        if have.shape[0] != sums.shape[0]:
            if have.shape[0] == 1 and np.all(self.counts[name] == self.counts[name][0]):
                have = np.repeat(have, sums.shape[0], 0)
                self.counts[name] = np.repeat(self.counts[name], sums.shape[0])
            elif sums.shape[0] == 1:
                sums, counts = np.repeat(sums, have.shape[0], 0), np.repeat(counts, have.shape[0])
            else:
                raise UsageError(
                    f"imatrix entry {name!r}: {sums.shape[0]} matrices where earlier data "
                    f"has {have.shape[0]}"
                )
        self.sums[name] = have + sums
        self.counts[name] = self.counts[name] + counts

    def chunk_count(self, chunk_size: int) -> int:
        """Chunks the statistics amount to (llama-imatrix's: the largest count over the
        chunk size)."""
        m = max((int(c.max()) for c in self.counts.values() if c.size), default=0)
        return m // max(1, chunk_size)


def collect_imatrix(model: Any) -> Any:
    """The model's :class:`~llamacpy.models.imatrix.ImatrixSums`, its collecting forward
    switched on at the first call (:class:`ModelError` for a model it cannot collect)."""
    if getattr(model, "imatrix", None) is not None:
        return model.imatrix
    if not hasattr(model, "collect_imatrix"):
        arch = getattr(model, "arch", "") or type(model).__name__
        raise ModelError(f"imatrix: the {arch} architecture has no decoder to collect from")
    return model.collect_imatrix()


def matrix_rows(
    shapes: Mapping[str, tuple[int, ...]], n_layer: int, process_output: bool
) -> dict[str, tuple[int, int, int]]:
    """name -> (layer, slot, input width) for the model's matrices the collecting forward
    sums the inputs of (``shapes``: every tensor's shape in ggml order, ``ne[0]`` first)."""
    from ..models.imatrix import EXPERT_TENSORS, SLOT_TENSORS

    slot_of = {t: s for s, names in SLOT_TENSORS.items() for t in names}
    out = {}
    for name, shape in shapes.items():
        m = _BLK.fullmatch(name)
        if not m or int(m.group(1)) >= n_layer:
            continue
        kind = m.group(2)
        if len(shape) == 2 and kind in slot_of:
            out[name] = (int(m.group(1)), slot_of[kind], int(shape[0]))
        elif len(shape) == 3 and kind in EXPERT_TENSORS:  # (slot -1 - part: expert rows)
            out[name] = (int(m.group(1)), -1 - EXPERT_TENSORS[kind], int(shape[0]))
    if process_output and OUTPUT in shapes:
        out[OUTPUT] = (n_layer, 0, int(shapes[OUTPUT][0]))
    return out


@dataclass
class ImatrixRun:
    ppl: float | None
    ppl_err: float | None
    n_chunks: int
    seconds_per_pass: float = 0.0


def compute_imatrix(
    ctx: Any,
    tokenizer: Any,
    text: str | bytes,
    shapes: Mapping[str, tuple[int, ...]],
    stats: ImatrixStats,
    *,
    n_ctx: int,
    n_batch: int,
    n_chunks: int = -1,
    skip_chunks: int = 0,
    parse_special: bool = False,
    compute_ppl: bool = True,
    process_output: bool = False,
    on_chunk: Callable[[int, float | None], None] | None = None,
    on_first_pass: Callable[[float, int, int], None] | None = None,
    on_save: Callable[[int], None] | None = None,
) -> ImatrixRun:
    """Run llama-imatrix's collection over ``text`` with an engine context sized for
    ``n_batch // n_ctx`` chunks side by side; the sums are added to ``stats``.

    ``on_chunk(i, running_ppl)`` after each chunk (``None`` without ``compute_ppl``);
    ``on_save(chunks)`` whenever the statistics have grown by whole chunks (the caller
    decides whether to write them)."""
    if n_ctx <= 0:
        raise UsageError("imatrix needs -c/--ctx-size > 0")
    n_batch = chunk_batch(ctx, n_ctx, n_batch)
    model = ctx.model
    hp = model.hparams
    rows = matrix_rows(shapes, hp.n_layer, process_output)
    im = collect_imatrix(model)  # (ModelError before any compute)
    tokens = np.asarray(
        tokenizer.encode(text, add_special=True, parse_special=parse_special), np.int64
    )
    if skip_chunks > 0:
        if (skip_chunks + 2) * n_ctx >= len(tokens):
            raise UsageError(
                f"there will be not enough tokens left after removing {skip_chunks} chunks"
            )
        tokens = tokens[skip_chunks * n_ctx :]
    if len(tokens) < 2 * n_ctx:
        raise UsageError(
            f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; the "
            f"text tokenizes to only {len(tokens)} tokens"
        )
    n_seq = n_seq_for(n_ctx, n_batch)
    n_chunk = chunk_count(len(tokens), n_ctx, n_chunks)
    base_sums = {k: (v.copy(), stats.counts[k].copy()) for k, v in stats.sums.items()}
    first = n_ctx // 2
    tally = NllTally()
    first_pass = FirstPass(on_first_pass)

    def refresh() -> None:
        _fold(stats, base_sums, im, rows)

    bos = tokenizer.bos if tokenizer.add_bos else None
    done = 0
    for c, logits in eval_chunks(ctx, tokens, n_ctx=n_ctx, n_batch=n_batch, n_seq=n_seq,
                                 n_chunk=n_chunk, bos=bos, on_first_pass=first_pass,
                                 outputs="all" if process_output else "scored"):  # fmt: skip
        ppl = None
        if compute_ppl:
            base = c * n_ctx + first
            ppl = tally.add(chunk_nll(logits, tokens[base + 1 : base + n_ctx - first]))
        if on_chunk is not None:
            on_chunk(c + 1, ppl)
        if on_save is not None and ((c + 1) % n_seq == 0 or c + 1 == n_chunk):
            refresh()  # (after each pass)
            total = stats.chunk_count(n_ctx)
            if total > done:
                on_save(total)
            done = total
    refresh()
    if not compute_ppl or tally.count == 0:
        return ImatrixRun(None, None, n_chunk, first_pass.seconds)
    return ImatrixRun(*tally.estimate(), n_chunk, first_pass.seconds)


def _fold(stats: ImatrixStats, base: dict, im: Any, rows: dict) -> None:
    """``stats`` = what it held before the run + the model's sums so far."""
    from ..models.imatrix import ImatrixSums

    assert isinstance(im, ImatrixSums)
    for name, (layer, slot, k) in rows.items():
        if slot < 0:  # experts: a row of sums and a count each
            sums, counts = im.expert_rows(layer, -1 - slot)
            sums = sums[:, :k]
        else:
            r = im.row(layer, slot)
            sums, counts = im.sums[r, :k][None, :], np.array([im.counts[r]], np.int64)
        if not counts.any():
            continue
        stats.sums.pop(name, None)
        stats.counts.pop(name, None)
        if name in base:
            stats.sums[name], stats.counts[name] = base[name][0].copy(), base[name][1].copy()
        stats.add(name, sums, counts)


def _f32_sum(a: np.ndarray) -> np.float32:
    """A float32 sum in order (``std::accumulate`` with a float start)."""
    return np.cumsum(a, dtype=np.float32)[-1] if len(a) else np.float32(0)


def _tensor_stats(name: str, sums: np.ndarray, counts: np.ndarray) -> dict | None:
    """llama-imatrix's statistics of one entry (float32 throughout, as its code)."""
    rows = [sums[i] / np.float32(c) for i, c in enumerate(counts.tolist()) if c != 0]
    if not rows:
        return None
    act = np.concatenate(rows).astype(np.float32)
    n = np.float32(len(act))
    total = _f32_sum(act)
    mean = np.float32(total / n)
    var = np.float32(_f32_sum(act * act) / n) - np.float32(mean * mean)
    dev = np.float32(np.sqrt(max(np.float32(0), var)))
    active = np.float32(1) - np.float32(np.count_nonzero(np.abs(act) <= np.float32(1e-5))) / n
    entropy = np.float32(0)
    if total > 0:
        p = (act / total).astype(np.float32)
        p = p[p > 0]
        # entropy -= p * log2f(p) in order (log2 correctly rounded to float32)
        lg = np.log2(p.astype(np.float64)).astype(np.float32)
        entropy = -_f32_sum((p * lg).astype(np.float32))
    zd = 0
    if dev > 0:
        zd = int(np.count_nonzero(((act - mean) / dev).astype(np.float32) > 1))
    m = re.search(r"blk\.(\d+)\.", name)
    parts = name.split(".")
    short = next((parts[i - 1] for i in range(1, len(parts)) if parts[i] == "weight"), name)
    return {
        "name": name, "layer": m[1] if m else "-", "short": short, "block": int(m[1]) if m else -1,
        "total": total, "mean": mean, "max": act.max(), "min": act.min(), "dev": dev,
        "active": active, "n": len(act), "entropy": entropy, "zd": np.float32(zd / len(act)),
        "values": np.asarray(sums, np.float32).reshape(-1), "cossim": np.float32(0),
    }  # fmt: skip


def imatrix_statistics(stats: ImatrixStats) -> list[str]:
    """llama-imatrix's ``--show-statistics`` report of one file's statistics: a line per
    tensor (sum, min, max, mean, deviation of the per-column averages of ``x^2``, the share
    of active columns, their entropy, the share more than one deviation above the mean, the
    cosine similarity with the same tensor of the layer before), then per layer the
    averages weighted by the tensors' sizes."""
    ts = [t for k in stats.sums if (t := _tensor_stats(k, stats.sums[k], stats.counts[k]))]
    by_name = {t["name"]: t for t in ts}
    for t in ts:
        if t["block"] < 0:
            continue
        prev = by_name.get(re.sub(r"blk\.\d+\.", f"blk.{t['block'] - 1}.", t["name"], count=1))
        if prev is not None:
            a, b = t["values"], prev["values"]
            dp = _f32_sum((a * b).astype(np.float32))
            mags = np.sqrt(_f32_sum(a * a)) * np.sqrt(_f32_sum(b * b))
            t["cossim"] = np.float32(dp / np.float32(mags))
    ts.sort(key=lambda t: (t["short"], -t["total"]))
    head = ("\n Layer\t       Tensor\t          Σ(Act²)\t  Min\t            Max\t           μ\t"
            "   σ\t % Active\tN\t   Entropy\tE (norm)\tZD\t  CosSim")  # fmt: skip
    out = [head, "=" * 169]
    layers: dict[int, list] = {}
    for t in ts:
        n = t["n"]
        e_norm = 100.0 * (float(t["entropy"]) / math.log2(n)) if n > 0 else 0.0  # (double)
        out.append(
            f"{t['layer']:>5}\t{t['short']:<20}\t{t['total']:10.2f}\t{t['min']:8.4f}\t"
            f"{t['max']:11.4f}\t{t['mean']:6.2f}\t{t['dev']:6.2f}\t{t['active'] * 100:8.2f}%\t"
            f"{n:6d}\t{t['entropy']:10.4f}\t{e_norm:6.2f}%\t{100 * t['zd']:10.2f}%\t"
            f"{t['cossim']:8.4f}"
        )
        w = layers.setdefault(t["block"], [np.float32(0)] * 3 + [0])
        w[0] += np.float32(n * t["total"])
        w[1] += np.float32(n * t["zd"])
        w[2] += np.float32(n * t["cossim"])
        w[3] += n
    blocks = sorted(k for k in layers if k >= 0)
    out += [f"\nComputing weighted average statistics per layer ({len(blocks)} layers)",
            "\n  Layer\t     μΣ(Act²)\t      μZD\tμCosSim",
            "================================================"]  # fmt: skip
    for k in blocks:
        w = layers[k]
        if w[3]:
            out.append(
                f"{k:5d}\t{w[0] / w[3]:14.2f}\t{100 * (w[1] / w[3]):10.4f}%\t{w[2] / w[3]:6.4f}"
            )
    return out
