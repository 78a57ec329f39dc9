"""Sampling parameters (llama.cpp's ``common_params_sampling``), sampler-name parsing,
model defaults from ``general.sampling.*`` metadata, and building the chain."""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..gguf.constants import GENERAL_SAMPLING
from .base import SamplingError, check_float, check_int, check_seed, invalid
from .basic import Dist, LogitBias, Temp, TempExt
from .chain import SamplerChain
from .mirostat import AdaptiveP, Mirostat, MirostatV2
from .penalties import DRY, Penalties
from .truncation import XTC, MinP, TopK, TopNSigma, TopP, Typical

LLAMA_DEFAULT_SEED = 0xFFFFFFFF

# canonical names (common_sampler_type_to_str) and their --sampler-seq characters
SAMPLER_CHARS = {
    "dry": "d",
    "top_k": "k",
    "typ_p": "y",
    "top_p": "p",
    "top_n_sigma": "s",
    "min_p": "m",
    "temperature": "t",
    "xtc": "x",
    "infill": "i",
    "penalties": "e",
    "adaptive_p": "a",
}
_CHAR_TO_NAME = {c: n for n, c in SAMPLER_CHARS.items()}


def _aliases() -> dict[str, str]:
    names = {n: n for n in SAMPLER_CHARS}
    for n in SAMPLER_CHARS:
        if "_" in n:
            names[n.replace("_", "-")] = n  # kebab-case: top-k
            names[n.replace("_", "")] = n  # no dash: topk
    names.update(nucleus="top_p", temp="temperature", typ="typ_p")
    return names


SAMPLER_ALIASES = _aliases()

DEFAULT_SAMPLERS = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)

DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


def samplers_from_names(names: str | Iterable[str]) -> tuple[str, ...]:
    """Canonical sampler names from ``--samplers`` names (``"top_k;top-p;temp"``)."""
    parts = names.split(";") if isinstance(names, str) else list(names)
    out = []
    for part in parts:
        name = SAMPLER_ALIASES.get(str(part).lower())
        if name is None:
            valid = ", ".join(sorted(SAMPLER_ALIASES))
            raise invalid("samplers", part, f"unknown sampler name (known: {valid})")
        out.append(name)
    return tuple(out)


def samplers_from_chars(chars: str) -> tuple[str, ...]:
    """Canonical sampler names from a ``--sampler-seq`` string (``"edskypmxt"``)."""
    out = []
    for c in chars:
        if c not in _CHAR_TO_NAME:
            valid = ", ".join(f"{c}={n}" for c, n in _CHAR_TO_NAME.items())
            raise invalid("sampler_seq", c, f"unknown sampler character (known: {valid})")
        out.append(_CHAR_TO_NAME[c])
    return tuple(out)


def parse_samplers(spec: str | Iterable[str]) -> tuple[str, ...]:
    """Names (``;``-separated, any alias) or, failing that, a string of sampler characters."""
    if not isinstance(spec, str) or ";" in spec or spec.lower() in SAMPLER_ALIASES:
        return samplers_from_names(spec)
    if spec and all(c in _CHAR_TO_NAME for c in spec):
        return samplers_from_chars(spec)
    return samplers_from_names(spec)


