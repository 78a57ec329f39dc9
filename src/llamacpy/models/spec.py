"""What an architecture module declares: its hyper-parameters beyond the common ones
(:class:`Param`), its tensors (:class:`Tensor`, :class:`Fused`), and from those the checks a
file must pass before any weight is read (:func:`check_tensors`).

Tensor shapes are written in ggml order in hyper-parameter names (``("n_embd", "n_ff")``),
evaluated against :class:`~llamacpy.hparams.HParams`: a field or property name, an
architecture's own hyper-parameter (``hp.extra``, :class:`Param`), an integer, or ``a*b`` /
``a/b`` of those. A 3-D tensor holds one matrix per expert (``("n_embd", "n_ff_exp",
"n_expert")``). Per-layer tensors carry ``{i}`` in their name; the attribute
a tensor is loaded into is its name without the block prefix and ``.weight``, ``.bias``
giving ``_bias`` (``blk.{i}.attn_q.bias`` -> ``attn_q_bias``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError
from ..hparams import HParams

REQUIRED = object()


@dataclass(frozen=True)
class Param:
    """An architecture-specific hyper-parameter: ``{arch}.{key}`` read into
    ``hp.extra[name]`` (``kind`` int or float; ``default`` REQUIRED makes it mandatory)."""

    name: str
    key: str
    default: Any = REQUIRED
    kind: type = float
    minimum: float = -math.inf

    def read(self, md: Mapping[str, Any], arch: str) -> Any:
        key = f"{arch}.{self.key}"
        v = md.get(key)
        if v is None:
            if self.default is REQUIRED:
                raise ModelError(f"required metadata key {key!r} is missing")
            return self.default
        if isinstance(v, bool) or (not isinstance(v, int | float) and not hasattr(v, "dtype")):
            raise ModelError(f"metadata key {key!r} must be a number, not {v!r}")
        if self.kind is int and float(v) != int(v):
            raise ModelError(f"metadata key {key!r} must be an integer, not {v!r}")
        v = self.kind(v)
        if not math.isfinite(v) or v < self.minimum:
            raise ModelError(f"metadata key {key!r} has invalid value {v} (minimum {self.minimum})")
        return v


@dataclass(frozen=True)
class Tensor:
    """A tensor: GGUF name (``{i}``: per layer), shape in hyper-parameter names, whether the
    file may omit it, and whether it is read as a plain F32 array (``raw``: rope factors)
    instead of going to the weight store, or stored flat with the float vectors (``flat``)."""

    name: str
    shape: tuple[str | int, ...]
    optional: bool = False
    raw: bool = False
    flat: bool = False  # an F32 tensor of any shape kept as a float vector (conv taps)
    as_field: str = ""  # the attribute it is loaded into, when not the one its name gives

    @property
    def field(self) -> str:
        return self.as_field or field_name(self.name)

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.name


@dataclass(frozen=True)
class Fused:
    """A tensor holding several declared matrices' rows one after another (phi3's
    ``attn_qkv`` = q | k | v): when the file has it, it is split into the ``into`` fields at
    load time (no cost at run time) and those fields' own tensors are not looked for;
    ``required``: the file must have it. A 3-D one holds experts (each expert's rows split
    alike: gemma4's ``ffn_gate_up_exps`` = gate | up)."""

    name: str
    into: tuple[str, ...]
    required: bool = False

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.name


@dataclass(frozen=True)
class Branch:
    """An element of a block that runs ``then`` in the layers whose layer-table ``flag`` is
    set and ``otherwise`` in the others (a hybrid model's recurrent and attention layers);
    every worker takes the same branch, so the stages' barriers still meet."""

    flag: str
    then: tuple[str, ...]
    otherwise: tuple[str, ...] = ()

    @property
    def stages(self) -> tuple[str, ...]:
        return self.then + self.otherwise


def stage_names(block) -> tuple[str, ...]:
    """Every stage name a block runs (those inside its branches too), in block order."""
    out: list[str] = []
    for el in block:
        out += el.stages if isinstance(el, Branch) else [el]
    return tuple(out)


def field_name(name: str) -> str:
    base = re.sub(r"^blk\.\{i\}\.", "", name)
    for suffix, repl in ((".weight", ""), (".bias", "_bias")):
        if base.endswith(suffix):
            return base[: -len(suffix)] + repl
    return base


_DIM = re.compile(r"^\s*(\w+)\s*(?:([*/])\s*(\w+)\s*)?$")


def dim(hp: HParams, expr: str | int) -> int:
    """One dimension of a declared shape, from the hyper-parameters."""
    if isinstance(expr, int):
        return expr
    m = _DIM.match(expr)
    if not m:
        raise ValueError(f"bad shape expression {expr!r}")

    def val(tok: str) -> int:
        if tok.isdigit():
            return int(tok)
        return int(hp.extra[tok]) if tok in hp.extra else int(getattr(hp, tok))

    a = val(m.group(1))
    if m.group(2) == "*":
        return a * val(m.group(3))
    if m.group(2) == "/":
        return a // val(m.group(3))
    return a


def shape_of(hp: HParams, t: Tensor) -> tuple[int, ...]:
    return tuple(dim(hp, d) for d in t.shape)


def check_tensors(
    arch: str,
    hp: HParams,
    decls: tuple[Tensor | Fused, ...],
    shapes: Mapping[str, tuple[int, ...]],
    unsupported: tuple[str, ...] = (),
    layer_hp: Callable[[int], HParams] | None = None,
) -> None:
    """Every declared tensor the file needs exists with the shape the hyper-parameters
    imply (a layer's tensors: ``layer_hp(i)``'s, when given); a tensor of a variant not
    supported is refused by name."""
    for name in shapes:
        if any(name.endswith(s) for s in unsupported):
            raise ModelError(f"tensor {name!r}: this {arch} variant is not supported yet")
    by_field = {d.field: d for d in decls if isinstance(d, Tensor)}
    layers = range(hp.n_layer)
    fused_first = sorted(decls, key=lambda d: not isinstance(d, Fused))
    for d in fused_first:
        for i in layers if d.per_layer else (None,):
            name = d.name.format(i=i)
            hp_i = layer_hp(i) if layer_hp is not None and i is not None else hp
            got = shapes.get(name)
            if isinstance(d, Fused):
                if got is None:
                    if d.required:
                        raise ModelError(f"tensor {name!r} is missing (required by {arch})")
                    continue
                parts = [shape_of(hp_i, by_field[f]) for f in d.into]
                want = (parts[0][0], sum(p[1] for p in parts), *parts[0][2:])
            else:
                fused = _fused_for(decls, d.field, i, shapes)
                if fused is not None:
                    continue  # provided by a fused tensor
                want = shape_of(hp_i, d)
                if got is None:
                    if d.optional:
                        continue
                    raise ModelError(f"tensor {name!r} is missing (required by {arch})")
            if _ne(got) != _ne(want):
                raise ModelError(
                    f"tensor {name!r} has shape {tuple(got)}, expected {want} from the "
                    f"hyper-parameters (n_embd={hp_i.n_embd}, n_head={hp_i.n_head}, "
                    f"n_head_kv={hp_i.n_head_kv}, n_ff={hp_i.n_ff}, n_vocab={hp_i.n_vocab})"
                )


def _ne(shape) -> tuple[int, ...]:
    """A shape without its trailing 1s: ggml's ``ne`` are 1 past a tensor's dimensions, so
    llama.cpp's loader takes ``[n, 1]`` for a declared ``[n]`` (converted files keep
    ``[1, n]`` torch weights, qwen35moe's shared-expert gate, as 2-D)."""
    shape = tuple(shape)
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return shape


def _fused_for(decls, field: str, i: int | None, shapes) -> Fused | None:
    """The fused tensor present in the file that provides ``field`` of layer ``i``."""
    for d in decls:
        if isinstance(d, Fused) and field in d.into and d.name.format(i=i) in shapes:
            return d
    return None


def read_hparams(
    arch: str,
    md: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    params=(),
    attention: bool = True,
) -> HParams:
    """The common decoder hyper-parameters (:meth:`HParams.from_gguf`), the vocabulary size
    checked against the tokenizer, and the architecture's own :class:`Param` values
    (``attention`` False: a model without attention layers, see ``HParams.from_gguf``)."""
    emb = shapes.get("token_embd.weight")
    hp = HParams.from_gguf(md, n_vocab=None, attention=attention)
    if hp.n_vocab == 0 and emb is not None and len(emb) == 2:
        hp = HParams.from_gguf(md, n_vocab=emb[1], attention=attention)
    if hp.n_vocab <= 0:
        raise ModelError("cannot determine the vocabulary size (no tokenizer.ggml.tokens)")
    tokens = md.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) != hp.n_vocab:
        raise ModelError(
            f"{arch}.vocab_size is {hp.n_vocab} but tokenizer.ggml.tokens has {len(tokens)} "
            "entries (key tokenizer.ggml.tokens)"
        )
    extra = {p.name: p.read(md, arch) for p in params}
    return hp.with_extra(extra) if extra else hp
