"""The weight formats' traits records (ops/traits.py): complete, consistent with the file
format and the quants registry, the only place engine code learns a format's sizes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import llamacpy
from llamacpy.errors import ModelError
from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType
from llamacpy.ops import traits

ROOT = Path(llamacpy.__file__).parent
RECORDS = traits.all_traits()
# modules allowed to spell out a format's sizes: the records and the kernels they sit with
KERNEL_FILES = {f"ops/{m}.py" for m in traits.KERNEL_MODULES} | {"ops/traits.py"}
# (and the tiny-model writer, test data: it fills each format's scale fields with random values;
# and the KV cache's block rows, a cache format's kernels: ops/kv_rows.py)
EXEMPT = KERNEL_FILES | {"models/tiny.py", "ops/kv_rows.py"}


@pytest.mark.parametrize("tr", RECORDS, ids=lambda tr: tr.type.name)
def test_record_agrees_with_the_file_format_and_the_quants_registry(tr) -> None:
    qk, size = GGML_BLOCK_SIZES[tr.type]
    lay = tr.layout
    assert lay.src_bytes * qk == size * lay.qk  # file bytes of one (virtual) block
    assert lay.qk % qk == 0
    ends = [do + traits._field_bytes(kind, n) for kind, _, n, do, _ in lay.ops]
    assert max(ends) == lay.dst_bytes  # the group block is exactly its fields
    starts = sorted(do for _, _, _, do, _ in lay.ops)
    assert starts[0] == 0 and all(e in starts or e == lay.dst_bytes for e in ends)
    assert all(so + n <= lay.src_bytes for _, so, n, _, _ in lay.ops)
    assert tr.quant.type_size == size and tr.quant.block_size == qk
    assert callable(tr.dequant_numpy) and tr.matmul is not None and tr.row is not None


def test_every_type_is_registered_once_and_found_by_id() -> None:
    ids = [tr.id for tr in RECORDS]
    assert len(ids) == len(set(ids)) >= 15
    for tr in RECORDS:
        assert traits.get(tr.id) is tr and traits.get(tr.type) is tr
    with pytest.raises(ValueError, match="registered twice"):
        traits.register(RECORDS[0])


def test_each_kernel_module_registers_the_formats_it_declares() -> None:
    """``KERNEL_MODULES`` (what a model's formats import) agrees with the records' homes,
    and the supported types are the registered ones."""
    for name, declared in traits.KERNEL_MODULES.items():
        home = {tr.type for tr in RECORDS if tr.matmul.py_func.__module__.endswith(name)}
        assert home == set(declared), name
    assert set(traits.supported_types()) == {tr.type for tr in RECORDS}
    assert traits.type_id(GGMLType.Q4_K) == traits.get(GGMLType.Q4_K).id


def test_a_model_imports_only_its_formats_kernels(tmp_path) -> None:
    """Loading and running an F32 + Q8_0 model imports neither the K-quant nor the grid
    formats' kernels, nor their quants modules (their kernels are ~45 ms of a start)."""
    import subprocess
    import sys

    from llamacpy.models.tiny import write_tiny_llama

    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type=GGMLType.Q8_0)
    code = (
        "import sys\n"
        "from llamacpy.engine import Batch, Context, ContextParams\n"
        f"ctx = Context({str(path)!r}, ContextParams(n_ctx=64))\n"
        "ctx.decode(Batch.from_tokens([1, 2, 3]))\n"
        "print(' '.join(sorted(x for x in sys.modules if 'qdot_k' in x or 'qdot_iq' in x\n"
        "      or 'quants._iq' in x or 'quants.iq' in x)))\n"
    )
    # the first run may compile (compiling imports every format); the second loads
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ""


def test_an_unsupported_type_is_a_clear_error() -> None:
    with pytest.raises(ModelError, match=r"Q8_K.*'blk\.0\.ffn_up\.weight'.*supported: F32"):
        traits.get(GGMLType.Q8_K, tensor="blk.0.ffn_up.weight")
    with pytest.raises(ModelError, match="weight type 999 is not supported"):
        traits.get(999)


def _engine_sources():
    for pkg in ("ops", "models", "engine"):
        for p in sorted((ROOT / pkg).glob("*.py")):
            rel = p.relative_to(ROOT).as_posix()
            if rel not in EXEMPT:
                yield rel, p.read_text()


def test_no_engine_module_names_a_quantized_type_or_its_sizes() -> None:
    """Outside the records and their kernels: no ``GGMLType.<quantized type>``, no comparison
    of a type with a bare id, no group-block or file-block byte size as a literal."""
    quantized = {tr.type.name for tr in RECORDS if tr.qk > 16}
    sizes = {tr.layout.dst_bytes for tr in RECORDS if tr.qk > 16}
    sizes |= {tr.layout.src_bytes for tr in RECORDS if tr.qk > 16 and tr.layout.src_bytes > 34}
    bare_id = re.compile(r"\b(t|typ|wtype|type_id)\s*==\s*\d+\b")
    found = []
    for rel, src in _engine_sources():
        for node in ast.walk(ast.parse(src)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "GGMLType"
                and node.attr in quantized
            ):
                found.append(f"{rel}:{node.lineno}: GGMLType.{node.attr}")
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in sizes:
                found.append(f"{rel}:{node.lineno}: literal {node.value}")
        for i, line in enumerate(src.splitlines(), 1):
            if bare_id.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
