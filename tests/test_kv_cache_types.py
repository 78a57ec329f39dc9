"""Every KV-cache type llama.cpp allows (``-ctk``/``-ctv``): rows stored and read as ggml's
``from_float``/``to_float`` of the type, and the perplexity of both real models with each
cache type against ``llama-perplexity``'s (fixtures: ``scripts/make_kv_cache_type_fixtures.py``)
within 0.5% (in fact to its printed digits), with the same cache size report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from llamacpy import cli, quants
from llamacpy.engine.kv_cache import CACHE_TYPES, KVCache
from llamacpy.errors import UsageError
from llamacpy.gguf.constants import GGMLType
from llamacpy.ops import kv_rows
from llamacpy.ops.attention import kv_row_bytes, load_row, prepare_query, store_row

FIXTURES = Path(__file__).parent / "fixtures" / "generation"
DATA = json.loads((FIXTURES / "kv_cache_types.json").read_text())
GGML = {"q4_0": GGMLType.Q4_0, "q4_1": GGMLType.Q4_1, "q5_0": GGMLType.Q5_0,
        "q5_1": GGMLType.Q5_1, "iq4_nl": GGMLType.IQ4_NL, "bf16": GGMLType.BF16}  # fmt: skip


def test_every_llama_cpp_cache_type_is_accepted() -> None:
    assert set(CACHE_TYPES) == {c["type_k"] for c in DATA["cases"]} | {"f32", "f16"}


@pytest.mark.parametrize("name", sorted(kv_rows.TYPES))
@pytest.mark.parametrize("hd", [32, 64, 128, 256])
def test_rows_are_the_formats_blocks(name, hd) -> None:
    """A stored row is the format's bytes for those values and reads back as its
    dequantization (iq4_nl: the cache's ``quantize_row_iq4_nl_ref``, no scale search)."""
    t = CACHE_TYPES[name]
    rng = np.random.default_rng(hd)
    x = (rng.standard_normal(2 * hd) * rng.uniform(0.01, 10)).astype(np.float32)
    x[3] = 0.0
    x[hd : hd + 32] = 0.0  # an all-zero block
    rb = kv_row_bytes(t, hd)
    cache = np.zeros(3 * rb, np.uint8)
    store_row(x, hd, hd, t, cache, rb)
    assert not cache[:rb].any() and not cache[2 * rb :].any()  # nothing outside the row
    got = cache[rb : 2 * rb]
    fmt = quants.get(GGML[name])
    if name == "iq4_nl":
        want = np.zeros(rb, np.uint8)
        quants.iq4_nl._quantize_row_ref_kernel(x[hd:], want)
    else:
        want = np.frombuffer(fmt.quantize(x[hd:].reshape(1, -1)).tobytes(), np.uint8)
    assert np.array_equal(got, want)
    out = np.full(hd, np.nan, np.float32)
    load_row(cache, rb, hd, t, out)
    assert np.array_equal(out, fmt.dequantize(got, hd))


@pytest.mark.parametrize("name", sorted(set(kv_rows.TYPES) - {"bf16"}))
def test_dot_is_the_blocks_dot_product(name) -> None:
    """K.q of a quantized row = sum over blocks of d_k * d_q * (k . q) (+ m_k * s_q)."""
    t, hd = CACHE_TYPES[name], 160  # five blocks (iq4_nl: two pairs and one left)
    rng = np.random.default_rng(1)
    k, q = rng.standard_normal((2, hd)).astype(np.float32)
    rb = kv_row_bytes(t, hd)
    cache = np.zeros(rb, np.uint8)
    store_row(k, 0, hd, t, cache, 0)
    kd = np.zeros(hd, np.float32)
    load_row(cache, 0, hd, t, kd)
    qv, qq = np.zeros(hd, np.float32), np.zeros(hd, np.int32)
    prepare_query(q, 0, hd, t, qv, qq)
    qd = (qq.reshape(-1, 32) * qv[: hd // 32, None]).reshape(-1)
    got = kv_rows.dot(qv, qq, cache, 0, hd, t, np.zeros(48, np.float32))
    assert got == pytest.approx(float(np.dot(kd.astype(np.float64), qd)), rel=2e-3, abs=1e-3)


def test_head_sizes_the_blocks_do_not_fit_are_refused() -> None:
    for name in ("q4_0", "q5_1", "iq4_nl"):
        with pytest.raises(UsageError, match=f"a {name} KV cache needs a head size multiple of 32"):
            KVCache(1, 1, 48, 4, type_k="f16", type_v=name)
    KVCache(1, 1, 48, 4, type_k="bf16", type_v="bf16")  # bf16 needs no blocks


def _model(name, smollm2_path, gemma3_path):
    return smollm2_path if name == "smollm2-135m" else gemma3_path


@pytest.mark.parametrize(
    "case", DATA["cases"], ids=lambda c: f"{c['model']}-{c['type_k']}-{c['type_v']}"
)
def test_perplexity_with_each_cache_type_matches_llama_perplexity(
    case, smollm2_path, gemma3_path, capsys
) -> None:
    path = _model(case["model"], smollm2_path, gemma3_path)
    code = cli.main(["perplexity", "-m", str(path), "-f", str(FIXTURES / DATA["file"]),
                     "-c", str(DATA["n_ctx"]), "--chunks", str(DATA["chunks"]),
                     "-b", str(DATA["n_batch"]), "-t", "2", "-ctk", case["type_k"],
                     "-ctv", case["type_v"]])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    ppl = float(re.search(r"Final estimate: PPL = (\d+\.\d+)", out)[1])
    # (the bound is 0.5%; every case gives llama.cpp's printed digits)
    assert ppl == pytest.approx(case["ppl"], rel=1e-4)
    kv = sorted(set(re.findall(r"llama_kv_cache: size = .*", err)))
    if case["type_k"] == case["type_v"]:  # (mixed types: K and V rows share one stride here)
        assert kv == case["kv"]
