"""Quantize a whole model file, as ``llama-quantize`` does: plan, check, then stream.

:func:`plan_quantization` decides every tensor's output type and runs every check (imatrix
requirements, requantization, supported formats) before anything is written;
:func:`quantize_model` then writes the output atomically, one tensor at a time: dequantize
the input rows to float32 and quantize them with :mod:`llamacpy.quants`, in row chunks on
``nthread`` threads (:mod:`.convert`), streaming the bytes into the file (:mod:`.output`).

The output is byte-identical to llama-quantize's for the same command: the same metadata
(input keys in order, then ``general.quantization_version``, ``general.file_type`` and the
overrides moved to the end), the same tensor order (by block number, then name), shapes,
types, alignment and data.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..gguf.constants import KEY_FILE_TYPE, GGMLType, GGUFValueType, LlamaFileType
from ..gguf.reader import Field, TensorInfo
from ..gguf.split import SPLIT_KEYS, GGUFModelFile
from .convert import Pipeline, TensorJob, resolve_nthread
from .imatrix import ImportanceMatrix
from .output import encode_record, header_bytes, input_records, write_gguf
from .policy import (
    ModelInfo,
    TensorSpec,
    TypeOptions,
    choose_types,
    loader_order,
)
from .presets import QUANTIZATION_VERSION, default_type, ggml_name, is_quantized

KEY_QUANTIZATION_VERSION = "general.quantization_version"
KEY_IMATRIX_FILE = "quantize.imatrix.file"
KEY_IMATRIX_DATASET = "quantize.imatrix.dataset"
KEY_IMATRIX_N_ENTRIES = "quantize.imatrix.entries_count"
KEY_IMATRIX_N_CHUNKS = "quantize.imatrix.chunks_count"
MiB = 1024.0 * 1024.0

# the file type llama.cpp's loader guesses from the most common tensor type
_GUESS_FTYPE = {
    GGMLType.F32: LlamaFileType.ALL_F32,
    GGMLType.F16: LlamaFileType.MOSTLY_F16,
    GGMLType.BF16: LlamaFileType.MOSTLY_BF16,
    GGMLType.Q4_0: LlamaFileType.MOSTLY_Q4_0,
    GGMLType.Q4_1: LlamaFileType.MOSTLY_Q4_1,
    GGMLType.Q5_0: LlamaFileType.MOSTLY_Q5_0,
    GGMLType.Q5_1: LlamaFileType.MOSTLY_Q5_1,
    GGMLType.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    GGMLType.Q2_K: LlamaFileType.MOSTLY_Q2_K,
    GGMLType.Q3_K: LlamaFileType.MOSTLY_Q3_K_M,
    GGMLType.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    GGMLType.Q5_K: LlamaFileType.MOSTLY_Q5_K_M,
    GGMLType.Q6_K: LlamaFileType.MOSTLY_Q6_K,
    GGMLType.TQ1_0: LlamaFileType.MOSTLY_TQ1_0,
    GGMLType.TQ2_0: LlamaFileType.MOSTLY_TQ2_0,
    GGMLType.IQ2_XXS: LlamaFileType.MOSTLY_IQ2_XXS,
    GGMLType.IQ2_XS: LlamaFileType.MOSTLY_IQ2_XS,
    GGMLType.IQ2_S: LlamaFileType.MOSTLY_IQ2_S,
    GGMLType.IQ3_XXS: LlamaFileType.MOSTLY_IQ3_XXS,
    GGMLType.IQ1_S: LlamaFileType.MOSTLY_IQ1_S,
    GGMLType.IQ1_M: LlamaFileType.MOSTLY_IQ1_M,
    GGMLType.IQ4_NL: LlamaFileType.MOSTLY_IQ4_NL,
    GGMLType.IQ4_XS: LlamaFileType.MOSTLY_IQ4_XS,
    GGMLType.IQ3_S: LlamaFileType.MOSTLY_IQ3_S,
    GGMLType.NVFP4: LlamaFileType.MOSTLY_NVFP4,
    GGMLType.Q1_0: LlamaFileType.MOSTLY_Q1_0,
    GGMLType.Q2_0: LlamaFileType.MOSTLY_Q2_0,
}


# --------------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class KVOverride:
    """``--override-kv KEY=TYPE:VALUE`` (TYPE: int, float, bool or str)."""

    key: str
    kind: str
    value: int | float | bool | str

    @classmethod
    def parse(cls, text: str) -> KVOverride:
        key, sep, rest = text.partition("=")
        if not sep or not key or len(key) >= 128:
            raise UsageError(f"malformed KV override {text!r}: expected KEY=TYPE:VALUE")
        kind, sep, raw = rest.partition(":")
        if not sep or kind not in ("int", "float", "bool", "str"):
            raise UsageError(
                f"invalid type for KV override {text!r}: expected int:, float:, bool: or str:"
            )
        value: int | float | bool | str
        if kind == "int":
            value = _c_atol(raw)
        elif kind == "float":
            value = _c_atof(raw)
        elif kind == "bool":
            if raw not in ("true", "false"):
                raise UsageError(f"invalid boolean value for KV override {text!r}")
            value = raw == "true"
        else:
            if len(raw.encode("utf-8", "surrogateescape")) > 127:
                raise UsageError(f"malformed KV override {text!r}: value cannot exceed 127 chars")
            value = raw
        return cls(key, kind, value)

    def field(self) -> tuple[Any, GGUFValueType]:
        """The value and type llama-quantize writes (ints as UINT32 of the absolute value)."""
        if self.kind == "int":
            return abs(int(self.value)) & 0xFFFFFFFF, GGUFValueType.UINT32
        if self.kind == "float":
            return float(self.value), GGUFValueType.FLOAT32
        if self.kind == "bool":
            return bool(self.value), GGUFValueType.BOOL
        return str(self.value), GGUFValueType.STRING


def _c_atol(s: str) -> int:
    """C ``atol``: leading whitespace, optional sign, digits; 0 when there are none."""
    s = s.lstrip()
    i = 1 if s[:1] in "+-" else 0
    j = i
    while j < len(s) and s[j].isdigit() and s[j].isascii():
        j += 1
    return int(s[:j]) if j > i else 0


def _c_atof(s: str) -> float:
    """C ``atof``: the longest leading float literal; 0.0 when there is none."""
    s = s.lstrip()
    for end in range(len(s), 0, -1):
        with contextlib.suppress(ValueError):
            return float(s[:end])
    return 0.0


@dataclass(frozen=True)
class QuantizeParams:
    """What to quantize to and how (the options of ``llama-quantize``)."""

    ftype: LlamaFileType
    nthread: int = 0  # <= 0: every CPU
    allow_requantize: bool = False
    quantize_output_tensor: bool = True  # False: --leave-output-tensor
    only_copy: bool = False  # the COPY preset
    pure: bool = False
    output_tensor_type: GGMLType | None = None
    token_embedding_type: GGMLType | None = None
    tensor_types: tuple[tuple[str, GGMLType], ...] = ()
    kv_overrides: tuple[KVOverride, ...] = ()
    imatrix: ImportanceMatrix | None = None
    dry_run: bool = False

    def type_options(self) -> TypeOptions:
        return TypeOptions(
            ftype=self.ftype,
            pure=self.pure,
            only_copy=self.only_copy,
            quantize_output_tensor=self.quantize_output_tensor,
            output_tensor_type=self.output_tensor_type,
            token_embedding_type=self.token_embedding_type,
            tensor_types=self.tensor_types,
            has_imatrix=self.imatrix is not None and bool(self.imatrix.data),
        )


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class QuantPlan:
    jobs: tuple[TensorJob, ...]
    records: dict[str, bytes]  # the output metadata: key -> encoded record, in order
    file_type: int
    fallbacks: tuple[tuple[str, GGMLType, GGMLType], ...]
    overrides: tuple[tuple[str, GGMLType, GGMLType], ...]
    model: ModelInfo
    n_elements: int
    warnings: tuple[str, ...] = ()

    @property
    def size_in(self) -> int:
        return sum(j.tensor.nbytes for j in self.jobs)

    @property
    def size_out(self) -> int:
        return sum(j.nbytes_out for j in self.jobs)

    def types(self) -> dict[str, GGMLType]:
        return {j.name: j.target for j in self.jobs}

    def tensor_infos(self) -> list[tuple[str, tuple[int, ...], GGMLType, int]]:
        return [(j.name, j.shape, j.target, j.nbytes_out) for j in self.jobs]

    def header_bytes(self) -> bytes:
        """Every byte of the output before the tensor data."""
        return header_bytes(self.records, self.tensor_infos())


def _metadata(fields: Mapping[str, Field], overrides: Sequence[KVOverride]) -> dict[str, Any]:
    md = {k: f.value for k, f in fields.items()}
    for o in overrides:  # llama.cpp's loader reads hyper-parameters through the overrides
        md[o.key] = o.value
    return md


def _file_ftype(model: GGUFModelFile, md: Mapping[str, Any], order: Sequence[TensorInfo]) -> int:
    """llama.cpp's ``ml.ftype``: ``general.file_type``, else guessed from the commonest type."""
    value = md.get(KEY_FILE_TYPE)
    if value is not None and not isinstance(value, str | bytes):
        with contextlib.suppress(TypeError, ValueError):
            return int(value) & 0xFFFFFFFF
    counts: dict[GGMLType, int] = {}
    best, best_n = GGMLType.F32, 0
    for t in order:
        counts[t.type] = counts.get(t.type, 0) + 1
        if counts[t.type] > best_n:
            best, best_n = t.type, counts[t.type]
    return int(_GUESS_FTYPE.get(best, LlamaFileType.ALL_F32)) | int(LlamaFileType.GUESSED)