@dataclass(frozen=True)
class SamplingParams:
    """llama.cpp's ``common_params_sampling``: same field names, same defaults.

    ``user_set`` names the fields the user chose explicitly (``SamplingParams.create``
    fills it); :func:`apply_model_defaults` never overrides those. Validation happens at
    construction: an invalid value raises :class:`SamplingError` naming the field.
    """

    seed: int = LLAMA_DEFAULT_SEED  # 0xFFFFFFFF (or -1): random
    n_prev: int = 64
    n_probs: int = 0
    min_keep: int = 0
    top_k: int = 40  # <= 0: disabled
    top_p: float = 0.95  # 1.0: disabled
    min_p: float = 0.05  # 0.0: disabled
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.10  # > 0.5 disables
    typ_p: float = 1.0
    temp: float = 0.80  # <= 0: greedy
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64  # 0: disabled, -1: context size
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64  # 0: disabled, -1: context size
    adaptive_target: float = -1.0  # negative: disabled
    adaptive_decay: float = 0.90
    mirostat: int = 0  # 0 off, 1 mirostat, 2 mirostat 2.0
    top_n_sigma: float = -1.0  # <= 0: disabled
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    ignore_eos: bool = False
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    logit_bias: tuple[tuple[int, float], ...] = ()
    user_set: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def create(cls, **kwargs: Any) -> SamplingParams:
        """Build from keyword arguments, remembering them as user-set."""
        unknown = set(kwargs) - {f.name for f in dataclasses.fields(cls)} - {"user_set"}
        if unknown:
            raise SamplingError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        return cls(**kwargs, user_set=frozenset(kwargs))

    def replace(self, **kwargs: Any) -> SamplingParams:
        """A copy with some fields changed (the changed ones count as user-set)."""
        return dataclasses.replace(self, **kwargs, user_set=self.user_set | frozenset(kwargs))

    def __post_init__(self) -> None:
        object.__setattr__(self, "seed", check_seed("seed", self.seed))
        for name in ("n_prev", "n_probs", "min_keep"):
            check_int(name, getattr(self, name), lo=0)
        top_k = check_int("top_k", self.top_k)
        if top_k < -1:
            raise invalid("top_k", top_k, "must be >= 0 (0 or -1 disable top-k)")
        for name in ("top_p", "min_p", "typ_p", "xtc_probability", "xtc_threshold"):
            check_float(name, getattr(self, name), lo=0.0, hi=1.0)
        for name in ("temp", "dynatemp_exponent", "top_n_sigma", "mirostat_tau", "mirostat_eta"):
            check_float(name, getattr(self, name))
        check_float("dynatemp_range", self.dynatemp_range, lo=0.0)
        for name in ("penalty_last_n", "dry_penalty_last_n"):
            check_int(name, getattr(self, name), lo=-1)
        Penalties(0, self.penalty_repeat, self.penalty_freq, self.penalty_present)  # same checks
        check_float("dry_multiplier", self.dry_multiplier, lo=0.0)
        check_float("dry_base", self.dry_base)
        check_int("dry_allowed_length", self.dry_allowed_length, lo=0)
        check_float("adaptive_target", self.adaptive_target, hi=1.0)
        check_float("adaptive_decay", self.adaptive_decay, lo=0.0, hi=1.0)
        check_int("mirostat", self.mirostat, lo=0, hi=2)
        if not isinstance(self.ignore_eos, bool):
            raise invalid("ignore_eos", self.ignore_eos, "must be a bool")
        if isinstance(self.dry_sequence_breakers, str):
            raise invalid(
                "dry_sequence_breakers", self.dry_sequence_breakers, "must be a list of strings"
            )
        object.__setattr__(self, "dry_sequence_breakers", tuple(self.dry_sequence_breakers))
        for b in self.dry_sequence_breakers:
            if not isinstance(b, str):
                raise invalid("dry_sequence_breakers", b, "entries must be strings")
        object.__setattr__(self, "samplers", parse_samplers(self.samplers))
        bias = self.logit_bias
        pairs = list(bias.items()) if isinstance(bias, Mapping) else list(bias)
        LogitBias(0, pairs)  # same checks
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in pairs))
        object.__setattr__(self, "user_set", frozenset(self.user_set))


# general.sampling.* key -> (field, kind); the 12 keys llama.cpp reads (common.cpp)
GGUF_SAMPLING_KEYS: dict[str, tuple[str, str]] = {
    f"general.sampling.{name}": ("samplers" if name == "sequence" else name, kind)
    for name, kind in GENERAL_SAMPLING.items()
}

_INT_RE = re.compile(r"\s*[+-]?\d+")
_FLOAT_RE = re.compile(r"\s*[+-]?(inf|nan|(\d+\.?\d*|\.\d+)(e[+-]?\d+)?)", re.IGNORECASE)


