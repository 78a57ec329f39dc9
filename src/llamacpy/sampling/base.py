"""The sampler interface (llama.cpp's ``llama_sampler_i``) and parameter checks."""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np

from ..errors import UsageError
from .candidates import TokenDataArray


class SamplingError(UsageError):
    """An invalid sampling parameter or sampler configuration.

    ``param`` and ``value`` name the offending parameter when there is one.
    """

    def __init__(self, message: str, *, param: str | None = None, value: Any = None) -> None:
        self.param = param
        self.value = value
        super().__init__(message)


def invalid(param: str, value: Any, requirement: str) -> SamplingError:
    return SamplingError(f"invalid {param}={value!r}: {requirement}", param=param, value=value)


def check_float(
    param: str,
    value: Any,
    *,
    lo: float | None = None,
    hi: float | None = None,
    allow_inf: bool = False,
) -> np.float32:
    """A finite number in [lo, hi] (or +-inf when ``allow_inf``), as llama.cpp's float."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise invalid(param, value, "must be a number")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise invalid(param, value, "must be a finite number")
    if lo is not None and v < lo:
        raise invalid(
            param, value, f"must be >= {lo}" + (f" and <= {hi}" if hi is not None else "")
        )
    if hi is not None and v > hi:
        raise invalid(
            param, value, f"must be <= {hi}" + (f" and >= {lo}" if lo is not None else "")
        )
    return np.float32(v)


def check_int(param: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise invalid(param, value, "must be an integer")
    v = int(value)
    if lo is not None and v < lo:
        raise invalid(param, value, f"must be >= {lo}")
    if hi is not None and v > hi:
        raise invalid(param, value, f"must be <= {hi}")
    return v


def check_seed(param: str, value: Any) -> int:
    """uint32 seed; -1 is accepted as LLAMA_DEFAULT_SEED (0xFFFFFFFF, random)."""
    v = check_int(param, value, lo=-1, hi=0xFFFFFFFF)
    return 0xFFFFFFFF if v == -1 else v


class Sampler:
    """One step of a sampler chain, with llama.cpp's interface.

    ``apply`` edits the candidates in place (filter, reorder, rescale, or select one);
    ``accept`` tells the sampler which token was finally chosen; ``reset`` returns it to
    its initial state (re-seeding random ones); ``clone`` copies it *with* its state.
    ``is_noop`` marks parameters that disable it (a chain then skips it entirely).
    """

    name = "sampler"

    @property
    def is_noop(self) -> bool:
        """True when llama.cpp would build an "empty" sampler for these parameters."""
        return False

    def apply(self, cur: TokenDataArray) -> None:
        raise NotImplementedError

    def accept(self, token: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def clone(self) -> Sampler:
        return copy.deepcopy(self)

    def __repr__(self) -> str:
        # configuration only: numbers and strings, not state (history, rng, arrays)
        fields = ", ".join(
            f"{k}={v!s}" if isinstance(v, np.floating) else f"{k}={v!r}"
            for k, v in vars(self).items()
            if not k.startswith("_") and isinstance(v, (int, float, str, np.generic))
        )
        return f"{type(self).__name__}({fields})"
