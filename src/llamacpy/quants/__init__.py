"""ggml's tensor formats: block layouts, dequantization and llama.cpp-exact quantization.

One module per format (``floats`` holds F32/F16/BF16). Each has its block layout as a numpy
structured dtype (``BLOCK``), ``dequantize(raw, n)`` and ``quantize(x, imatrix=None)`` backed
by numba kernels (compiled on first use, cached on disk), and vectorized numpy twins
``dequantize_numpy`` / ``quantize_numpy`` that compute the same bits independently.

``quantize`` produces the bytes llama.cpp's ``ggml_quantize_chunk`` writes: without an
importance matrix the ``quantize_row_*_ref`` reference path, with one the ``*_impl`` path.

>>> from llamacpy import quants                                 # doctest: +SKIP
>>> q = quants.quantize(weights, "Q4_K", imatrix=im)            # uint8 (rows, bytes_per_row)
>>> w = quants.dequantize(q, "Q4_K", weights.shape)             # float32
>>> w = quants.dequantize(reader.tensors[0])                    # a TensorInfo
"""

from __future__ import annotations

from typing import Any

import numpy as np

from llamacpy import kernel_cache  # noqa: F401  (first: the kernels' disk cache locator)
from llamacpy.gguf.constants import GGMLType
from llamacpy.quants._errors import QuantError, UnsupportedQuantTypeError
from llamacpy.quants._registry import QuantFormat, formats, get, register

__all__ = [
    "QuantError",
    "QuantFormat",
    "UnsupportedQuantTypeError",
    "dequantize",
    "formats",
    "get",
    "quantize",
    "register",
]


def dequantize(
    src: Any,
    ggml_type: GGMLType | int | str | None = None,
    shape: tuple[int, ...] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Dequantize a tensor to float32.

    ``src`` is a :class:`~llamacpy.gguf.reader.TensorInfo` (type, shape and name come from it)
    or raw bytes (any buffer or uint8 array) with ``ggml_type``. ``shape`` is in numpy order
    (``TensorInfo.np_shape``: the last axis is the row); without it the result is 1-D with
    every element in ``src``. ``out`` (a writable C-contiguous float32 array with as many
    elements) receives the values and is returned, instead of a new array.
    """
    tensor = None
    if hasattr(src, "raw") and hasattr(src, "np_shape"):
        tensor = src.name
        ggml_type = src.type if ggml_type is None else ggml_type
        shape = src.np_shape if shape is None else tuple(shape)
        raw = src.raw
    else:
        raw = src
    if ggml_type is None:
        raise QuantError("dequantize: no ggml type given")
    fmt = get(ggml_type, tensor=tensor)
    if shape is None:
        nbytes = np.asarray(raw).nbytes if isinstance(raw, np.ndarray) else memoryview(raw).nbytes
        n = nbytes // fmt.type_size * fmt.block_size
        shape = (n,)
    n = int(np.prod(shape, dtype=np.int64))
    try:
        if out is not None:
            return fmt.dequantize(raw, n, out)
        return fmt.dequantize(raw, n).reshape(shape)
    except QuantError as err:
        where = f" (tensor {tensor!r})" if tensor is not None else ""
        raise QuantError(f"{err}{where}") from None


def quantize(
    array: np.ndarray,
    ggml_type: GGMLType | int | str,
    imatrix: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Quantize a float array (rows on the last axis) to ggml's bytes, as llama.cpp does.

    Returns uint8 of shape ``(*array.shape[:-1], bytes_per_row)``. ``imatrix`` (per column:
    shape ``(row_length,)``, or one such vector per matrix of a stacked tensor) selects
    llama.cpp's importance-weighted path where the format has one. ``out`` (a writable
    C-contiguous uint8 array with as many bytes) receives the bytes and is returned, instead
    of a new array.
    """
    fmt = get(ggml_type)
    if fmt.quantize is None:
        raise UnsupportedQuantTypeError(fmt.ggml_type, what="for quantization")
    if out is not None:
        return fmt.quantize(array, imatrix, out)
    return fmt.quantize(array, imatrix)