def _can_dequantize(t: GGMLType) -> bool:
    if t == GGMLType.F32:
        return True
    if not is_quantized(t) and t not in (GGMLType.F16, GGMLType.BF16):
        return False
    from .. import quants

    try:
        return quants.get(t).dequantize is not None
    except quants.UnsupportedQuantTypeError:
        return False


def _can_quantize(t: GGMLType) -> bool:
    from .. import quants

    try:
        return quants.get(t).quantize is not None
    except quants.UnsupportedQuantTypeError:
        return False


def plan_quantization(model: GGUFModelFile, params: QuantizeParams) -> QuantPlan:
    """Decide every tensor's type and check that the whole job can be done."""
    if default_type(params.ftype) is None:
        raise UsageError(f"invalid output file type {int(params.ftype)}")
    md = _metadata(model.fields, params.kv_overrides)
    info = ModelInfo.from_metadata(md)
    by_name = {t.name: t for t in model.tensors}
    order = [by_name[n] for n in loader_order(by_name)]
    specs = [TensorSpec(t.name, t.shape, t.type) for t in order]
    opts = params.type_options()
    types = choose_types(info, specs, opts)

    im = params.imatrix if opts.has_imatrix else None
    warnings: list[str] = []
    jobs: list[TensorJob] = []
    for i, (t, spec, c) in enumerate(zip(order, specs, types.choices)):
        shape = spec.shape[: spec.n_dims]
        target = c.target
        qw = None
        if target != t.type:
            qw = _tensor_imatrix(t, im, warnings)
            if qw is None and c.requires_imatrix:
                raise UsageError(
                    f"this quantization requires an importance matrix (--imatrix): tensor "
                    f"{t.name!r} becomes {ggml_name(target)}, which is garbage without one"
                )
            if is_quantized(t.type) and not params.allow_requantize:
                raise UsageError(
                    f"requantizing from type {ggml_name(t.type)} is disabled (tensor {t.name!r} "
                    f"is already quantized); pass --allow-requantize to requantize anyway, "
                    "at a loss of quality"
                )
            if not _can_dequantize(t.type):
                raise UsageError(
                    f"cannot dequantize/convert tensor type {ggml_name(t.type)} (tensor {t.name!r})"
                )
            if not _can_quantize(target):
                raise UsageError(
                    f"quantizing to {ggml_name(target)} is not supported (tensor {t.name!r})"
                )
        jobs.append(TensorJob(i, t, shape, c.category, target, qw))

    file_type = _file_ftype(model, md, order) if params.only_copy else int(params.ftype)
    records = _output_records(model, params, file_type, im)
    n_elements = sum(t.n_elements for t in order)
    return QuantPlan(
        tuple(jobs),
        records,
        file_type,
        types.fallbacks,
        types.overrides,
        info,
        n_elements,
        tuple(warnings),
    )


