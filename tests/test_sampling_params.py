"""SamplingParams: llama.cpp's defaults, validation, sampler names, model defaults, chain building."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llamacpy.errors import UsageError
from llamacpy.gguf import GGUFReader, GGUFWriter
from llamacpy.sampling import (
    DRY,
    XTC,
    AdaptiveP,
    Dist,
    LogitBias,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    SamplingError,
    SamplingParams,
    Temp,
    TempExt,
    TopK,
    TopNSigma,
    TopP,
    Typical,
    apply_model_defaults,
    build_sampler_chain,
    parse_samplers,
    samplers_from_chars,
    samplers_from_names,
)


def test_defaults_are_llama_cpps_common_params_sampling() -> None:
    # common/common.h (llama.cpp b-sources in llama-cpp-python 0.3.36), not the README
    p = SamplingParams()
    expected = dict(
        seed=0xFFFFFFFF, n_prev=64, n_probs=0, min_keep=0, top_k=40, top_p=0.95, min_p=0.05,
        xtc_probability=0.0, xtc_threshold=0.10, typ_p=1.0, temp=0.80, dynatemp_range=0.0,
        dynatemp_exponent=1.0, penalty_last_n=64, penalty_repeat=1.0, penalty_freq=0.0,
        penalty_present=0.0, dry_multiplier=0.0, dry_base=1.75, dry_allowed_length=2,
        dry_penalty_last_n=64, adaptive_target=-1.0, adaptive_decay=0.90, mirostat=0,
        top_n_sigma=-1.0, mirostat_tau=5.0, mirostat_eta=0.1, ignore_eos=False,
        dry_sequence_breakers=("\n", ":", '"', "*"), logit_bias=(),
    )  # fmt: skip
    for name, value in expected.items():
        assert getattr(p, name) == value, name
    assert p.samplers == (
        "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature",
    )  # fmt: skip


def test_default_chain_order() -> None:
    chain = build_sampler_chain(SamplingParams(seed=1), 100)
    assert [type(s) for s in chain.samplers] == [
        Penalties, DRY, TopNSigma, TopK, Typical, TopP, MinP, XTC, TempExt, Dist,
    ]  # fmt: skip


def test_chain_variants() -> None:
    kinds = lambda **kw: [type(s) for s in build_sampler_chain(SamplingParams(**kw), 100).samplers]  # noqa: E731
    assert kinds(mirostat=1) == [Temp, Mirostat]
    assert kinds(mirostat=2) == [Temp, MirostatV2]
    assert kinds(samplers="top_k;adaptive_p") == [TopK, AdaptiveP]
    assert kinds(samplers="kt", logit_bias=[(1, 1.0)]) == [LogitBias, TopK, TempExt, Dist]
    assert kinds(samplers=()) == [Dist]
    chain = build_sampler_chain(SamplingParams(samplers="t"), 100, suppress_tokens=[5])
    assert isinstance(chain.samplers[0], LogitBias) and chain.samplers[0].biases[0] == -np.inf
    p = SamplingParams(ignore_eos=True, logit_bias={7: 1.0})
    bias = build_sampler_chain(p, 100, eog_tokens=[2, 3], suppress_tokens=[9]).samplers[0]
    assert bias.tokens.tolist() == [7, 2, 3, 9] and bias.biases.tolist()[1:] == [-np.inf] * 3
    assert (
        len(
            build_sampler_chain(p.replace(ignore_eos=False), 100, eog_tokens=[2]).samplers[0].tokens
        )
        == 1
    )


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("top_k;top-p;TEMP;nucleus;typ;minp;topnsigma", ("top_k", "top_p", "temperature", "top_p", "typ_p", "min_p", "top_n_sigma")),
        ("edskypmxt", ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")),
        ("temperature", ("temperature",)),
        (["dry", "adaptive-p", "penalties"], ("dry", "adaptive_p", "penalties")),
        ("xtc", ("xtc",)),
    ],
)  # fmt: skip
def test_sampler_names_and_chars(spec, names) -> None:
    assert parse_samplers(spec) == names


def test_unknown_sampler_names_are_errors() -> None:
    with pytest.raises(SamplingError, match="'top_q'.*unknown sampler name") as e:
        samplers_from_names("top_k;top_q")
    assert e.value.param == "samplers" and isinstance(e.value, UsageError)
    with pytest.raises(SamplingError, match="sampler_seq='z'"):
        samplers_from_chars("kz")
    with pytest.raises(SamplingError, match="samplers='dist'"):
        SamplingParams(samplers=("top_k", "dist"))


INVALID = [
    ("temp", math.nan), ("temp", math.inf), ("temp", "hot"), ("top_k", -2), ("top_k", 1.5),
    ("top_p", 1.5), ("top_p", -0.1), ("min_p", 2.0), ("min_p", math.nan), ("typ_p", -1.0),
    ("xtc_probability", 1.1), ("xtc_threshold", -0.5), ("penalty_last_n", -2),
    ("dry_penalty_last_n", -5), ("penalty_repeat", 0.0), ("penalty_repeat", -1.0),
    ("penalty_repeat", math.inf), ("penalty_repeat", 1e-45), ("penalty_freq", math.nan),
    ("penalty_present", -math.inf), ("dynatemp_range", -0.5), ("mirostat", 3), ("mirostat_tau", math.nan),
    ("seed", -2), ("seed", 2**32), ("n_probs", -1), ("min_keep", -1), ("dry_multiplier", -1.0),
    ("dry_allowed_length", -1), ("adaptive_target", 1.5), ("adaptive_decay", 2.0),
    ("logit_bias", [(1, math.nan)]), ("logit_bias", [(1, math.inf)]), ("logit_bias", [(1,)]),
    ("dry_sequence_breakers", "\n"), ("ignore_eos", 1), ("top_n_sigma", math.inf),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_invalid_parameters_name_the_parameter(name, value) -> None:
    with pytest.raises(SamplingError) as e:
        SamplingParams.create(**{name: value})
    msg = str(e.value)
    assert name.split("_bias")[0] in msg
    assert e.value.param is not None


def test_valid_edge_values() -> None:
    assert SamplingParams(top_k=-1).top_k == -1  # <= 0 disables top-k, as in llama.cpp
    p = SamplingParams(top_k=0, temp=-1.0, seed=-1, penalty_last_n=-1, top_p=1.0, min_p=0.0)
    assert p.seed == 0xFFFFFFFF
    with pytest.raises(SamplingError, match="penalty_last_n=-1.*n_ctx"):
        build_sampler_chain(p, 10)
    chain = build_sampler_chain(p.replace(penalty_repeat=1.1), 10, n_ctx=128)
    assert chain.samplers[0].penalty_last_n == 128


def test_sampler_classes_validate_too() -> None:
    with pytest.raises(SamplingError, match="top_p"):
        TopP(2.0)
    with pytest.raises(SamplingError, match="temp"):
        Temp(math.nan)
    with pytest.raises(SamplingError, match="min_keep"):
        MinP(0.1, -3)
    with pytest.raises(SamplingError, match="seed"):
        Dist(-7)
    with pytest.raises(SamplingError, match="unknown sampling parameter"):
        SamplingParams.create(temperature=0.5)


def test_dry_needs_token_breakers_or_none() -> None:
    p = SamplingParams(dry_multiplier=0.8)
    with pytest.raises(SamplingError, match="sequence breakers"):
        build_sampler_chain(p, 10)
    build_sampler_chain(p.replace(dry_sequence_breakers=()), 10)
    build_sampler_chain(p, 10, dry_seq_breakers=[[3], [4, 5]])
    with pytest.raises(SamplingError, match="infill"):
        build_sampler_chain(SamplingParams(samplers="infill"), 10)


def test_user_set_fields() -> None:
    p = SamplingParams.create(temp=0.3, top_k=10)
    assert p.user_set == {"temp", "top_k"}
    q = p.replace(min_p=0.2)
    assert q.user_set == {"temp", "top_k", "min_p"} and q.min_p == 0.2 and q.temp == 0.3


META = {
    "general.sampling.sequence": "top_k;temp",
    "general.sampling.top_k": 20,
    "general.sampling.top_p": 0.8,
    "general.sampling.min_p": "0.1",
    "general.sampling.temp": 0.6,
    "general.sampling.penalty_last_n": "32 tokens",
    "general.sampling.penalty_repeat": 1.1,
    "general.sampling.mirostat": 0,
    "general.sampling.mirostat_tau": 4.0,
    "general.sampling.xtc_threshold": "not a number",
}


def test_model_defaults_fill_unset_fields_only() -> None:
    p = apply_model_defaults(SamplingParams.create(temp=1.2, samplers="top_p;temp"), META)
    assert p.temp == 1.2 and p.samplers == ("top_p", "temperature")  # user-set win
    assert p.top_k == 20 and p.top_p == 0.8 and p.min_p == 0.1 and p.penalty_last_n == 32
    assert p.penalty_repeat == 1.1 and p.mirostat_tau == 4.0
    assert p.xtc_threshold == SamplingParams().xtc_threshold  # unparsable: ignored
    q = apply_model_defaults(SamplingParams(), META)
    assert q.samplers == ("top_k", "temperature") and q.temp == 0.6


def test_model_defaults_errors_name_the_key() -> None:
    with pytest.raises(SamplingError, match=r"general\.sampling\.top_p.*top_p=3\.0"):
        apply_model_defaults(SamplingParams(), {"general.sampling.top_p": 3.0})
    with pytest.warns(UserWarning, match="bogus"):
        p = apply_model_defaults(SamplingParams(), {"general.sampling.sequence": "top_k;bogus"})
    assert p.samplers == ("top_k",)


def test_model_defaults_from_a_gguf_file(tmp_path) -> None:
    path = tmp_path / "m.gguf"
    w = GGUFWriter(path)
    w.add("general.architecture", "llama")
    w.add("general.sampling.top_k", 25)
    w.add("general.sampling.temp", 0.7)
    w.add("general.sampling.sequence", "min_p;temperature")
    w.write()
    with GGUFReader(path) as r:
        p = apply_model_defaults(SamplingParams(), r.metadata)
    assert p.top_k == 25 and p.temp == np.float32(0.7) and p.samplers == ("min_p", "temperature")
