"""Token sampling with llama.cpp's samplers, chain and seeded random draws.

Given the same logits, parameters and seed, a chain built here picks the same tokens as
llama.cpp's (same ``std::mt19937`` stream, same libstdc++ sort order for ties, same float
arithmetic). Typical use::

    params = apply_model_defaults(SamplingParams.create(temp=0.7, seed=42), gguf_metadata)
    chain = build_sampler_chain(params, n_vocab)
    token = chain.sample(logits_row)          # applies the chain and accepts the token

Kernels are numba functions cached on disk (``__pycache__``); numba does not notice when
a kernel that another file calls changes, so clear that cache after editing one.
"""

from .. import kernel_cache  # noqa: F401  (first: the kernels' disk cache locator)
from .base import Sampler, SamplingError
from .basic import Dist, Greedy, LogitBias, Temp, TempExt
from .candidates import TokenDataArray
from .chain import SamplerChain, SampleResult, TokenProb, token_probabilities
from .common import CommonSampler
from .grammar import GrammarSampler
from .mirostat import AdaptiveP, Mirostat, MirostatV2
from .params import (
    DEFAULT_DRY_SEQUENCE_BREAKERS,
    DEFAULT_SAMPLERS,
    GGUF_SAMPLING_KEYS,
    LLAMA_DEFAULT_SEED,
    SAMPLER_ALIASES,
    SAMPLER_CHARS,
    SamplingParams,
    apply_model_defaults,
    build_sampler_chain,
    parse_samplers,
    samplers_from_chars,
    samplers_from_names,
)
from .penalties import DRY, Penalties, dry_sequence_breakers
from .rng import Mt19937
from .truncation import XTC, MinP, TopK, TopNSigma, TopP, Typical

__all__ = [
    "DEFAULT_DRY_SEQUENCE_BREAKERS",
    "DEFAULT_SAMPLERS",
    "DRY",
    "GGUF_SAMPLING_KEYS",
    "LLAMA_DEFAULT_SEED",
    "SAMPLER_ALIASES",
    "SAMPLER_CHARS",
    "XTC",
    "AdaptiveP",
    "CommonSampler",
    "Dist",
    "GrammarSampler",
    "Greedy",
    "LogitBias",
    "MinP",
    "Mirostat",
    "MirostatV2",
    "Mt19937",
    "Penalties",
    "SampleResult",
    "Sampler",
    "SamplerChain",
    "SamplingError",
    "SamplingParams",
    "Temp",
    "TempExt",
    "TokenDataArray",
    "TokenProb",
    "TopK",
    "TopNSigma",
    "TopP",
    "Typical",
    "apply_model_defaults",
    "build_sampler_chain",
    "dry_sequence_breakers",
    "parse_samplers",
    "samplers_from_chars",
    "samplers_from_names",
    "token_probabilities",
]
