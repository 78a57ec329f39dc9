"""Generate llama.cpp parity fixtures for llamacpy.sampling (dev-only; needs the oracle).

Run with the llama-cpp-python oracle (it exposes llama.cpp's sampler API):

    /root/oracle/py scripts/make_sampling_fixtures.py

Writes tests/fixtures/sampling/parity.json: for every case, a sampler configuration, a
deterministic synthetic-logits recipe, and what llama.cpp did on each step (chosen token,
number of candidates left, selected index, the first candidates' ids, and a digest of the
whole post-chain array: order, ids and float32 probability bits). The chosen token is accepted after every step, so penalty/DRY/mirostat
state evolves as in generation. With g++ available it also writes std_sort.json: libstdc++
``std::sort``/``std::partial_sort`` permutations for tie-heavy keys.

The logits recipe uses only PCG64 raw bits and IEEE + - * (no libm), so the tests
regenerate bit-identical logits on any machine; keep ``synth_logits`` identical to the
copy in tests/test_sampling_parity.py.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "sampling"
MODEL = Path.home() / ".cache/llamacpy/models/SmolLM2-135M-Instruct.Q4_1.gguf"
N_TOP = 4  # candidates recorded per step (plus a digest of all of them)


def synth_logits(
    seed: int, step: int, n_vocab: int, kind: str, support: list[int] | None = None
) -> np.ndarray:
    """Deterministic float32 logits: PCG64 raw bits, then only + - * and floor."""
    bits = np.random.PCG64([seed, step]).random_raw(n_vocab + 8)
    t = (bits[:n_vocab] >> np.uint64(11)).astype(np.float64) * 2.0**-53 * 2.0 - 1.0
    if kind == "flat":
        x = 10.0 * t
    elif kind == "ties":
        x = np.floor(t * 16.0) * 0.5  # 32 distinct values
    else:  # "peaky", "support", "neginf": a steep tail plus a few spikes
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
    if kind == "support":  # only a few tokens possible: repetitions become frequent
        keep = np.random.PCG64([seed, 999]).random_raw(12) % np.uint64(n_vocab)
        keep = keep.astype(np.int64) if support is None else np.asarray(support, np.int64)
        y = np.full(n_vocab, -np.inf)
        y[keep] = x[keep]
        x = y
    return x.astype(np.float32)


# --- oracle side ----------------------------------------------------------------------


def _oracle():
    import llama_cpp as L

    return L


class _Vec(ctypes.Structure):  # libstdc++ std::vector<T> layout: begin, end, end_of_storage
    _fields_ = [("b", ctypes.c_void_p), ("e", ctypes.c_void_p), ("c", ctypes.c_void_p)]


def _dry_testing(mult, base, allowed, last_n, breakers):
    """llama.cpp's llama_sampler_init_dry_testing (token breakers), called through its C++ ABI."""
    lib = ctypes.CDLL(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libllama.so"))
    fn = lib._Z30llama_sampler_init_dry_testingffiiRKSt6vectorIS_IiSaIiEESaIS1_EE
    fn.restype = ctypes.c_void_p
    fn.argtypes = [
        ctypes.c_float,
        ctypes.c_float,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(_Vec),
    ]
    keep = []
    inner = (_Vec * max(len(breakers), 1))()
    for i, seq in enumerate(breakers):
        arr = (ctypes.c_int32 * len(seq))(*seq)
        keep.append(arr)
        a = ctypes.addressof(arr)
        inner[i] = _Vec(a, a + 4 * len(seq), a + 4 * len(seq))
    a = ctypes.addressof(inner)
    outer = _Vec(
        a, a + ctypes.sizeof(_Vec) * len(breakers), a + ctypes.sizeof(_Vec) * len(breakers)
    )
    L = _oracle()
    return ctypes.cast(
        fn(mult, base, allowed, last_n, ctypes.byref(outer)), L.llama_sampler_p_ctypes
    )


def make_sampler(L, name, kw, n_vocab, vocab):
    if name == "greedy":
        return L.llama_sampler_init_greedy()
    if name == "dist":
        return L.llama_sampler_init_dist(kw["seed"])
    if name == "top_k":
        return L.llama_sampler_init_top_k(kw["k"])
    if name == "top_p":
        return L.llama_sampler_init_top_p(kw["p"], kw.get("min_keep", 0))
    if name == "min_p":
        return L.llama_sampler_init_min_p(kw["p"], kw.get("min_keep", 0))
    if name == "typical":
        return L.llama_sampler_init_typical(kw["p"], kw.get("min_keep", 0))
    if name == "temp":
        return L.llama_sampler_init_temp(kw["temp"])
    if name == "temp_ext":
        return L.llama_sampler_init_temp_ext(kw["temp"], kw["delta"], kw["exponent"])
    if name == "xtc":
        return L.llama_sampler_init_xtc(
            kw["probability"], kw["threshold"], kw.get("min_keep", 0), kw["seed"]
        )
    if name == "top_n_sigma":
        return L.llama_sampler_init_top_n_sigma(kw["n"])
    if name == "penalties":
        return L.llama_sampler_init_penalties(
            n_vocab, kw["last_n"], kw["repeat"], kw.get("freq", 0.0), kw.get("present", 0.0)
        )
    if name == "dry":
        return _dry_testing(
            kw["multiplier"], kw["base"], kw["allowed_length"], kw["last_n"], kw["breakers"]
        )
    if name == "dry_strings":
        strs = [s.encode() for s in kw["strings"]]
        arr = (ctypes.c_char_p * len(strs))(*strs)
        return L.llama_sampler_init_dry(
            vocab, kw["multiplier"], kw["base"], kw["allowed_length"], kw["last_n"], arr, len(strs)
        )
    if name == "logit_bias":
        arr = (L.llama_logit_bias * len(kw["bias"]))()
        for i, (tok, b) in enumerate(kw["bias"]):
            arr[i].token, arr[i].bias = tok, b
        return L.llama_sampler_init_logit_bias(n_vocab, len(kw["bias"]), arr)
    if name == "mirostat":
        return L.llama_sampler_init_mirostat(
            n_vocab, kw["seed"], kw["tau"], kw["eta"], kw.get("m", 100)
        )
    if name == "mirostat_v2":
        return L.llama_sampler_init_mirostat_v2(kw["seed"], kw["tau"], kw["eta"])
    if name == "adaptive_p":
        return L.llama_sampler_init_adaptive_p(kw["target"], kw["decay"], kw["seed"])
    raise ValueError(name)


def common_chain_spec(params: dict, n_vocab: int) -> list:
    """The sampler list llama.cpp's common_sampler_init builds (common/sampling.cpp)."""
    p = {
        "seed": 0xFFFFFFFF, "min_keep": 0, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
        "xtc_probability": 0.0, "xtc_threshold": 0.1, "typ_p": 1.0, "temp": 0.8,
        "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "penalty_last_n": 64,
        "penalty_repeat": 1.0, "penalty_freq": 0.0, "penalty_present": 0.0,
        "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
        "dry_penalty_last_n": 64, "adaptive_target": -1.0, "adaptive_decay": 0.9,
        "mirostat": 0, "top_n_sigma": -1.0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
        "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"],
        "logit_bias": [],
    } | params  # fmt: skip
    spec = []
    if p["logit_bias"]:
        spec.append(["logit_bias", {"bias": p["logit_bias"]}])
    if p["mirostat"] == 1:
        return [*spec, ["temp", {"temp": p["temp"]}],
                ["mirostat", {"seed": p["seed"], "tau": p["mirostat_tau"], "eta": p["mirostat_eta"], "m": 100}]]  # fmt: skip
    if p["mirostat"] == 2:
        return [*spec, ["temp", {"temp": p["temp"]}],
                ["mirostat_v2", {"seed": p["seed"], "tau": p["mirostat_tau"], "eta": p["mirostat_eta"]}]]  # fmt: skip
    adaptive = False
    for name in p["samplers"]:
        if name == "dry":
            if p["dry_multiplier"] != 0.0:
                spec.append(["dry", {"multiplier": p["dry_multiplier"], "base": p["dry_base"],
                                     "allowed_length": p["dry_allowed_length"],
                                     "last_n": p["dry_penalty_last_n"], "breakers": p.get("dry_tokens", [])}])  # fmt: skip
        elif name == "top_k":
            spec.append(["top_k", {"k": p["top_k"]}])
        elif name == "top_p":
            spec.append(["top_p", {"p": p["top_p"], "min_keep": p["min_keep"]}])
        elif name == "top_n_sigma":
            spec.append(["top_n_sigma", {"n": p["top_n_sigma"]}])
        elif name == "min_p":
            spec.append(["min_p", {"p": p["min_p"], "min_keep": p["min_keep"]}])
        elif name == "xtc":
            spec.append(["xtc", {"probability": p["xtc_probability"], "threshold": p["xtc_threshold"],
                                 "min_keep": p["min_keep"], "seed": p["seed"]}])  # fmt: skip
        elif name == "typ_p":
            spec.append(["typical", {"p": p["typ_p"], "min_keep": p["min_keep"]}])
        elif name == "temperature":
            spec.append(["temp_ext", {"temp": p["temp"], "delta": p["dynatemp_range"],
                                      "exponent": p["dynatemp_exponent"]}])  # fmt: skip
        elif name == "penalties":
            spec.append(["penalties", {"last_n": p["penalty_last_n"], "repeat": p["penalty_repeat"],
                                       "freq": p["penalty_freq"], "present": p["penalty_present"]}])  # fmt: skip
        elif name == "adaptive_p":
            adaptive = True
    if adaptive:
        spec.append(
            [
                "adaptive_p",
                {"target": p["adaptive_target"], "decay": p["adaptive_decay"], "seed": p["seed"]},
            ]
        )
    else:
        spec.append(["dist", {"seed": p["seed"]}])
    return spec


