"""``llamacpy quantize`` against llama-quantize, and its own rules, options and errors.

Real-model tests compare with fixtures made by ``scripts/make_quantize_fixtures.py`` (which
ran llama-quantize): every case's per-tensor types and header bytes (metadata + tensor infos)
on both models, and for some SmolLM2 cases the tensor data too (whole-file sha256; else
per tensor, with K-quant tensors allowed a 0.1% share of differing blocks).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from llamacpy import cli, quants
from llamacpy.cli import quantize as cli_quantize
from llamacpy.errors import GGUFError, UsageError
from llamacpy.gguf import GGMLType, GGUFReader, GGUFValueType, GGUFWriter
from llamacpy.gguf.split import GGUFModelFile
from llamacpy.quantize import (
    KVOverride,
    ModelInfo,
    QuantizeParams,
    TensorSpec,
    TypeOptions,
    choose_types,
    load_imatrix,
    loader_order,
    parse_ggml_type,
    parse_preset,
    plan_quantization,
    quantize_model,
)
from llamacpy.quantize import convert as qconvert
from llamacpy.quantize import model as qmodel
from llamacpy.quantize.presets import PRESETS, ggml_name

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "quantize"
K_QUANTS = {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K}
K_QUANTS |= {GGMLType.IQ4_XS}


@cache
def _script():
    """scripts/make_quantize_fixtures.py (its synthetic imatrix files are rebuilt here)."""
    spec = importlib.util.spec_from_file_location(
        "make_quantize_fixtures", ROOT / "scripts" / "make_quantize_fixtures.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@cache
def _fixture(model: str) -> dict:
    return json.loads((FIXTURES / f"{model}.json").read_text())


@cache
def _blocks(model: str) -> dict[str, np.ndarray]:
    path = FIXTURES / f"{model}.blocks.npz"
    if not path.exists():
        return {}
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _parser() -> argparse.ArgumentParser:
    p = cli._Parser(prog="llamacpy")
    cli_quantize.register(p.add_subparsers())
    return p


def _case_params(model_path: Path, case: dict) -> tuple[object, QuantizeParams]:
    *opts, preset = case["args"]
    argv = ["quantize", "--allow-requantize", "-q", *opts, str(model_path), "out.gguf", preset]
    args = _parser().parse_args(argv)
    _, _, p, params = cli_quantize.build_params(args)
    return p, params


@cache
def _input_sha256(path: Path) -> str:
    return _sha256(path)


def _sha256(path: Path, start: int = 0, end: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        h.update(f.read() if end is None else f.read(end - start))
    return h.hexdigest()


@pytest.fixture
def model_path(request: pytest.FixtureRequest):
    """The real model a parametrized test names (pulled through the registry fixtures)."""
    return request.getfixturevalue(
        {"smollm2-135m": "smollm2_path", "gemma3-270m": "gemma3_path"}[request.param]
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory):
    """A directory per model holding the synthetic imatrix files (made once per module)."""
    made: dict[Path, Path] = {}

    def get(model_path: Path) -> Path:
        if model_path not in made:
            d = tmp_path_factory.mktemp("quantize")
            _script().write_imatrix_files(model_path, d)
            made[model_path] = d
        return made[model_path]

    return get


@cache
def _opened(model_path: Path) -> GGUFModelFile:
    """The model, opened once per test session (parsing a 262k vocabulary takes a while)."""
    return GGUFModelFile(model_path)


def _cases(model: str) -> list[str]:
    return sorted(_fixture(model)["cases"])


ALL_CASES = [(m, c) for m in ("smollm2-135m", "gemma3-270m") for c in _cases(m)]


# --------------------------------------------------------------------------- real models
@pytest.mark.real_model
@pytest.mark.parametrize(
    ("model_path", "case"),
    ALL_CASES,
    indirect=["model_path"],
    ids=[f"{m}-{c}" for m, c in ALL_CASES],
)
def test_types_and_header_match_llama_quantize(
    model_path: Path, case: str, workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-tensor types, order, shapes and the header bytes (all metadata) of every case."""
    fx = _fixture(_model_name(model_path))
    entry = fx["cases"][case]
    monkeypatch.chdir(workdir(model_path))  # imatrix paths are relative, as in the fixture run
    assert _input_sha256(model_path) == fx["input_sha256"]
    _, params = _case_params(model_path, entry)
    plan = plan_quantization(_opened(model_path), params)
    assert [[j.name, list(j.shape)] for j in plan.jobs] == fx["tensors"]
    got = [t.name for t in (j.target for j in plan.jobs)]
    want = entry["types"].split()
    diff = [f"{j.name}: {g} != {w}" for j, g, w in zip(plan.jobs, got, want) if g != w]
    assert not diff, "\n".join(diff[:30])
    header = plan.header_bytes()
    assert len(header) == entry["header_size"]
    if hashlib.sha256(header).hexdigest() != entry["header_sha256"]:
        assert list(plan.records) == entry.get("keys", list(plan.records)), "key order differs"
        pytest.fail("header bytes differ from llama-quantize's (metadata values or tensor infos)")
    assert (
        sum(j.nbytes_out + (-j.nbytes_out % 32) for j in plan.jobs) + len(header)
        == entry["file_size"]
    )


