"""Seed parity with llama.cpp: same logits + parameters + seed -> same tokens, bit for bit.

Fixtures come from scripts/make_sampling_fixtures.py (llama.cpp through llama-cpp-python);
every step applies the chain, compares the chosen token, the number of candidates left,
the selected index, the first candidate ids and a digest of the whole candidate array
(order, ids, float32 probability bits), then accepts
the token so penalty / DRY / mirostat state evolves as in generation.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy.sampling import (
    DRY,
    XTC,
    AdaptiveP,
    Dist,
    Greedy,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    SamplerChain,
    SamplingParams,
    Temp,
    TempExt,
    TokenDataArray,
    TopK,
    TopNSigma,
    TopP,
    Typical,
    build_sampler_chain,
)
from llamacpy.sampling.sort import partial_sort, std_sort

FIXTURES = Path(__file__).parent / "fixtures" / "sampling"
PARITY = json.loads((FIXTURES / "parity.json").read_text())
SORTS = json.loads((FIXTURES / "std_sort.json").read_text())


def synth_logits(
    seed: int, step: int, n_vocab: int, kind: str, support: list[int] | None = None
) -> np.ndarray:
    """Keep identical to scripts/make_sampling_fixtures.py (only + - * floor: bit-exact)."""
    bits = np.random.PCG64([seed, step]).random_raw(n_vocab + 8)
    t = (bits[:n_vocab] >> np.uint64(11)).astype(np.float64) * 2.0**-53 * 2.0 - 1.0
    if kind == "flat":
        x = 10.0 * t
    elif kind == "ties":
        x = np.floor(t * 16.0) * 0.5
    else:
        t2 = t * t
        t4 = t2 * t2
        t8 = t4 * t4
        x = 3.0 * t + 12.0 * (t8 * t4 * t2 * t)
        spikes = bits[n_vocab:] % np.uint64(n_vocab)
        x[spikes.astype(np.int64)] += 6.0
    if kind == "cycle":  # only `support` tokens, one favoured per step in a fixed cycle
        keep = np.asarray(support, np.int64)
        x = np.full(n_vocab, -np.inf)
        x[keep] = 0.5 * t[keep]
        x[keep[step % len(keep)]] += 4.0
    if kind == "neginf":
        x[(bits[:n_vocab] % np.uint64(7)) == 0] = -np.inf
    if kind == "support":
        keep = np.random.PCG64([seed, 999]).random_raw(12) % np.uint64(n_vocab)
        keep = keep.astype(np.int64) if support is None else np.asarray(support, np.int64)
        y = np.full(n_vocab, -np.inf)
        y[keep] = x[keep]
        x = y
    return x.astype(np.float32)


def make_sampler(name: str, kw: dict, n_vocab: int, case: dict):
    if name == "greedy":
        return Greedy()
    if name == "dist":
        return Dist(kw["seed"])
    if name == "top_k":
        return TopK(kw["k"])
    if name == "top_p":
        return TopP(kw["p"], kw.get("min_keep", 0))
    if name == "min_p":
        return MinP(kw["p"], kw.get("min_keep", 0))
    if name == "typical":
        return Typical(kw["p"], kw.get("min_keep", 0))
    if name == "temp":
        return Temp(kw["temp"])
    if name == "temp_ext":
        return TempExt(kw["temp"], kw["delta"], kw["exponent"])
    if name == "xtc":
        return XTC(kw["probability"], kw["threshold"], kw.get("min_keep", 0), kw["seed"])
    if name == "top_n_sigma":
        return TopNSigma(kw["n"])
    if name == "penalties":
        return Penalties(kw["last_n"], kw["repeat"], kw.get("freq", 0.0), kw.get("present", 0.0))
    if name == "dry":
        return DRY(kw["multiplier"], kw["base"], kw["allowed_length"], kw["last_n"], kw["breakers"])
    if name == "dry_strings":
        return DRY(
            kw["multiplier"], kw["base"], kw["allowed_length"], kw["last_n"], case["dry_breakers"]
        )
    if name == "logit_bias":
        return LogitBias(n_vocab, kw["bias"])
    if name == "mirostat":
        return Mirostat(n_vocab, kw["seed"], kw["tau"], kw["eta"], kw.get("m", 100))
    if name == "mirostat_v2":
        return MirostatV2(kw["seed"], kw["tau"], kw["eta"])
    if name == "adaptive_p":
        return AdaptiveP(kw["target"], kw["decay"], kw["seed"])
    raise ValueError(name)


def build(case: dict) -> SamplerChain:
    if case["spec"] is not None:
        return SamplerChain(make_sampler(n, kw, case["n_vocab"], case) for n, kw in case["spec"])
    params = dict(case["params"])
    dry_tokens = params.pop("dry_tokens", None)
    params["logit_bias"] = [tuple(x) for x in params.get("logit_bias", [])]
    return build_sampler_chain(
        SamplingParams.create(**params), case["n_vocab"], dry_seq_breakers=dry_tokens
    )


def run_case(case: dict, n_top: int) -> list[str]:
    chain = build(case)
    problems = []
    for step, exp in enumerate(case["expected"]):
        logits = synth_logits(
            case["seed"], step, case["n_vocab"], case["kind"], case.get("support")
        )
        cur = TokenDataArray.from_logits(logits)
        chain.apply(cur)
        token = int(cur.id[cur.selected])
        got = {
            "token": token,
            "size": cur.size,
            "selected": cur.selected,
            "sorted": cur.sorted,
            "ids": cur.id[: min(n_top, cur.size)].tolist(),
            "digest": hashlib.sha1(
                cur.id[: cur.size].astype("<i4").tobytes()
                + cur.p[: cur.size].astype("<f4").tobytes()
            ).hexdigest()[:16],
        }
        for key, value in got.items():
            if value != exp[key]:
                problems.append(f"step {step}: {key} = {value}, llama.cpp {exp[key]}")
        if problems:
            break
        chain.accept(exp["token"])
    return problems


@pytest.mark.parametrize("case", PARITY["cases"], ids=[c["name"] for c in PARITY["cases"]])
def test_parity_with_llama_cpp(case: dict) -> None:
    problems = run_case(case, PARITY["n_top"])
    assert not problems, f"{case['name']}: " + "; ".join(problems[:3])


def test_parity_covers_every_sampler_and_many_steps() -> None:
    names = {n for c in PARITY["cases"] if c["spec"] for n, _ in c["spec"]}
    names |= (
        {"logit_bias"}
        if any(c["params"] and c["params"].get("logit_bias") for c in PARITY["cases"])
        else set()
    )
    assert names >= {
        "greedy", "dist", "top_k", "top_p", "min_p", "typical", "temp", "temp_ext", "xtc",
        "top_n_sigma", "penalties", "dry", "dry_strings", "logit_bias", "mirostat",
        "mirostat_v2", "adaptive_p",
    }  # fmt: skip
    assert sum(c["steps"] for c in PARITY["cases"]) >= 2000
    assert any(c["params"] and not c["params"].get("samplers") for c in PARITY["cases"])


@pytest.mark.parametrize(
    "case", SORTS, ids=[f"n={c['n']}-mode={c['mode']}-{c['kind']}" for c in SORTS]
)
def test_std_sort_matches_libstdcxx(case: dict) -> None:
    n = case["n"]
    key = synth_logits(case["seed"], 0, n, case["kind"])
    ids = np.arange(n, dtype=np.int32)
    other = np.zeros(n, np.float32)
    if case["mode"] == 2:
        partial_sort(key, ids, other, 0, case["mid"], n, True)
    else:
        std_sort(key, ids, other, 0, n, case["mode"] == 0)
    assert ids.tolist() == case["perm"]