def digest(ids: np.ndarray, p: np.ndarray) -> str:
    """Hash of the whole post-chain candidate array (order, ids, float32 probabilities)."""
    return hashlib.sha1(ids.astype("<i4").tobytes() + p.astype("<f4").tobytes()).hexdigest()[:16]


def run_oracle(L, spec, n_vocab, n_steps, seed, kind, vocab=None, support=None):
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    for name, kw in spec:
        L.llama_sampler_chain_add(chain, make_sampler(L, name, kw, n_vocab, vocab))
    dt = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
    steps = []
    for step in range(n_steps):
        buf = np.zeros(n_vocab, dt)
        buf["id"] = np.arange(n_vocab)
        buf["logit"] = synth_logits(seed, step, n_vocab, kind, support)
        cp = L.llama_token_data_array(
            ctypes.cast(buf.ctypes.data, ctypes.POINTER(L.llama_token_data)), n_vocab, -1, False
        )
        L.llama_sampler_apply(chain, ctypes.byref(cp))
        off = (ctypes.cast(cp.data, ctypes.c_void_p).value - buf.ctypes.data) // dt.itemsize
        live = buf[off : off + cp.size]
        assert 0 <= cp.selected < cp.size, (spec, step, cp.selected, cp.size)
        token = int(live["id"][cp.selected])
        L.llama_sampler_accept(chain, token)
        top = live[:N_TOP]
        steps.append({
            "token": token, "size": int(cp.size), "selected": int(cp.selected), "sorted": bool(cp.sorted),
            "ids": top["id"].tolist(),
            "digest": digest(live["id"], live["p"]),
        })  # fmt: skip
    L.llama_sampler_free(chain)
    return steps