def _model_name(path: Path) -> str:
    return "smollm2-135m" if "SmolLM2" in path.name else "gemma3-270m"


DATA_CASES = [
    ("smollm2-135m", c)
    for c in (
        "Q8_0",
        "Q4_0",
        "Q4_K_M",
        "F16",
        "imatrix-Q4_K_M",
        "imatrix-dat-IQ4_NL",
        "TQ1_0",
        "TQ2_0",
        "Q2_0",
        "tensor-type-NVFP4",
    )
]
DATA_CASES.append(("gemma3-270m", "Q1_0"))
# cases checked on the first blocks only (IQ4_NL's search is slow: ~1 min for the whole model)
PARTIAL = {"imatrix-dat-IQ4_NL": ("blk.0.", "blk.1.", "blk.2.", "blk.29.")}


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_path", "case"), DATA_CASES, indirect=["model_path"], ids=[c for _, c in DATA_CASES]
)
def test_requantized_file_matches_llama_quantize(
    model_path: Path, case: str, tmp_path: Path, workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acceptance bar: the same bytes as llama-quantize (K-quant tensors: >= 99.9% of
    blocks identical, everything else byte for byte)."""
    name = _model_name(model_path)
    entry = _fixture(name)["cases"][case]
    monkeypatch.chdir(workdir(model_path))
    _, params = _case_params(model_path, entry)
    if case in PARTIAL:
        plan = plan_quantization(_opened(model_path), params)
        picked = [i for i, j in enumerate(plan.jobs) if j.name.startswith(PARTIAL[case])]
        with qconvert.Pipeline([plan.jobs[i] for i in picked], 2) as pipe:
            data = {plan.jobs[i].name: pipe.result(k) for k, i in enumerate(picked)}
        assert any(plan.jobs[i].convert for i in picked)
        _compare_tensors(name, case, [(n, plan.types()[n], d) for n, d in data.items()])
        return
    out = tmp_path / "out.gguf"
    quantize_model(model_path, out, dataclasses.replace(params, nthread=2))
    if _sha256(out) == entry["file_sha256"]:
        return  # byte-identical file
    assert _sha256(out, 0, entry["header_size"]) == entry["header_sha256"]
    with GGUFReader(out) as r:
        _compare_tensors(name, case, [(t.name, t.type, t.raw) for t in r.tensors])


def _compare_tensors(model: str, case: str, tensors: list[tuple[str, GGMLType, object]]) -> None:
    """Each tensor's bytes against the fixture: identical, or (K-quants with block hashes)
    at least 99.9% of blocks identical."""
    fx = _fixture(model)
    entry = fx["cases"][case]
    sha = {name: h for (name, _), h in zip(fx["tensors"], entry["tensor_sha"])}
    blocks = _blocks(model)
    problems = []
    for name, t, raw in tensors:
        raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
        if hashlib.sha256(raw.tobytes()).hexdigest()[:16] == sha[name]:
            continue
        key = f"{case}/{name}"
        if t not in K_QUANTS or key not in blocks:
            problems.append(f"{name} ({t.name}) differs")
            continue
        ours = _script().block_hashes(raw, t)
        assert ours.size == blocks[key].size
        share = float(np.mean(ours == blocks[key]))
        if share < 0.999:
            problems.append(f"{name}: only {share:.4%} of blocks identical")
    assert not problems, "\n".join(problems)


@pytest.mark.real_model
def test_q1_0_refuses_rows_with_no_fallback_as_llama_quantize(smollm2_path: Path) -> None:
    """SmolLM2's rows of 576 are not a multiple of Q1_0's 128 and Q1_0 has no fallback type:
    llama-quantize fails with this message, and so do we (Gemma-3's 640 quantize: a case)."""
    params = QuantizeParams(parse_preset("Q1_0").ftype, allow_requantize=True)
    with pytest.raises(UsageError, match="no tensor type fallback is defined for type q1_0"):
        plan_quantization(_opened(smollm2_path), params)


@pytest.mark.real_model
def test_requantizing_needs_the_flag(smollm2_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.gguf"
    with pytest.raises(
        UsageError, match=r"requantizing from type q4_1 is disabled.*--allow-requantize"
    ):
        quantize_model(smollm2_path, out, QuantizeParams(parse_preset("Q8_0").ftype))
    assert not out.exists()


# --------------------------------------------------------------------------- a tiny model
N_EMBD, N_FF, N_VOCAB = 256, 512, 320


def _tiny_model(
    path: Path,
    *,
    output: bool = True,
    n_layer: int = 2,
    ne0: int = N_EMBD,
    dtype=GGMLType.F32,
    experts: int = 0,
) -> dict[str, np.ndarray]:
    """A small llama-architecture F32 model written in a scrambled tensor order (with
    ``experts``: a 3-D ``ffn_up_exps`` tensor per layer as well)."""
    rng = np.random.default_rng(7)
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("general.name", "tiny")
    w.add("general.file_type", 0, GGUFValueType.UINT32)
    for k, v in (
        ("block_count", n_layer),
        ("embedding_length", ne0),
        ("feed_forward_length", N_FF),
    ):
        w.add(f"llama.{k}", v, GGUFValueType.UINT32)
    w.add("llama.attention.head_count", 4, GGUFValueType.UINT32)
    w.add("llama.attention.head_count_kv", 1, GGUFValueType.UINT32)
    if experts:
        w.add("llama.expert_count", experts, GGUFValueType.UINT32)
        w.add("llama.expert_used_count", 2, GGUFValueType.UINT32)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (ne0, N_VOCAB)}
    if output:
        shapes["output.weight"] = (ne0, N_VOCAB)
    for i in reversed(range(n_layer)):  # blk.1 before blk.0 in the file
        b = f"blk.{i}."
        shapes |= {
            b + "ffn_down.weight": (N_FF, ne0),
            b + "attn_q.weight": (ne0, ne0),
            b + "attn_k.weight": (ne0, 64),
            b + "attn_v.weight": (ne0, 64),
            b + "attn_output.weight": (ne0, ne0),
            b + "ffn_gate.weight": (ne0, N_FF),
            b + "ffn_up.weight": (ne0, N_FF),
            b + "attn_norm.weight": (ne0,),
            b + "ffn_norm.weight": (ne0,),
        }
        if experts:
            shapes[b + "ffn_up_exps.weight"] = (ne0, N_FF, experts)
    shapes["output_norm.weight"] = (ne0,)
    data = {}
    for name, shape in shapes.items():
        x = rng.standard_normal(tuple(reversed(shape))).astype(np.float32)
        data[name] = x
        stored = x if dtype == GGMLType.F32 or len(shape) == 1 else quants.quantize(x, dtype)
        w.add_tensor(name, dtype if len(shape) > 1 else GGMLType.F32, shape, stored)
    w.write()
    return data


def test_tiny_model_q4_0_types_data_and_metadata(tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    data = _tiny_model(src)
    out = tmp_path / "q4_0.gguf"
    report = quantize_model(src, out, QuantizeParams(parse_preset("Q4_0").ftype, nthread=1))
    with GGUFReader(out) as r:
        names = [t.name for t in r.tensors]
        assert names == loader_order(names) and names[0] == "output.weight"
        types = {t.name: t.type for t in r.tensors}
        assert types["output.weight"] == GGMLType.Q6_K  # the output tensor gets more bits
        assert types["token_embd.weight"] == GGMLType.Q4_0  # not tied: an ordinary tensor
        assert types["blk.0.attn_norm.weight"] == GGMLType.F32
        assert types["blk.1.ffn_down.weight"] == GGMLType.Q4_0
        for t in r.tensors:
            want = quants.quantize(data[t.name], t.type) if t.type != GGMLType.F32 else data[t.name]
            assert np.array_equal(np.asarray(t.raw), np.asarray(want).view(np.uint8).reshape(-1)), (
                t.name
            )
        keys = list(r.fields)
        assert keys[-2:] == ["general.quantization_version", "general.file_type"]
        assert r.get("general.file_type") == 2 and r.get("general.quantization_version") == 2
    assert report.size_out < report.size_in
    lines = report.summary_lines()
    assert lines[0].startswith("model size  =") and "BPW" in lines[1]


def test_mxfp4_moe_puts_the_experts_on_mxfp4(tmp_path: Path) -> None:
    """MXFP4_MOE (how gpt-oss files are made): 3-D expert tensors become MXFP4, expert by
    expert as ggml_quantize_chunk writes them; every other matrix and the output Q8_0."""
    src = tmp_path / "moe.gguf"
    data = _tiny_model(src, experts=3)
    out = tmp_path / "mxfp4.gguf"
    quantize_model(src, out, QuantizeParams(parse_preset("MXFP4_MOE").ftype, nthread=1))
    with GGUFReader(out) as r:
        types = {t.name: t.type for t in r.tensors}
        assert types["blk.0.ffn_up_exps.weight"] == types["blk.1.ffn_up_exps.weight"]
        assert types["blk.1.ffn_up_exps.weight"] == GGMLType.MXFP4
        assert types["output.weight"] == types["blk.0.ffn_up.weight"] == GGMLType.Q8_0
        assert types["blk.0.attn_norm.weight"] == GGMLType.F32
        for t in r.tensors:
            want = quants.quantize(data[t.name], t.type) if t.type != GGMLType.F32 else data[t.name]
            assert np.array_equal(np.asarray(t.raw), np.asarray(want).view(np.uint8).reshape(-1))
        assert r.get("general.file_type") == int(parse_preset("MXFP4_MOE").ftype)


def test_tied_embeddings_and_fallbacks(tmp_path: Path) -> None:
    """No output.weight: token_embd takes the output rules; rows of 288 (not a multiple of
    256) push K-quants onto their 32-block fallbacks."""
    src = tmp_path / "tiny.gguf"
    _tiny_model(src, output=False, ne0=288)
    with GGUFModelFile(src) as m:
        plan = plan_quantization(m, QuantizeParams(parse_preset("Q4_K_M").ftype))
    types = plan.types()
    assert types["token_embd.weight"] == GGMLType.Q8_0  # 288 % 256: output rule gives Q8_0
    assert types["blk.0.attn_q.weight"] == GGMLType.Q5_0  # Q4_K -> Q5_0
    assert types["blk.1.attn_v.weight"] == GGMLType.Q8_0  # Q6_K (last layer) -> Q8_0
    assert types["blk.0.attn_v.weight"] == GGMLType.Q5_0
    assert types["blk.1.ffn_down.weight"] == GGMLType.Q6_K  # 512 columns: no fallback
    assert ("blk.0.attn_q.weight", GGMLType.Q4_K, GGMLType.Q5_0) in plan.fallbacks


def test_options_change_types(tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    _tiny_model(src)
    ft = parse_preset("Q4_K_M").ftype

    def types(**kw):
        with GGUFModelFile(src) as m:
            return plan_quantization(m, QuantizeParams(ft, **kw)).types()

    base = types()
    assert base["output.weight"] == GGMLType.Q6_K and base["blk.1.attn_v.weight"] == GGMLType.Q6_K
    assert types(pure=True)["blk.1.attn_v.weight"] == GGMLType.Q4_K
    assert types(pure=True)["output.weight"] == GGMLType.Q4_K  # --pure skips the output rule too
    assert types(quantize_output_tensor=False)["output.weight"] == GGMLType.F32
    assert types(output_tensor_type=GGMLType.Q8_0)["output.weight"] == GGMLType.Q8_0
    assert types(token_embedding_type=GGMLType.Q5_1)["token_embd.weight"] == GGMLType.Q5_1
    tt = types(tensor_types=(("attn_(q|k)", GGMLType.Q8_0), ("attn", GGMLType.Q5_0)))
    assert tt["blk.0.attn_q.weight"] == GGMLType.Q8_0 and tt["blk.1.attn_k.weight"] == GGMLType.Q8_0
    assert tt["blk.0.attn_v.weight"] == GGMLType.Q5_0  # first matching pattern wins
    assert tt["blk.0.ffn_up.weight"] == GGMLType.Q4_K
    # --tensor-type only applies when the preset's type is a quantized one (as in llama.cpp)
    with GGUFModelFile(src) as m:
        f16 = QuantizeParams(parse_preset("F16").ftype, tensor_types=(("attn", GGMLType.Q8_0),))
        assert plan_quantization(m, f16).types()["blk.0.attn_q.weight"] == GGMLType.F16


def test_policy_counts_attn_v_and_uses_more_bits() -> None:
    """Q4_K_M gives attn_v/ffn_down Q6_K in the first and last eighth and every third layer."""
    n = 16
    tensors = [
        TensorSpec(f"blk.{i}.{k}.weight", (256, 256))
        for i in range(n)
        for k in ("attn_v", "ffn_down")
    ]
    plan = choose_types(
        ModelInfo("llama", n),
        loader_order_specs(tensors),
        TypeOptions(parse_preset("Q4_K_M").ftype),
    )
    more = [i for i in range(n) if plan.choices[2 * i + 1].target == GGMLType.Q6_K]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [c.target for c in plan.choices[0::2]] == [c.target for c in plan.choices[1::2]]


def loader_order_specs(specs: list[TensorSpec]) -> list[TensorSpec]:
    by = {s.name: s for s in specs}
    return [by[n] for n in loader_order(by)]


def test_loader_order_sorts_by_block_number() -> None:
    names = ["blk.10.a", "output.weight", "blk.2.b", "blk.2.a", "token_embd.weight", "blk.x"]
    assert loader_order(names) == [
        "blk.x", "output.weight", "token_embd.weight", "blk.2.a", "blk.2.b", "blk.10.a"
    ]  # fmt: skip


def test_dry_run_and_same_file_and_atomic_output(tmp_path: Path, monkeypatch) -> None:
    src = tmp_path / "tiny.gguf"
    _tiny_model(src)
    ft = parse_preset("Q8_0").ftype
    lines: list[str] = []
    rep = quantize_model(src, None, QuantizeParams(ft, dry_run=True), log=lines.append)
    assert rep.output is None and len(lines) == len(rep.plan.jobs)
    assert "converting to q8_0" in lines[-1] or "converting to q8_0" in "".join(lines)
    with pytest.raises(UsageError, match="input and output files are the same"):
        quantize_model(src, src, QuantizeParams(ft))
    out = tmp_path / "out.gguf"

    def boom(job, out, row0, nrows, mat):
        if job.name == "blk.1.ffn_up.weight":
            raise RuntimeError("disk on fire")
        return real(job, out, row0, nrows, mat)

    real = qconvert._convert_rows
    monkeypatch.setattr(qconvert, "_convert_rows", boom)
    with pytest.raises(RuntimeError, match="disk on fire"):
        quantize_model(src, out, QuantizeParams(ft))
    assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))


def test_split_input_gives_the_same_file(tmp_path: Path) -> None:
    """A split model (first shard given) quantizes to the same single file, without split keys."""
    from llamacpy.gguf import split_gguf

    src = tmp_path / "tiny.gguf"
    _tiny_model(src)
    shards = split_gguf(src, tmp_path / "part", max_tensors=7)
    assert len(shards) > 1
    ft = parse_preset("Q4_0").ftype
    quantize_model(src, tmp_path / "a.gguf", QuantizeParams(ft))
    quantize_model(shards[0], tmp_path / "b.gguf", QuantizeParams(ft))
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    with GGUFReader(tmp_path / "b.gguf") as r:
        assert not any(k.startswith("split.") for k in r.fields)


def test_copy_keeps_data_and_reorders(tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    data = _tiny_model(src)
    out = tmp_path / "copy.gguf"
    quantize_model(src, out, QuantizeParams(parse_preset("COPY").ftype, only_copy=True))
    with GGUFReader(out) as r:
        assert r.get("general.file_type") == 0  # the input's own file type
        for t in r.tensors:
            assert t.type == GGMLType.F32 and np.array_equal(t.data, data[t.name])


def test_stacked_experts_use_one_imatrix_row_each(tmp_path: Path, monkeypatch) -> None:
    """3-D expert tensors: every expert matrix is quantized with its own importance row."""
    rng = np.random.default_rng(3)
    w = GGUFWriter(tmp_path / "moe.gguf")
    w.add("general.architecture", "llama")
    for k, v in (("block_count", 1), ("expert_count", 4), ("attention.head_count", 4)):
        w.add(f"llama.{k}", v, GGUFValueType.UINT32)
    experts = rng.standard_normal((4, 40, 256)).astype(np.float32)  # (n_expert, rows, ne0)
    w.add_tensor("blk.0.ffn_up_exps.weight", GGMLType.F32, (256, 40, 4), experts)
    w.add_tensor("token_embd.weight", GGMLType.F32, (256, 8), experts[0, :8])
    w.write()
    im = np.linspace(0.1, 3.0, 4 * 256, dtype=np.float32)
    imx = qmodel.ImportanceMatrix("im.gguf", {"blk.0.ffn_up_exps.weight": im})
    out = tmp_path / "q.gguf"
    ft = parse_preset("Q4_K_S").ftype
    monkeypatch.setattr(qconvert, "CHUNK_ELEMENTS", 256 * 16)  # several chunks per expert
    params = QuantizeParams(ft, imatrix=imx, nthread=2)
    with GGUFModelFile(tmp_path / "moe.gguf") as m:
        job = plan_quantization(m, params).jobs[1]
        assert job.imatrix.shape == (4, 256)
        assert [c[2] for c in qconvert.chunks(job)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    quantize_model(tmp_path / "moe.gguf", out, params)
    with GGUFReader(out) as r:
        t = r.tensor("blk.0.ffn_up_exps.weight")
        assert t.type == GGMLType.Q4_K and t.shape == (256, 40, 4)
        want = np.stack(
            [quants.quantize(experts[e], "Q4_K", imatrix=im.reshape(4, 256)[e]) for e in range(4)]
        )
        assert np.array_equal(np.asarray(t.raw), want.reshape(-1))


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.1.ffn_norm.weight"])
def test_nan_weights_are_refused(tmp_path: Path, name: str) -> None:
    """Like llama.cpp's loader: NaN/inf anywhere in the input (converted or copied) is an error."""
    src = tmp_path / "tiny.gguf"
    data = _tiny_model(src)
    with GGUFReader(src) as r:
        t = r.tensor(name)
        offset = t.data_offset
    raw = bytearray(src.read_bytes())
    raw[offset + 8 : offset + 12] = np.array([np.nan], np.float32).tobytes()
    src.write_bytes(bytes(raw))
    out = tmp_path / "o.gguf"
    with pytest.raises(GGUFError, match=r"invalid data: found 1 NaN"):
        quantize_model(src, out, QuantizeParams(parse_preset("Q8_0").ftype))
    assert not out.exists() and data


def test_weights_llama_cpp_cannot_quantize_to_iq3_are_refused(tmp_path: Path) -> None:
    """llama.cpp's IQ3 quantizers abort the process on finite weights of about 1e12 and up
    (their distances overflow): ours stop with an error naming the tensor and the row."""
    src = tmp_path / "tiny.gguf"
    _tiny_model(src)
    with GGUFReader(src) as r:
        t = r.tensor("blk.0.ffn_down.weight")
        offset, ne0 = t.data_offset + 4 * 3 * t.shape[0], t.shape[0]
    raw = bytearray(src.read_bytes())
    raw[offset + 4 * 256 : offset + 4 * 512] = np.full(256, 1e13, np.float32).tobytes()
    src.write_bytes(bytes(raw))
    out = tmp_path / "o.gguf"
    msg = r"IQ3_S: .*aborts on row 3, values 256\.\.511: .*'blk\.0\.ffn_down\.weight'"
    with pytest.raises(GGUFError, match=msg):
        quantize_model(src, out, QuantizeParams(parse_preset("IQ3_S").ftype))
    assert not out.exists() and ne0 == 512


def test_validation_of_blocks() -> None:
    from llamacpy.quantize.validate import invalid_data

    q = quants.quantize(np.ones((2, 256), np.float32), "Q4_K").reshape(-1).copy()
    assert invalid_data(GGMLType.Q4_K, q) is None
    q.view([("d", "<f2"), ("rest", "u1", (142,))])["d"][0] = np.inf
    assert "infinity in the 'd' scales" in invalid_data(GGMLType.Q4_K, q)
    bf = np.array([0x7F80, 0x3F80], np.uint16).view(np.uint8)
    assert "infinity" in invalid_data(GGMLType.BF16, bf)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_validation_counts_nans_and_infinities_of_either_sign(dtype) -> None:
    from llamacpy.quantize.validate import _count

    x = np.array([0.0, -0.0, 1.5, -2.0, np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal,
                  -np.finfo(dtype).max], dtype)  # fmt: skip
    assert _count(x) == (0, 0)
    assert _count(x[:0]) == (0, 0)
    y = np.concatenate([x, np.array([np.nan, -np.nan, np.inf, -np.inf, np.nan], dtype)])
    assert _count(y) == (3, 2)
    assert _count(y[::2]) == (int(np.isnan(y[::2]).sum()), int(np.isinf(y[::2]).sum()))


def test_requantize_rules(tmp_path: Path) -> None:
    src = tmp_path / "q8.gguf"
    _tiny_model(src, dtype=GGMLType.Q8_0)
    # nothing changes type: allowed without the flag
    out = tmp_path / "same.gguf"
    quantize_model(src, out, QuantizeParams(parse_preset("Q8_0").ftype, pure=True,
                                            output_tensor_type=GGMLType.Q8_0))  # fmt: skip
    with pytest.raises(UsageError, match="requantizing from type q8_0 is disabled"):
        quantize_model(src, tmp_path / "x.gguf", QuantizeParams(parse_preset("Q4_0").ftype))
    out = tmp_path / "q4.gguf"
    quantize_model(src, out, QuantizeParams(parse_preset("Q4_0").ftype, allow_requantize=True))
    with GGUFReader(src) as a, GGUFReader(out) as b:
        t = a.tensor("blk.0.attn_q.weight")
        x = quants.dequantize(t)
        assert np.array_equal(
            np.asarray(b.tensor(t.name).raw), quants.quantize(x, "Q4_0").reshape(-1)
        )


def test_imatrix_required_and_used(tmp_path: Path) -> None:
    src = tmp_path / "tiny.gguf"
    _tiny_model(src)
    q2ks = parse_preset("Q2_K_S").ftype
    with pytest.raises(UsageError, match="requires an importance matrix"):
        quantize_model(src, tmp_path / "o.gguf", QuantizeParams(q2ks))
    data = {}
    with GGUFReader(src) as r:
        for t in r.tensors:
            if len(t.shape) == 2:
                data[t.name] = np.linspace(0.5, 2.0, t.shape[0], dtype=np.float32)
    im = qmodel.ImportanceMatrix("im.gguf", data, ("d.txt",), 9)
    out = tmp_path / "o.gguf"
    quantize_model(src, out, QuantizeParams(q2ks, imatrix=im))
    with GGUFReader(out) as r, GGUFReader(src) as s:
        assert r.get("quantize.imatrix.file") == "im.gguf"
        assert r.get("quantize.imatrix.dataset") == "d.txt"
        assert r.get("quantize.imatrix.entries_count") == len(data)
        assert r.get("quantize.imatrix.chunks_count") == 9
        t = r.tensor("blk.0.ffn_up.weight")
        x = s.tensor(t.name).data
        want = quants.quantize(x, t.type, imatrix=data[t.name])
        assert np.array_equal(np.asarray(t.raw), want.reshape(-1))
        assert not np.array_equal(want, quants.quantize(x, t.type))
    bad = dataclasses.replace(im, data={**data, "blk.0.attn_q.weight": np.ones(7, np.float32)})
    with pytest.raises(UsageError, match="imatrix size 7 is different"):
        quantize_model(src, tmp_path / "p.gguf", QuantizeParams(q2ks, imatrix=bad))


# --------------------------------------------------------------------------- imatrix files
def test_imatrix_gguf_and_legacy_agree(smollm2_path: Path, tmp_path: Path) -> None:
    _script().write_imatrix_files(smollm2_path, tmp_path)
    g = load_imatrix(tmp_path / _script().IMATRIX_GGUF)
    d = load_imatrix(tmp_path / _script().IMATRIX_DAT)
    assert not g.is_legacy and d.is_legacy
    assert g.datasets == ("synthetic-dataset.txt",) and g.chunk_count == 42
    assert d.datasets == ("legacy-dataset.txt",) and d.chunk_count == 17
    assert set(g.data) == set(d.data) and len(g.data) == 21
    for k in g.data:
        np.testing.assert_allclose(g.data[k], d.data[k], rtol=1e-6)
    f = g.filtered(include=["attn_"])
    assert f.data and all("attn_" in k for k in f.data)
    assert not any("ffn" in k for k in g.filtered(exclude=["ffn"]).data)
    with pytest.raises(UsageError, match="cannot be used together"):
        g.filtered(include=["a"], exclude=["b"])


def test_imatrix_errors(tmp_path: Path) -> None:
    def gguf(name: str, tensors: dict, meta: bool = True) -> Path:
        w = GGUFWriter(tmp_path / name)
        if meta:
            w.add("imatrix.datasets", ["x"], GGUFValueType.ARRAY, GGUFValueType.STRING)
            w.add("imatrix.chunk_count", 1, GGUFValueType.UINT32)
            w.add("imatrix.chunk_size", 512, GGUFValueType.UINT32)
        for n, a in tensors.items():
            w.add_tensor(n, GGMLType.F32, tuple(reversed(a.shape)), a)
        w.write()
        return tmp_path / name

    ones = np.ones((1, 32), np.float32)
    cnt = np.array([[4.0]], np.float32)
    with pytest.raises(UsageError, match="missing imatrix metadata"):
        load_imatrix(gguf("a.gguf", {"w.in_sum2": ones, "w.counts": cnt}, meta=False))
    with pytest.raises(UsageError, match="mismatched sums and counts"):
        load_imatrix(gguf("b.gguf", {"w.in_sum2": ones}))
    with pytest.raises(UsageError, match="non-finite"):
        load_imatrix(gguf("c.gguf", {"w.in_sum2": ones * np.inf, "w.counts": cnt}))
    im = load_imatrix(gguf("d.gguf", {"w.in_sum2": ones * 2, "w.counts": cnt * 0}))
    assert np.array_equal(im.data["w"], np.ones(32, np.float32))  # count 0: weights of 1
    im = load_imatrix(gguf("e.gguf", {"w.in_sum2": ones * 2, "w.counts": cnt}))
    assert np.array_equal(im.data["w"], np.full(32, 0.5, np.float32))
    (tmp_path / "f.dat").write_bytes(b"\x00\x00\x00\x00")
    with pytest.raises(UsageError, match="no data"):
        load_imatrix(tmp_path / "f.dat")
    with pytest.raises(UsageError, match="no such imatrix"):
        load_imatrix(tmp_path / "missing.dat")


# --------------------------------------------------------------------------- parsing
def test_presets_and_types() -> None:
    assert parse_preset("q4_k_m").name == "Q4_K_M"
    assert parse_preset("Q4_K").ftype == parse_preset("Q4_K_M").ftype
    assert parse_preset("15").name == "Q4_K"  # numbers: the first preset with that ftype
    assert parse_preset("0").name == "F32" and parse_preset("COPY").only_copy
    with pytest.raises(UsageError, match="invalid quantization type"):
        parse_preset("Q9_9")
    assert parse_ggml_type("q6_k") == GGMLType.Q6_K and ggml_name(GGMLType.Q6_K) == "q6_K"
    assert ggml_name(GGMLType.IQ4_NL) == "iq4_nl" and ggml_name(GGMLType.BF16) == "bf16"
    wanted = "F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S Q4_K_M"
    wanted += " Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS COPY"
    assert set(wanted.split()) <= {p.name for p in PRESETS}


def test_kv_override_parsing() -> None:
    o = KVOverride.parse("a.b=int:-12x")
    assert (o.key, o.kind, o.value) == ("a.b", "int", -12) and o.field() == (
        12,
        GGUFValueType.UINT32,
    )
    assert KVOverride.parse("f=float:2.5e1abc").field() == (25.0, GGUFValueType.FLOAT32)
    assert KVOverride.parse("b=bool:false").field() == (False, GGUFValueType.BOOL)
    assert KVOverride.parse("s=str:a=b:c").field() == ("a=b:c", GGUFValueType.STRING)
    for bad in ("nokey", "=int:1", "k=long:1", "k=bool:yes", "k=str:" + "x" * 128):
        with pytest.raises(UsageError):
            KVOverride.parse(bad)


# --------------------------------------------------------------------------- the command
def _main(monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    return cli.main(list(argv))


def test_cli_quantizes_and_reports(tmp_path: Path, monkeypatch, capsys) -> None:
    src = tmp_path / "tiny.gguf"
    _tiny_model(src)
    out = tmp_path / "t-q8.gguf"
    assert _main(monkeypatch, "quantize", str(src), str(out), "q8_0", "1") == 0
    cap = capsys.readouterr()
    assert "model size" in cap.out and "quant size" in cap.out and f"wrote {out}" in cap.out
    assert out.exists()
    # TYPE right after IN: the output goes beside IN as ggml-model-TYPE.gguf
    assert _main(monkeypatch, "quantize", "-q", str(src), "Q4_0") == 0
    assert (tmp_path / "ggml-model-Q4_0.gguf").exists()
    assert _main(monkeypatch, "quantize", "-v", "--dry-run", str(src), "Q4_K_M") == 0
    assert "converting to q6_K" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["x.gguf", "o.gguf", "Q9_0"], "invalid quantization type 'Q9_0'"),
        (["x.gguf", "o.gguf"], "missing TYPE"),
        (["x.gguf", "o.gguf", "Q4_0", "many"], "invalid NTHREADS"),
        (["--tensor-type", "attn_v", "x.gguf", "o.gguf", "Q4_0"], "malformed tensor type"),
        (["--override-kv", "a=b", "x.gguf", "o.gguf", "Q4_0"], "invalid type for KV override"),
    ],
)
def test_cli_errors_are_one_line(argv, message, tmp_path: Path, monkeypatch, capsys) -> None:
    src = tmp_path / "x.gguf"
    _tiny_model(src, n_layer=1)
    monkeypatch.chdir(tmp_path)
    assert _main(monkeypatch, "quantize", *argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("llamacpy: error: ") and message in err[-1], err


def test_cli_rejects_bad_type_option(monkeypatch, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        _main(monkeypatch, "quantize", "--output-tensor-type", "q9", "a", "b", "Q4_0")
    assert e.value.code == 2 and "invalid ggml type 'q9'" in capsys.readouterr().err


def test_cli_requantize_error_is_one_line(
    smollm2_path: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    assert _main(monkeypatch, "quantize", str(smollm2_path), str(tmp_path / "o.gguf"), "Q4_0") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "requantizing from type q4_1 is disabled" in err[-1] and "Traceback" not in "".join(err)


def test_threads_flag_as_llama_quantize_positional(tmp_path):
    def nthread(*argv: str) -> int:
        args = _parser().parse_args(["quantize", "--dry-run", *argv])
        return cli_quantize._positionals(args)[3]

    assert nthread("in.gguf", "Q4_0", "3") == 3
    assert nthread("-t", "3", "in.gguf", "Q4_0") == 3
    assert nthread("--threads", "2", "in.gguf", "out.gguf", "Q4_0", "2") == 2
    with pytest.raises(UsageError, match="disagree"):
        nthread("-t", "2", "in.gguf", "Q4_0", "4")