def _tensor_imatrix(
    t: TensorInfo, im: ImportanceMatrix | None, warnings: list[str]
) -> np.ndarray | None:
    """The importance weights for one tensor as (n_matrices, ne[0]), or None."""
    if im is None:
        return None
    v = im.data.get(t.name)
    if v is None:
        warnings.append(f"did not find imatrix weights for {t.name}")
        return None
    ne0 = t.shape[0]
    ne2 = t.shape[2] if len(t.shape) > 2 else 1
    if v.size != ne0 * ne2:
        if t.name in ("token_embd.weight", "per_layer_token_embd.weight"):
            warnings.append(
                f"imatrix size {v.size} is different from tensor size {ne0 * ne2} for {t.name}"
            )
            return None
        raise UsageError(
            f"imatrix size {v.size} is different from tensor size {ne0 * ne2} for {t.name}"
        )
    return np.ascontiguousarray(v, dtype=np.float32).reshape(ne2, ne0)


def _output_records(
    model: GGUFModelFile,
    params: QuantizeParams,
    file_type: int,
    im: ImportanceMatrix | None,
) -> dict[str, bytes]:
    """The output metadata in llama-quantize's order: input keys (minus split keys), then each
    key it sets moved to the end (setting a key = remove + append)."""
    raw = input_records(model.readers[0].path, model.readers[0].fields)
    out = {k: raw[k] for k in model.fields if k not in SPLIT_KEYS}

    def put(key: str, value: Any, vtype: GGUFValueType) -> None:
        out.pop(key, None)
        out[key] = encode_record(key, vtype, value)

    put(KEY_QUANTIZATION_VERSION, QUANTIZATION_VERSION, GGUFValueType.UINT32)
    put(KEY_FILE_TYPE, file_type & 0xFFFFFFFF, GGUFValueType.UINT32)
    overrides = list(params.kv_overrides)
    if im is not None:
        overrides.append(KVOverride(KEY_IMATRIX_FILE, "str", _c_truncate(im.path)))
        if im.datasets:
            overrides.append(KVOverride(KEY_IMATRIX_DATASET, "str", _c_truncate(im.datasets[0])))
        overrides.append(KVOverride(KEY_IMATRIX_N_ENTRIES, "int", len(im.data)))
        if im.chunk_count > 0:
            overrides.append(KVOverride(KEY_IMATRIX_N_CHUNKS, "int", im.chunk_count))
    for o in overrides:
        put(o.key, *o.field())
    return out