def _meta_number(value: Any, kind: str) -> int | float | None:
    """A metadata value as llama.cpp reads it (value as string, then strtol / strtof)."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, (int, float)):
        return int(value) if kind == "int" else float(value)
    if isinstance(value, (str, bytes)):
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        m = (_INT_RE if kind == "int" else _FLOAT_RE).match(text)
        if m is None:
            return None
        return int(m.group()) if kind == "int" else float(m.group())
    return None


def apply_model_defaults(params: SamplingParams, metadata: Mapping[str, Any]) -> SamplingParams:
    """Fill fields the user did not set from a model's ``general.sampling.*`` metadata.

    Mirrors llama.cpp's ``common_init_from_params`` sampling defaults: user-set fields
    (``params.user_set``) win; unparsable values are ignored; an invalid value raises
    :class:`SamplingError` naming the metadata key.
    """
    changes: dict[str, Any] = {}
    for key, (name, kind) in GGUF_SAMPLING_KEYS.items():
        if key not in metadata or name in params.user_set:
            continue
        value = metadata[key]
        if kind == "seq":
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            known = []
            for part in text.split(";"):
                if part.lower() in SAMPLER_ALIASES:
                    known.append(SAMPLER_ALIASES[part.lower()])
                else:  # llama.cpp warns and skips unknown names
                    warnings.warn(f"{key}: unknown sampler name {part!r} ignored", stacklevel=2)
            changes[name] = tuple(known)
        else:
            num = _meta_number(value, kind)
            if num is not None:
                changes[name] = num
    if not changes:
        return params
    try:
        return dataclasses.replace(params, **changes)
    except SamplingError as e:
        key = next(k for k, (n, _) in GGUF_SAMPLING_KEYS.items() if n == e.param)
        raise SamplingError(f"model metadata {key}: {e}", param=e.param, value=e.value) from None


def build_sampler_chain(
    params: SamplingParams,
    n_vocab: int,
    *,
    n_ctx: int | None = None,
    dry_seq_breakers: Iterable[Sequence[int]] | None = None,
    eog_tokens: Iterable[int] = (),
    suppress_tokens: Iterable[int] = (),
) -> SamplerChain:
    """The chain llama.cpp's ``common_sampler_init`` builds for these parameters.

    logit-bias (user biases, then ``eog_tokens`` at -inf if ``ignore_eos``, then the
    vocabulary's ``suppress_tokens`` at -inf) -> the samplers in
    ``params.samplers`` -> dist (or adaptive-p when listed); with mirostat: temp ->
    mirostat. ``dry_seq_breakers`` are the token-level breakers for
    ``params.dry_sequence_breakers`` (see :func:`dry_sequence_breakers`); ``n_ctx``
    resolves ``-1`` in ``penalty_last_n``/``dry_penalty_last_n``.
    """
    n_vocab = check_int("n_vocab", n_vocab, lo=1)
    p = params

    def last_n(name: str) -> int:
        v = getattr(p, name)
        if v != -1:
            return v
        if n_ctx is None:
            raise invalid(name, v, "-1 (context size) needs n_ctx when building the chain")
        return check_int("n_ctx", n_ctx, lo=0)

    chain = SamplerChain()
    bias = list(p.logit_bias)
    if p.ignore_eos:
        bias += [(int(t), float("-inf")) for t in eog_tokens]
    bias += [(int(t), float("-inf")) for t in suppress_tokens]
    if bias:
        chain.add(LogitBias(n_vocab, bias))
    if p.mirostat == 1:
        chain.add(Temp(p.temp)).add(Mirostat(n_vocab, p.seed, p.mirostat_tau, p.mirostat_eta, 100))
        return chain
    if p.mirostat == 2:
        chain.add(Temp(p.temp)).add(MirostatV2(p.seed, p.mirostat_tau, p.mirostat_eta))
        return chain
    use_adaptive_p = False
    for name in p.samplers:
        if name == "dry":
            if dry_seq_breakers is None and p.dry_multiplier != 0.0 and p.dry_sequence_breakers:
                raise SamplingError(
                    "DRY is enabled but no token-level sequence breakers were given; pass "
                    "dry_seq_breakers=dry_sequence_breakers(params.dry_sequence_breakers, ...)"
                )
            chain.add(
                DRY(p.dry_multiplier, p.dry_base, p.dry_allowed_length, last_n("dry_penalty_last_n"),
                    dry_seq_breakers or ())
            )  # fmt: skip
        elif name == "top_k":
            chain.add(TopK(p.top_k))
        elif name == "top_p":
            chain.add(TopP(p.top_p, p.min_keep))
        elif name == "top_n_sigma":
            chain.add(TopNSigma(p.top_n_sigma))
        elif name == "min_p":
            chain.add(MinP(p.min_p, p.min_keep))
        elif name == "xtc":
            chain.add(XTC(p.xtc_probability, p.xtc_threshold, p.min_keep, p.seed))
        elif name == "typ_p":
            chain.add(Typical(p.typ_p, p.min_keep))
        elif name == "temperature":
            chain.add(TempExt(p.temp, p.dynatemp_range, p.dynatemp_exponent))
        elif name == "penalties":
            chain.add(
                Penalties(
                    last_n("penalty_last_n"), p.penalty_repeat, p.penalty_freq, p.penalty_present
                )
            )
        elif name == "adaptive_p":
            use_adaptive_p = True
        elif name == "infill":
            raise SamplingError(
                "the infill sampler is not supported by llamacpy", param="samplers", value=name
            )
    if use_adaptive_p:
        chain.add(AdaptiveP(p.adaptive_target, p.adaptive_decay, p.seed))
    else:
        chain.add(Dist(p.seed))
    return chain
