"""The per-tensor type policy against llama.cpp's own snapshots (``tests/snapshots/*.schema``).

Each snapshot lists, for one published model and every file type, the tensors whose type
differs from the file type's default (llama.cpp's test-quant-type-selection computes them
from the model's real tensor list). The snapshots come from the llama-cpp-python sdist on
PyPI, fetched once into the test-data cache (the test skips when that is impossible).

The tensor list is rebuilt from the names the snapshot mentions (every quantizable tensor
deviates from the default in some section, e.g. MXFP4_MOE puts all 2-D tensors on Q8_0);
row lengths come from each model's published configuration (only their divisibility by
32/256 matters: it decides the fallbacks).
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

import pytest

from llamacpy.gguf import LlamaFileType
from llamacpy.quantize import ModelInfo, TensorSpec, TypeOptions, choose_types, loader_order
from llamacpy.quantize.presets import default_type, ggml_name

try:
    from llama_cpp_testdata import SDIST_VERSION, _download_sdist, cache_root
except ImportError:  # pragma: no cover - helper missing: nothing to fetch with
    SDIST_VERSION, _download_sdist, cache_root = "0.3.36", None, None

_MEMBER_DIR = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/tests/snapshots/"
_STAMP = ".complete"

# snapshot -> (architecture, default row length, {name substring: row length}, 3-D tensors)
# (the first matching substring wins; "_exps" tensors stack n_expert matrices)
MODELS: dict[str, tuple[str, int, dict[str, int], dict[str, int]]] = {
    "deepseek-v3.1": (
        "deepseek2",
        7168,
        {
            "attn_k_b": 128,
            "attn_q_b": 1536,
            "attn_output": 16384,
            "ffn_down_": 2048,
            "ffn_down": 18432,
        },
        {"attn_k_b": 128},
    ),
    "gemma-3-4b-it": ("gemma3", 2560, {"attn_output": 2048, "ffn_down": 10240}, {}),
    "glm-4.6v": (
        "glm4moe",
        4096,
        {"attn_output": 12288, "ffn_down_": 1408, "ffn_down": 10944},
        {},
    ),
    "gpt-oss-120b": ("gpt-oss", 2880, {"attn_output": 4096}, {}),
    "meta-llama-3.1-70b-instruct": ("llama", 8192, {"ffn_down": 28672}, {}),
    "nvidia-nemotron-3-nano-30b-a3b": (
        "nemotron_h_moe",
        2688,
        {"ffn_down_exps": 1856, "ffn_down_shexp": 3712, "ssm_out": 4096, "attn_output": 4096},
        {},
    ),
    "qwen3-0.6b": ("qwen3", 1024, {"attn_output": 2048, "ffn_down": 3072}, {}),
    "qwen3-14b": ("qwen3", 5120, {"ffn_down": 17408}, {}),
    "qwen3-coder-next": (
        "qwen3next",
        2048,
        {"attn_output": 4096, "ffn_down": 512, "ssm_out": 4096},
        {},
    ),
    "qwen3.5-397b-a17b": (
        "qwen35moe",
        4096,
        {"attn_output": 8192, "ffn_down": 1024, "ssm_out": 8192},
        {},
    ),
    "qwen3.6-27b": ("qwen35", 5120, {"attn_output": 6144, "ffn_down": 17408, "ssm_out": 6144}, {}),
    "step-3.5-flash": (
        "step35",
        4096,
        {"attn_output": 8192, "ffn_down_": 1280, "ffn_down": 11264},
        {},
    ),
}


def _snapshot_dir() -> Path:
    if cache_root is None or _download_sdist is None:
        pytest.skip("tests/llama_cpp_testdata.py is not available")
    target = cache_root() / f"llama.cpp-{SDIST_VERSION}-quant-snapshots"
    if (target / _STAMP).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
            sdist = _download_sdist(Path(tmp) / "sdist")
            out = Path(tmp) / "snapshots"
            out.mkdir()
            with tarfile.open(sdist) as tf:
                for m in tf:
                    name = m.name.removeprefix(_MEMBER_DIR)
                    if m.isfile() and m.name.startswith(_MEMBER_DIR) and "/" not in name:
                        src = tf.extractfile(m)
                        assert src is not None
                        (out / name).write_bytes(src.read())
            (out / _STAMP).write_text(f"llama-cpp-python=={SDIST_VERSION}\n")
            if not target.exists():
                os.replace(out, target)
    except Exception as e:  # no network, no pip: nothing to compare against
        pytest.skip(f"cannot fetch llama.cpp's snapshots: {e}")
    return target


@pytest.fixture(scope="module")
def snapshot_dir() -> Path:
    return _snapshot_dir()


def _parse(path: Path) -> tuple[dict[str, int], list[tuple[str, str, dict[str, str]]]]:
    """(header numbers, [(ftype name, default type, {tensor: type})])."""
    header: dict[str, int] = {}
    sections: list[tuple[str, str, dict[str, str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith("# n_embd="):
            header = {k: int(v) for k, v in (kv.split("=") for kv in line[2:].split(", "))}
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            ftype, default = line[1:].split("]")
            sections.append((ftype, default.strip(), {}))
        else:
            name, t = line.rsplit(" ", 1)
            sections[-1][2][name] = t
    return header, sections


def _ftype(name: str) -> LlamaFileType:
    return LlamaFileType.ALL_F32 if name == "F32" else LlamaFileType[f"MOSTLY_{name}"]


def _tensors(name: str, header: dict[str, int], names: set[str]) -> list[TensorSpec]:
    _, default_ne0, ne0_of, ne2_of = MODELS[name]
    out = []
    for n in loader_order(names):
        ne0 = next((v for k, v in ne0_of.items() if k in n), default_ne0)
        ne2 = next((v for k, v in ne2_of.items() if k in n), 1)
        if "_exps" in n:
            ne2 = header.get("n_expert", 1)
        out.append(TensorSpec(n, (ne0, 64, ne2)))
    return out


def test_snapshot_table_is_complete(snapshot_dir: Path) -> None:
    found = {p.stem for p in snapshot_dir.glob("*.schema")}
    assert found, "no snapshots extracted"
    assert found <= set(MODELS), f"new snapshots to describe in MODELS: {found - set(MODELS)}"


@pytest.mark.parametrize("model", sorted(MODELS))
def test_types_match_llama_cpp_snapshot(snapshot_dir: Path, model: str) -> None:
    path = snapshot_dir / f"{model}.schema"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this llama.cpp version")
    header, sections = _parse(path)
    names = {n for _, _, overrides in sections for n in overrides}
    tensors = _tensors(model, header, names)
    arch = MODELS[model][0]
    n_layer, n_head, n_head_kv = header["n_layer"], header["n_head"], header["n_head_kv"]
    info = ModelInfo(
        arch,
        n_layer,
        n_head,
        n_head_kv,
        header.get("n_expert", 0),
        # llama.cpp's mock model: the 70B rule for llama with 80 layers and GQA
        is_70b=arch == "llama" and n_layer == 80 and n_head != n_head_kv,
    )
    failures = []
    checked = 0
    for ftype_name, default, overrides in sections:
        ftype = _ftype(ftype_name)
        assert ggml_name(default_type(ftype)) == default, ftype_name
        plan = choose_types(info, tensors, TypeOptions(ftype))
        for choice in plan.choices:
            want = overrides.get(choice.name, default)
            checked += 1
            if ggml_name(choice.target) != want:
                failures.append(
                    f"[{ftype_name}] {choice.name}: {ggml_name(choice.target)} != {want}"
                )
    assert not failures, f"{len(failures)} of {checked} differ:\n" + "\n".join(failures[:40])
    assert checked > 1000
