"""KL divergence against a base model's stored log-probabilities, as ``llama-perplexity
--kl-divergence`` computes and prints it.

For every scored position, with ``p`` the evaluated model's distribution and ``p_base`` the
stored one: ``KLD = sum p_base (log p_base - log p)`` over the tokens whose stored
log-probability is above -16, the negative log-likelihoods of the next token under both
(for ``PPL(Q)``, ``PPL(base)``, their ratio and difference with the covariance),
``Δp = p(token) - p_base(token)``, and whether both put the same token first. Per-row
arithmetic is float32 and sums are double, as llama.cpp's; the report's lines are its.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .logits_file import F32, LogitsFile, expf, log_sum_exp
from .perplexity import eval_chunks

CHUNK_HEADER = (
    "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
    "              Δp RMS            Same top p"
)


def _sqrt(x: float) -> float:
    """C's ``sqrt``: NaN below 0."""
    return math.sqrt(x) if x >= 0 else math.nan


def _div(a: float, b: float) -> float:
    """C's double division: infinities and NaN instead of an exception."""
    if b:
        return a / b
    return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)


def _f(x: float, spec: str) -> str:
    """``printf`` of a double: glibc writes the NaN of an invalid operation as ``-nan``."""
    if math.isnan(x):
        return format("-nan", f">{spec.split('.')[0] or 0}")
    return format(x, spec)


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(suma: float, sumb: float, sumab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (sumab / count - (suma / count) * (sumb / count)) / (count - 1)


@dataclass
class KLDStats:
    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: float = 0.0
    n_same_top: int = 0
    count: int = 0
    kld_values: list[np.ndarray] = field(default_factory=list)  # float32 per chunk
    p_diff_values: list[np.ndarray] = field(default_factory=list)

    def add(self, logits: np.ndarray, base: np.ndarray, targets: np.ndarray) -> None:
        """One chunk: ``logits [n, n_vocab]`` float32, ``base [n, nv]`` stored rows."""
        logits = np.asarray(logits, F32)
        n, n_vocab = logits.shape
        ar = np.arange(n)
        head = np.ascontiguousarray(base[:, :4]).view("<f4")
        scale, min_lp = head[:, 0], head[:, 1]
        q = base[:, 4 : 4 + n_vocab]
        imax = logits.argmax(axis=1)
        mx = logits[ar, imax]
        lse = log_sum_exp(logits, mx)
        nll = (mx + lse) - logits[ar, targets]
        nll_base = -(scale * q[ar, targets].astype(F32) + min_lp)
        log_base = scale[:, None] * q.astype(F32) + min_lp[:, None]
        imax_base = log_base.argmax(axis=1)
        term = expf(log_base) * ((log_base - logits) + (mx + lse)[:, None])
        kld = np.where(log_base > F32(-16), term, F32(0)).sum(axis=1, dtype=np.float64)
        p_diff = expf(-nll) - expf(-nll_base)
        d2 = (p_diff * p_diff).astype(np.float64)
        self.sum_nll += float(nll.sum(dtype=np.float64))
        self.sum_nll2 += float((nll * nll).sum(dtype=np.float64))
        self.sum_nll_base += float(nll_base.sum(dtype=np.float64))
        self.sum_nll_base2 += float((nll_base * nll_base).sum(dtype=np.float64))
        self.sum_nll_nll_base += float((nll * nll_base).sum(dtype=np.float64))
        self.sum_kld += float(kld.sum())
        self.sum_kld2 += float((kld * kld).sum())
        self.sum_p_diff += float(p_diff.sum(dtype=np.float64))
        self.sum_p_diff2 += float(d2.sum())
        self.sum_p_diff4 += float((d2 * d2).sum())
        self.max_p_diff = max(self.max_p_diff, float(np.abs(p_diff).max(initial=0)))
        self.n_same_top += int((imax == imax_base).sum())
        self.count += n
        self.kld_values.append(kld.astype(F32))
        self.p_diff_values.append(p_diff)

    # the quantities llama-perplexity prints
    def log_ppl(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_nll, self.sum_nll2, self.count)

    def log_ppl_base(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, self.count)

    def log_ppl_cov(self) -> float:
        return covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, self.count)

    def log_ppl_ratio(self) -> tuple[float, float]:
        (a, da), (b, db) = self.log_ppl(), self.log_ppl_base()
        return a - b, _sqrt(da * da + db * db - 2.0 * self.log_ppl_cov())

    def kld(self) -> tuple[float, float]:
        return mean_and_uncertainty(self.sum_kld, self.sum_kld2, self.count)

    def p_diff_rms(self) -> tuple[float, float]:
        mse, dmse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, self.count)
        rms = _sqrt(mse)
        return rms, _div(0.5, rms) * dmse

    def same_top(self) -> tuple[float, float]:
        p = _div(self.n_same_top, self.count)
        return p, _sqrt(_div(p * (1 - p), self.count - 1))

    def chunk_line(self, chunk: int) -> str:
        """The running line llama-perplexity prints after chunk ``chunk`` (1-based)."""
        lp, dlp = self.log_ppl()
        ppl = math.exp(lp)
        r, dr = self.log_ppl_ratio()
        k, dk = self.kld()
        rms, drms = self.p_diff_rms()
        top, dtop = self.same_top()
        return (f"{chunk:4d}    {ppl:9.4f} ± {ppl * dlp:9.4f}    {r:10.5f} ± {_f(dr, '10.5f')}"
                f"    {k:10.5f} ± {dk:10.5f}    {_f(100 * rms, '6.3f')} ± "
                f"{_f(100 * drms, '6.3f')} %    {_f(100 * top, '6.3f')} ± "
                f"{_f(100 * dtop, '6.3f')} %")  # fmt: skip

    def report(self) -> list[str]:
        """The final statistics (llama-perplexity prints none under 100 values)."""
        if self.count < 100:
            return []
        kv = np.sort(np.concatenate(self.kld_values))
        pv = np.sort(np.concatenate(self.p_diff_values))
        (lp, dlp), (lb, dlb) = self.log_ppl(), self.log_ppl_base()
        ppl, ppl_base = math.exp(lp), math.exp(lb)
        dppl, dppl_base = ppl * dlp, ppl_base * dlb
        cov = self.log_ppl_cov()
        r, dr = self.log_ppl_ratio()
        ratio = math.exp(r)
        ppl_cov = ppl * ppl_base * cov
        d_diff = _sqrt(dppl * dppl + dppl_base * dppl_base - 2.0 * ppl_cov)
        k, dk = self.kld()
        pd, dpd = mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, self.count)
        rms, drms = self.p_diff_rms()
        top, dtop = self.same_top()
        out = [
            "====== Perplexity statistics ======",
            f"Mean PPL(Q)                   : {ppl:10.6f} ± {dppl:10.6f}",
            f"Mean PPL(base)                : {ppl_base:10.6f} ± {dppl_base:10.6f}",
            f"Cor(ln(PPL(Q)), ln(PPL(base))): {_f(100 * _div(cov, dlp * dlb), '6.2f')}%",
            f"Mean ln(PPL(Q)/PPL(base))     : {r:10.6f} ± {_f(dr, '10.6f')}",
            f"Mean PPL(Q)/PPL(base)         : {ratio:10.6f} ± {_f(ratio * dr, '10.6f')}",
            f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_base:10.6f} ± {_f(d_diff, '10.6f')}",
            "",
            "====== KL divergence statistics ======",
            f"Mean    KLD: {k:10.6f} ± {dk:10.6f}",
            f"Maximum KLD: {kv[-1]:10.6f}",
        ]
        for label, frac in (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950),
                            ("90.0%", 0.900)):  # fmt: skip
            out.append(f"{label}   KLD: {percentile(kv, frac):10.6f}")
        out.append(f"Median  KLD: {median(kv):10.6f}")
        for label, frac in (("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010),
                            (" 0.1%", 0.001)):  # fmt: skip
            out.append(f"{label}   KLD: {percentile(kv, frac):10.6f}")
        out += [f"Minimum KLD: {kv[0]:10.6f}", "", "====== Token probability statistics ======",
                f"Mean    Δp: {100 * pd:6.3f} ± {100 * dpd:5.3f} %",
                f"Maximum Δp: {100 * float(pv[-1]):6.3f}%"]  # fmt: skip
        for label, frac in (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950),
                            ("90.0%", 0.900), ("75.0%", 0.750)):  # fmt: skip
            out.append(f"{label}   Δp: {100 * float(percentile(pv, frac)):6.3f}%")
        out.append(f"Median  Δp: {100 * float(median(pv)):6.3f}%")
        for label, frac in (("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050),
                            (" 1.0%", 0.010), (" 0.1%", 0.001)):  # fmt: skip
            out.append(f"{label}   Δp: {100 * float(percentile(pv, frac)):6.3f}%")
        out += [f"Minimum Δp: {100 * float(pv[0]):6.3f}%",
                f"RMS Δp    : {_f(100 * rms, '6.3f')} ± {_f(100 * drms, '5.3f')} %",
                f"Same top p: {_f(100 * top, '6.3f')} ± {_f(100 * dtop, '5.3f')} %"]  # fmt: skip
        return out


def median(v: np.ndarray) -> np.float32:
    """llama.cpp's median of sorted float32 values (the mean of the middle two in float)."""
    n = len(v)
    return F32(0.5) * (v[n // 2] + v[n // 2 - 1]) if n % 2 == 0 else v[n // 2]


def percentile(v: np.ndarray, fraction: float) -> np.float32:
    """llama.cpp's interpolated percentile of sorted float32 values (float arithmetic)."""
    fraction = F32(fraction)
    if fraction <= 0:
        return v[0]
    if fraction >= 1:
        return v[-1]
    p = fraction * F32(len(v) - 1)
    ip = int(p)
    p = p - F32(ip)
    return (F32(1) - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)]


def kl_divergence(
    ctx: Any,
    base: LogitsFile,
    *,
    n_batch: int,
    n_seq: int,
    bos: int | None,
    on_chunk: Callable[[int, KLDStats], None] | None = None,
    on_first_pass: Callable[[float, int, int], None] | None = None,
) -> KLDStats:
    """Evaluate ``base``'s tokens with ``ctx`` (its vocabulary checked first) and compare
    with the stored log-probabilities; ``on_chunk(i, stats)`` after each chunk (1-based)."""
    base.check_vocab(ctx.n_vocab)
    n_ctx, first = base.n_ctx, base.n_ctx // 2
    tokens = base.tokens
    stats = KLDStats()
    for c, logits in eval_chunks(ctx, tokens, n_ctx=n_ctx, n_batch=min(n_batch, ctx.n_batch),
                                 n_seq=n_seq, n_chunk=base.n_chunk, bos=bos,
                                 on_first_pass=on_first_pass):  # fmt: skip
        at = c * n_ctx + first
        stats.add(logits, base.chunk(c), tokens[at + 1 : at + n_ctx - first].astype(np.int64))
        if on_chunk is not None:
            on_chunk(c + 1, stats)
    return stats
