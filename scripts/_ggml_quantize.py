"""ggml's quantizer through ctypes, for the dev-only fixture scripts: ``load(path)`` opens a
llama.cpp ``libggml-base.so``; ``quantize_forked`` runs ``ggml_quantize_chunk`` in a forked
child, since ggml aborts the process on some input of the grid formats."""

from __future__ import annotations

import ctypes
import os
import signal

import numpy as np

from llamacpy.gguf import GGML_BLOCK_SIZES, GGMLType

DEFAULT_LIB = "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/libggml-base.so"


def load(path: str = DEFAULT_LIB) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, i64, i64, i64, p]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def quantize_forked(lib, name: str, x: np.ndarray, im: np.ndarray | None) -> np.ndarray | None:
    """ggml's bytes of ``x`` as ``name`` (flat), computed in a forked child; None where ggml
    aborts."""
    t = int(GGMLType[name])
    block, size = GGML_BLOCK_SIZES[GGMLType[name]]
    nbytes = x.size // block * size
    lib.ggml_quantize_init(t)  # the tables are built before the fork
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.environ["GGML_NO_BACKTRACE"] = "1"
            out = np.zeros(nbytes, np.uint8)
            p = None if im is None else im.ctypes.data
            lib.ggml_quantize_chunk(t, x.ctypes.data, out.ctypes.data, 0, *x.shape, p)
            with os.fdopen(w, "wb") as f:
                f.write(out.tobytes())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT:
        return None
    assert status == 0 and len(data) == nbytes, (name, status)
    return np.frombuffer(data, np.uint8)