def cases() -> list[dict]:
    big, out = 49152, []

    def add(name, spec=None, params=None, n_vocab=big, steps=24, seed=1, kind="peaky", **extra):
        out.append({"name": name, "spec": spec, "params": params, "n_vocab": n_vocab,
                    "steps": steps, "seed": seed, "kind": kind, **extra})  # fmt: skip

    # default chain (common_params_sampling defaults) at several temperatures and seeds
    for temp in (0.0, 0.5, 0.8, 1.0, 1.5):
        add(f"default temp={temp}", params={"seed": 42, "temp": temp})
    for s in (0, 7, 0xFFFFFFFE):
        add(f"default seed={s}", params={"seed": s}, kind="flat", seed=s + 3)
    add("default 262144", params={"seed": 5}, n_vocab=262144, steps=6)
    add("default small vocab", params={"seed": 9}, n_vocab=37, steps=64)
    add("default ties", params={"seed": 11}, kind="ties")
    add("default neginf", params={"seed": 12}, kind="neginf")
    add(
        "samplers=top_p;top_k;temp",
        params={"seed": 3, "samplers": ["top_p", "top_k", "temperature"], "top_p": 0.9},
    )
    add(
        "samplers=min_p;temp",
        params={"seed": 4, "samplers": ["min_p", "temperature"], "min_p": 0.1},
        kind="flat",
    )
    add("all samplers", params={
        "seed": 21, "top_n_sigma": 2.0, "typ_p": 0.95, "xtc_probability": 0.5, "xtc_threshold": 0.05,
        "penalty_repeat": 1.2, "penalty_freq": 0.3, "penalty_present": 0.2, "dynatemp_range": 0.3,
        "dry_multiplier": 0.8, "dry_tokens": [[5], [7, 8]], "min_keep": 2, "logit_bias": [[3, 2.5], [100, -1.0]],
    }, kind="support", steps=48)  # fmt: skip
    add("mirostat 1", params={"seed": 13, "mirostat": 1}, steps=24)
    add("mirostat 2", params={"seed": 14, "mirostat": 2}, steps=24)
    add("mirostat 1 ties", params={"seed": 15, "mirostat": 1, "temp": 1.0}, kind="ties", steps=8)
    add("adaptive_p", params={"seed": 16, "samplers": ["top_k", "adaptive_p"], "top_k": 0,
                              "adaptive_target": 0.3}, steps=24)  # fmt: skip
    top = np.argsort(-synth_logits(17, 0, big, "peaky"), kind="stable")[:3].tolist()
    bias = [[top[0], float("-inf")], [top[1], -2.0], [1, 14.0], [1, 1.0], [50000, 3.0]]
    add("logit bias", params={"seed": 17, "logit_bias": bias})

    # one sampler at a time (+ dist) on big and small vocabularies
    def single(label, sampler, kinds=("peaky", "ties"), vocabs=(big, 1000), steps=16, seed=30):
        for kind in kinds:
            for nv in vocabs:
                add(f"{label} {kind} n={nv}", spec=[sampler, ["dist", {"seed": seed}]],
                    n_vocab=nv, steps=steps, seed=seed + nv % 97, kind=kind)  # fmt: skip

    single("top_k=1", ["top_k", {"k": 1}])
    single("top_k=40", ["top_k", {"k": 40}])
    single("top_k=200", ["top_k", {"k": 200}], kinds=("peaky", "ties", "flat"))
    single("top_k=5000", ["top_k", {"k": 5000}], vocabs=(big,))
    single("top_p=0.5", ["top_p", {"p": 0.5}])
    single("top_p=0.95", ["top_p", {"p": 0.95}], kinds=("peaky", "ties", "flat"))
    single("top_p=0.9 min_keep=300", ["top_p", {"p": 0.9, "min_keep": 300}], vocabs=(big,))
    single("min_p=0.05", ["min_p", {"p": 0.05}])
    single("min_p=0.2 min_keep=50", ["min_p", {"p": 0.2, "min_keep": 50}], kinds=("peaky",))
    single("typical=0.5", ["typical", {"p": 0.5}], vocabs=(1000, 300))
    single(
        "typical=0.9",
        ["typical", {"p": 0.9, "min_keep": 3}],
        vocabs=(big,),
        kinds=("peaky",),
        steps=6,
    )
    single("temp=0", ["temp", {"temp": 0.0}], kinds=("ties",))
    single("temp=1.7", ["temp", {"temp": 1.7}], kinds=("peaky",))
    single("dynatemp", ["temp_ext", {"temp": 0.9, "delta": 0.5, "exponent": 1.0}], kinds=("peaky",))
    single(
        "dynatemp exp=2.5",
        ["temp_ext", {"temp": 1.2, "delta": 0.4, "exponent": 2.5}],
        vocabs=(1000,),
    )
    single("xtc", ["xtc", {"probability": 0.7, "threshold": 0.02, "seed": 77}], vocabs=(1000, 200))
    single("xtc big", ["xtc", {"probability": 0.9, "threshold": 0.001, "seed": 78, "min_keep": 1}],
           vocabs=(big,), kinds=("peaky",), steps=6)  # fmt: skip
    single("top_n_sigma=1", ["top_n_sigma", {"n": 1.0}], kinds=("peaky", "neginf"))
    single("top_n_sigma=3", ["top_n_sigma", {"n": 3.0}], kinds=("flat",))
    single("penalties", ["penalties", {"last_n": 16, "repeat": 1.5, "freq": 0.4, "present": 0.3}],
           kinds=("support",), vocabs=(big, 64), steps=48)  # fmt: skip
    single(
        "penalties repeat",
        ["penalties", {"last_n": 64, "repeat": 3.0}],
        kinds=("support",),
        vocabs=(40,),
        steps=64,
    )
    single("dry", ["dry", {"multiplier": 1.5, "base": 1.75, "allowed_length": 2, "last_n": 64,
                           "breakers": [[3], [9, 4]]}], kinds=("support",), vocabs=(big, 20), steps=64)  # fmt: skip
    for nv in (big, 30):
        add(f"dry cycle n={nv}", spec=[["dry", {"multiplier": 1.0, "base": 1.5, "allowed_length": 2, "last_n": 40,
                                                "breakers": [[7], [11, 12]]}], ["dist", {"seed": 60}]],
            n_vocab=nv, steps=64, seed=61, kind="cycle", support=[3, 4, 7, 5, 11, 12, 6, 9])  # fmt: skip
    single("dry long", ["dry", {"multiplier": 0.5, "base": 3.0, "allowed_length": 1, "last_n": 32,
                                "breakers": []}], kinds=("support",), vocabs=(12,), steps=64)  # fmt: skip
    single("greedy", ["greedy", {}], kinds=("ties", "peaky"))
    add(
        "mirostat v1 only",
        spec=[["mirostat", {"seed": 40, "tau": 3.0, "eta": 0.2, "m": 100}]],
        steps=24,
    )
    add(
        "mirostat v1 small",
        spec=[["mirostat", {"seed": 41, "tau": 5.0, "eta": 0.1, "m": 10}]],
        n_vocab=50,
        steps=40,
    )
    add("mirostat v2 only", spec=[["mirostat_v2", {"seed": 42, "tau": 4.0, "eta": 0.15}]], steps=24)
    add(
        "mirostat v2 ties",
        spec=[["mirostat_v2", {"seed": 43, "tau": 6.0, "eta": 0.1}]],
        kind="ties",
        steps=12,
    )
    add(
        "adaptive_p only",
        spec=[["adaptive_p", {"target": 0.5, "decay": 0.9, "seed": 44}]],
        n_vocab=500,
        steps=40,
    )
    add(
        "adaptive_p off",
        spec=[["adaptive_p", {"target": -1.0, "decay": 0.9, "seed": 45}]],
        n_vocab=500,
        steps=20,
    )
    add("chain k p m t", spec=[["top_k", {"k": 100}], ["top_p", {"p": 0.8, "min_keep": 1}],
                               ["min_p", {"p": 0.1, "min_keep": 1}], ["temp", {"temp": 0.7}],
                               ["dist", {"seed": 46}]], kind="ties")  # fmt: skip
    add("chain m p k", spec=[["min_p", {"p": 0.02}], ["top_p", {"p": 0.7}], ["top_k", {"k": 10}],
                             ["dist", {"seed": 47}]], kind="flat")  # fmt: skip
    return out