def _c_truncate(s: str, n: int = 127) -> str:
    """A string cut to at most ``n`` bytes (llama-quantize's fixed-size override buffer)."""
    raw = s.encode("utf-8", "surrogateescape")[:n]
    return raw.decode("utf-8", "surrogateescape")


# --------------------------------------------------------------------------- the run
@dataclass
class QuantizeReport:
    """What :func:`quantize_model` did."""

    input: str
    output: str | None
    plan: QuantPlan
    nthread: int
    seconds: float = 0.0
    tensors: list[tuple[str, GGMLType, GGMLType, int, int]] = field(default_factory=list)

    @property
    def size_in(self) -> int:
        return self.plan.size_in

    @property
    def size_out(self) -> int:
        return self.plan.size_out

    def bpw(self, nbytes: int) -> float:
        return nbytes * 8.0 / max(1, self.plan.n_elements)

    def summary_lines(self) -> list[str]:
        n_fb, n_t = len(self.plan.fallbacks), len(self.plan.jobs)
        lines = [
            f"model size  = {self.size_in / MiB:8.2f} MiB ({self.bpw(self.size_in):.2f} BPW)",
            f"quant size  = {self.size_out / MiB:8.2f} MiB ({self.bpw(self.size_out):.2f} BPW)",
        ]
        if n_fb:
            lines.append(f"WARNING: {n_fb} of {n_t} tensor(s) required fallback quantization")
        lines.append(f"quantize time = {self.seconds * 1000:8.2f} ms ({self.nthread} threads)")
        return lines


