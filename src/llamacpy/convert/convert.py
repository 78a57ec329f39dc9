"""Hugging Face checkpoint directory -> GGUF, as llama.cpp's ``convert_hf_to_gguf.py``.

:func:`convert` plans everything first (metadata, tensor names, shapes, types, shards) from
``config.json``, the tokenizer files and the safetensors headers, then streams the tensors:
each is read from the memory-mapped checkpoint, transformed, encoded and written before the
next one is touched, so peak memory is about one tensor (plus its encoded copy), not the
model. Output is atomic: a crash or error leaves no partial file (or shard set) behind.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..gguf.constants import (
    KEY_SPLIT_COUNT,
    KEY_SPLIT_NO,
    KEY_SPLIT_TENSORS_COUNT,
    GGUFValueType,
    LlamaFileType,
)
from ..gguf.split import write_shards
from ..gguf.writer import GGUFWriter
from .archs import ARCHS, BY_HF_NAME, TextArch
from .common import ConvertError
from .hfconfig import architecture, load_config, text_hparams
from .kv import KV, T
from .metadata import load_metadata
from .plan import (
    OUTTYPES,
    OutTensor,
    Shard,
    fill_template,
    guess_ftype,
    naming_convention,
    output_type_name,
    plan_shards,
    size_label,
    tensor_types,
    total_parameters,
)
from .safetensors import Checkpoint

log = logging.getLogger("llamacpy.convert")

GGML_QUANT_VERSION = 2


@dataclass(frozen=True)
class ConvertOptions:
    """What to convert and how (the ``llamacpy convert`` options)."""

    model_dir: Path
    outfile: Path | None = None  # file, directory, or template with {ftype}
    outtype: str = "auto"  # f32 | f16 | bf16 | q8_0 | auto
    vocab_only: bool = False
    model_name: str | None = None
    metadata: Path | None = None  # JSON file overriding general.* keys
    split_max_size: int | None = None  # bytes of tensor data per shard
    split_max_tensors: int | None = None
    no_tensor_first_split: bool = False
    dry_run: bool = False


@dataclass
class ConvertResult:
    """What was (or, for a dry run, would be) written."""

    arch: str
    hf_arch: str
    ftype: LlamaFileType
    shards: list[Shard]
    n_kv: int
    total_params: int
    dry_run: bool
    tensors: list[OutTensor] = field(default_factory=list)

    @property
    def paths(self) -> list[Path]:
        return [s.path for s in self.shards]


def supported_architectures() -> list[str]:
    """Hugging Face architecture names ``llamacpy convert`` accepts."""
    return [n for a in ARCHS for n in a.hf_architectures]


def open_arch(model_dir: Path) -> TextArch:
    if not model_dir.exists():
        raise ConvertError(f"{model_dir}: no such directory")
    if not model_dir.is_dir():
        raise ConvertError(f"{model_dir}: not a directory (give the Hugging Face model directory)")
    cfg = load_config(model_dir)
    hf_arch = architecture(cfg)
    cls = BY_HF_NAME.get(hf_arch)
    if cls is None:
        raise ConvertError(
            f"architecture {hf_arch!r} is not supported; supported: "
            f"{', '.join(supported_architectures())}"
        )
    return cls(model_dir, cfg, text_hparams(cfg), hf_arch)


def _output_path(opts: ConvertOptions, kv: KV, md, out_type: str) -> Path:
    out = opts.outfile if opts.outfile is not None else opts.model_dir
    if out.is_dir():
        if opts.vocab_only:
            name = naming_convention(md.name, md.basename, md.finetune, md.version, None, None,
                                     "vocab")  # fmt: skip
        else:
            name = naming_convention(md.name, md.basename, md.finetune, md.version,
                                     md.size_label, out_type)  # fmt: skip
        return out / f"{name}.gguf"
    return out.parent / fill_template(out.name, out_type)


def convert(
    opts: ConvertOptions,
    *,
    progress: Callable[[str, int], None] | None = None,
    on_tensor: Callable[[OutTensor], None] | None = None,
) -> ConvertResult:
    """Convert ``opts.model_dir`` to GGUF; see :class:`ConvertOptions`.

    ``progress(name, nbytes)`` is called after each tensor is written; ``on_tensor`` once per
    planned tensor, before writing (for a per-tensor log).
    """
    if opts.outtype != "auto" and opts.outtype not in OUTTYPES:
        raise ConvertError(
            f"unknown output type {opts.outtype!r}; choose one of {', '.join(OUTTYPES)}, auto"
        )
    arch = open_arch(opts.model_dir)
    try:
        ckpt = Checkpoint(opts.model_dir)
    except ConvertError:
        if not opts.vocab_only:
            raise
        ckpt = None  # a vocabulary needs no weights
    try:
        return _convert(opts, arch, ckpt, progress, on_tensor)
    finally:
        if ckpt is not None:
            ckpt.close()


def _convert(opts, arch, ckpt, progress, on_tensor) -> ConvertResult:
    sources = {} if ckpt is None else ckpt.tensors
    renamed = [st for name, st in sources.items() if arch.rename(name) is not None]
    ftype = OUTTYPES[opts.outtype] if opts.outtype != "auto" else guess_ftype(renamed)
    kv = KV(arch.arch)
    kv.add("general.architecture", arch.arch, T.STRING)
    tensors: list[OutTensor] = []
    if not opts.vocab_only:
        tensors = tensor_types(arch, arch.plan(sources, kv), ftype)
    total = total_parameters(tensors)
    md = load_metadata(
        opts.model_dir, override=opts.metadata, model_name=opts.model_name, total_params=total
    )
    if md.size_label is None and total > 0:
        md.size_label = size_label(total)
    kv.add("general.type", "model", T.STRING)
    md.write(kv)
    arch.set_params(kv, int(ftype))
    kv.add("general.quantization_version", GGML_QUANT_VERSION, T.UINT32)
    out_path = _output_path(opts, kv, md, output_type_name(ftype))
    arch.set_vocab(kv)
    shards = plan_shards(
        out_path,
        tensors,
        max_size=None if opts.vocab_only else opts.split_max_size,
        max_tensors=None if opts.vocab_only else opts.split_max_tensors,
        no_tensor_first_split=opts.no_tensor_first_split and not opts.vocab_only,
    )
    result = ConvertResult(arch.arch, arch.hf_arch, ftype, shards, len(kv), total,
                           opts.dry_run, tensors)  # fmt: skip
    if on_tensor is not None:
        for t in tensors:
            on_tensor(t)
    if opts.dry_run:
        return result
    for s in shards:
        parent = s.path.parent if str(s.path.parent) else Path(".")
        if not parent.is_dir():
            raise ConvertError(f"output directory {parent} does not exist")
    writers = [_writer(kv, s, i, len(shards), len(tensors)) for i, s in enumerate(shards)]
    if len(writers) == 1:
        writers[0].write(progress)
    else:
        write_shards(writers, [s.path for s in shards], progress)
    return result


def _writer(kv: KV, shard: Shard, i: int, n_shards: int, n_tensors: int) -> GGUFWriter:
    w = GGUFWriter(shard.path)
    if i == 0:
        for e in kv:
            w.add(e.key, e.value, e.type, e.elem_type)
    if n_shards > 1:
        w.add(KEY_SPLIT_NO, i, GGUFValueType.UINT16)
        w.add(KEY_SPLIT_COUNT, n_shards, GGUFValueType.UINT16)
        w.add(KEY_SPLIT_TENSORS_COUNT, n_tensors, GGUFValueType.INT32)
    for t in shard.tensors:
        w.add_tensor(t.name, t.type, t.ggml_shape, t.produce)
    return w