def dry_vocab_case(L) -> dict | None:
    """DRY with string breakers on the real SmolLM2 vocabulary (llama.cpp processes them)."""
    if not MODEL.exists():
        return None
    mp = L.llama_model_default_params()
    mp.vocab_only = True
    model = L.llama_model_load_from_file(str(MODEL).encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    strings = ["\n", ":", '"', "*", " and", "###"]

    def piece(t):
        buf = ctypes.create_string_buffer(256)
        n = L.llama_detokenize(vocab, (L.llama_token * 1)(t), 1, buf, 256, False, True)
        return buf.raw[: max(n, 0)]

    def tokenize(b):
        arr = (L.llama_token * 64)()
        n = L.llama_tokenize(vocab, b, len(b), arr, 64, False, False)
        return list(arr[:n])

    pieces = [piece(t) for t in range(n_vocab)]
    # the script's own port of get_overlapping_token_sequences, checked by the parity run
    breakers, seen = [], {}
    for s in (x.encode() for x in strings):
        for tok, word in enumerate(pieces):
            if s in word:
                breakers.append([tok])
                seen.setdefault(tok, set()).add(())
                continue
            pos = word.find(s[:1])
            while pos != -1:
                rest = len(word) - pos
                if rest < len(s) and word[pos:] == s[:rest]:
                    tail = tuple(tokenize(s[rest:]))[:20]
                    if tail not in seen.setdefault(tok, set()):
                        seen[tok].add(tail)
                        breakers.append([tok, *tail])
                pos = word.find(s[:1], pos + 1)
    # possible tokens: single-token breakers, heads with their first tail token, plain tokens
    singles = [b[0] for b in breakers if len(b) == 1][
        :: max(1, len([1 for b in breakers if len(b) == 1]) // 3)
    ][:3]
    pairs = [b for b in breakers if len(b) == 2][:3]
    heads = {b[0] for b in breakers}
    plain = [t for t in range(1000, 2000) if t not in heads][:6]
    support = [
        plain[0],
        plain[1],
        singles[0],
        plain[2],
        pairs[0][0],
        pairs[0][1],
        plain[3],
        plain[4],
    ]
    spec = [["dry_strings", {"multiplier": 2.0, "base": 1.75, "allowed_length": 2, "last_n": 64, "strings": strings}],
            ["dist", {"seed": 51}]]  # fmt: skip
    case = {"name": "dry string breakers (SmolLM2 vocab)", "spec": spec, "params": None, "n_vocab": n_vocab,
            "steps": 64, "seed": 50, "kind": "cycle", "support": support, "dry_breakers": breakers}  # fmt: skip
    case["expected"] = run_oracle(
        L, spec, n_vocab, case["steps"], case["seed"], case["kind"], vocab, support
    )
    L.llama_model_free(model)
    return case


SORT_CPP = r"""
#include <algorithm>
#include <cstdio>
#include <vector>
#include <cstdint>
struct R { int32_t id; float k; float p; };
int main() {
  int32_t h[3];
  while (fread(h, 4, 3, stdin) == 3) {
    int n = h[0], mode = h[1], mid = h[2];
    std::vector<float> k(n); if (fread(k.data(), 4, n, stdin) != (size_t) n) return 1;
    std::vector<R> r(n); for (int i = 0; i < n; i++) r[i] = {i, k[i], 0.0f};
    auto gt = [](const R & a, const R & b) { return a.k > b.k; };
    auto lt = [](const R & a, const R & b) { return a.k < b.k; };
    if (mode == 0) std::sort(r.begin(), r.end(), gt);
    else if (mode == 1) std::sort(r.begin(), r.end(), lt);
    else std::partial_sort(r.begin(), r.begin() + mid, r.end(), gt);
    for (int i = 0; i < n; i++) fwrite(&r[i].id, 4, 1, stdout);
  }
}
"""


def sort_cases() -> list[dict] | None:
    if shutil.which("g++") is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "s.cpp", Path(d) / "s"
        src.write_text(SORT_CPP)
        subprocess.run(["g++", "-O2", str(src), "-o", str(exe)], check=True)
        cases = []
        for i, (n, mode) in enumerate(
            [(n, m) for n in (1, 2, 3, 16, 17, 40, 129, 300, 1000) for m in (0, 1, 2)]
        ):
            mid = max(1, (n * (i % 5 + 1)) // 6)
            cases.append(
                {
                    "n": n,
                    "mode": mode,
                    "mid": mid,
                    "seed": 100 + i,
                    "kind": "ties" if i % 3 else "flat",
                }
            )
        inp = b"".join(
            struct.pack("iii", c["n"], c["mode"], c["mid"])
            + synth_logits(c["seed"], 0, c["n"], c["kind"]).tobytes()
            for c in cases
        )
        out = subprocess.run([str(exe)], input=inp, capture_output=True, check=True).stdout
        off = 0
        for c in cases:
            c["perm"] = np.frombuffer(out, "<i4", c["n"], off).tolist()
            off += 4 * c["n"]
        return cases


def main() -> None:
    L = _oracle()
    OUT.mkdir(parents=True, exist_ok=True)
    result = []
    for case in cases():
        spec = case["spec"] or common_chain_spec(case["params"], case["n_vocab"])
        case["expected"] = run_oracle(
            L,
            spec,
            case["n_vocab"],
            case["steps"],
            case["seed"],
            case["kind"],
            support=case.get("support"),
        )
        result.append(case)
        print(f"{case['name']:50s} {[s['token'] for s in case['expected']][:8]}", file=sys.stderr)
    dry = dry_vocab_case(L)
    if dry is not None:
        result.append(dry)
    (OUT / "parity.json").write_text(
        json.dumps({"n_top": N_TOP, "cases": result}, separators=(",", ":"))
    )
    sc = sort_cases()
    if sc is not None:
        (OUT / "std_sort.json").write_text(json.dumps(sc, separators=(",", ":")))
    print(f"{len(result)} parity cases, {sum(c['steps'] for c in result)} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