def tensor_line(job: TensorJob, n_total: int) -> str:
    """The per-tensor line llama-quantize prints."""
    t = job.tensor
    dims = ", ".join(f"{d:6d}" for d in (*t.shape, *(1,) * (4 - len(t.shape))))
    head = f"[{job.index + 1:4d}/{n_total:4d}] {t.name:<36s} - [{dims}], type = {ggml_name(t.type):>6s}, "
    if not job.convert:
        return head + f"size = {t.nbytes / MiB:8.3f} MiB"
    return (
        head + f"converting to {ggml_name(job.target)} .. "
        f"size = {t.nbytes / MiB:8.2f} MiB -> {job.nbytes_out / MiB:8.2f} MiB"
    )


def quantize_model(
    input: str | os.PathLike[str],
    output: str | os.PathLike[str] | None,
    params: QuantizeParams,
    *,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> QuantizeReport:
    """Quantize ``input`` (a GGUF model, or the first shard of a split one) into ``output``.

    The output appears atomically when complete. ``progress`` shows a tqdm bar (one step per
    tensor) on stderr; ``log`` receives llama-quantize's per-tensor lines and warnings.
    ``params.dry_run`` plans and reports sizes without writing anything (``output`` may be None).
    """
    t0 = time.perf_counter()
    in_path = Path(input)
    if not params.dry_run:
        if output is None:
            raise UsageError("no output file given")
        out_path = Path(output)
        if out_path.exists() and in_path.exists() and os.path.samefile(in_path, out_path):
            raise UsageError(f"input and output files are the same: {os.fspath(in_path)!r}")
    with GGUFModelFile(in_path) as model:
        plan = plan_quantization(model, params)
        if log is not None:
            for name, want, got in plan.fallbacks:
                log(
                    f"warning: {name} - ncols {model.tensor(name).shape[0]} not divisible by "
                    f"the {ggml_name(want)} block size -> falling back to {ggml_name(got)}"
                )
            for w in plan.warnings:
                log(w)
        nthread = resolve_nthread(params.nthread)
        report = QuantizeReport(
            os.fspath(in_path), None if params.dry_run else os.fspath(output), plan, nthread
        )
        if params.dry_run:
            for job in plan.jobs:
                if log is not None:
                    log(tensor_line(job, len(plan.jobs)))
        else:
            _write(plan, os.fspath(output), nthread, progress, log)
        report.tensors = [
            (j.name, j.tensor.type, j.target, j.tensor.nbytes, j.nbytes_out) for j in plan.jobs
        ]
    report.seconds = time.perf_counter() - t0
    return report


def _write(
    plan: QuantPlan,
    path: str,
    nthread: int,
    progress: bool,
    log: Callable[[str], None] | None,
) -> None:
    jobs, n = plan.jobs, len(plan.jobs)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n, unit="tensor", desc="quantize", leave=False, dynamic_ncols=True)

    with Pipeline(jobs, nthread) as pipeline:

        def data(i: int) -> Any:
            job = jobs[i]
            if bar is not None:
                what = f"{ggml_name(job.tensor.type)}->{ggml_name(job.target)}"
                bar.set_postfix_str(f"{job.name} {what if job.convert else 'copy'}", refresh=False)
            out = pipeline.result(i)
            if log is not None:
                log(tensor_line(job, n))
            return out

        try:
            write_gguf(
                path,
                plan.records,
                plan.tensor_infos(),
                data,
                (lambda i: bar.update(1)) if bar is not None else None,
            )
        finally:
            if bar is not None:
                bar.close()
