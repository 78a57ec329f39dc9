"""Weight formats the matmul kernels run, and the repacked layout of each.

At load time every 2-D weight is *repacked*: rows are taken 16 at a time (a *row group*,
padded with zero rows) and, block by block, the fields of the 16 rows' blocks are
interleaved so that one 64-byte vector load gives the same field of all 16 rows, lane ``r``
holding row ``r``. A kernel then computes 16 output rows at once with no horizontal sums.
Field kinds (per block of the group; offsets in bytes):

* ``ROWS``: a small per-row field (an f16 scale) -> ``[row][bytes]``;
* ``CHUNK4``: a byte array -> ``[bytes/4][row][4]``: vector ``c`` has bytes ``4c..4c+3`` of
  every row in its lane (``XOR80``: the same, each byte xored with 0x80, making int8 weights
  unsigned for ``vpdpbusd``);
* ``T``: elements of size ``e`` -> ``[element][row][e]`` (float weights; int8 sub-scales);
* ``Q5HB``: a Q5 block's 32 high bits -> 4 bytes per row, byte ``j`` bit ``2c`` / ``2c+1``
  = the high bit of element ``4c+j`` / ``16+4c+j`` (the order the nibble chunks come in);
* ``K4SC`` / ``Q3SC`` / ``IQ4XSSC``: 6-bit packed sub-block scales (and mins) unpacked to one
  byte each, ``[sub-block][row]``;
* ``IQV``: a grid / ternary block (IQ1/IQ2/IQ3, TQ; ``elem`` = its type id) decoded to its
  integer form (:mod:`llamacpy.quants._iqcodes`): the f16 ``d`` ``[row][2]``, the integer
  sub-block scale of every 16 weights ``[16][row]`` (u8), the 256 values as 4-bit codes
  (every format has at most 16 values) and the 64-byte table of what they stand for (the
  format's values made unsigned, +128 as ``XOR80``, for ``vpdpbusd``; the same 16 bytes in
  each 128-bit lane, for ``vpshufb``). The codes lie as ``CHUNK4`` of values, vector ``c``
  (values ``4c..4c+3`` of every row) in the low nibbles of vector ``c % 32``'s bytes when
  ``c < 32``, in the high ones after: 2400 bytes per group block, 4.69 bits per weight (the
  file's 1.56-3.44);
* ``PLANES``: packed codes of ``elem`` bits (1: Q1_0's signs, 2: Q2_0's codes) as ``CHUNK4``
  with each 32-bit word's codes transposed: code ``g`` of the word moves to byte ``g % 4``,
  bits ``elem * (g // 4)``, so ``(word >> elem * p) & mask`` is codes ``4p..4p+3`` one per
  byte, ready for ``vpdpbusd``.

A repacked group block has the original 16 blocks' size, except where 6-bit scales are
unpacked (Q3_K/Q4_K/Q5_K +4 bytes per row per 256 weights, IQ4_XS +2) and the grid formats
(decoded to 4-bit codes and a table).
Float formats use "blocks" of 16 elements.

:func:`repack` / :func:`repack_many` (numba) and :func:`repack_numpy` (vectorized twin)
produce the same bytes;
:func:`unpack_fields` inverts the layout into per-row field arrays for the numpy references.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
from numba import njit, prange

from .._lazy import lazy_module
from ..errors import ModelError
from ..gguf.constants import GGMLType
from ..simd import load_u32, store_u32
from . import traits
from .traits import (
    CHUNK4,
    GROUP,
    IQ4XSSC,
    IQV,
    IQV_BYTES,
    IQV_SC,
    IQV_TAB,
    IQV_V,
    K4SC,
    PLANES,
    Q3SC,
    Q5HB,
    ROWS,
    XOR80,
    Layout,
    T,
)

if TYPE_CHECKING:  # (the kernel cache's stamp reads this line: a dependency of the kernels)
    from ..quants import _iqcodes
else:  # the grid formats' decoders: imported when a kernel using them compiles or runs
    _iqcodes = lazy_module("llamacpy.quants._iqcodes")


def layout(t, tensor: str | None = None) -> Layout:
    """The repacked layout of type ``t`` (its traits record's); a :class:`ModelError` naming
    the type (and ``tensor``) when the engine has no kernels for it."""
    return traits.get(t, tensor).layout


def n_groups(nrows: int) -> int:
    return (nrows + GROUP - 1) // GROUP


def repacked_nbytes(t: GGMLType | int, nrows: int, ncols: int) -> int:
    lay = layout(t)
    return n_groups(nrows) * (ncols // lay.qk) * lay.dst_bytes


# ----------------------------------------------------------------------------- numba repack
@njit(cache=True, inline="always")
def _k4_scale_min(q, o, j):
    """ggml's get_scale_min_k4 on the 12 packed bytes at ``q[o:]``."""
    if j < 4:
        return np.int64(q[o + j]) & 63, np.int64(q[o + j + 4]) & 63
    a, b, c = np.int64(q[o + j + 4]), np.int64(q[o + j - 4]), np.int64(q[o + j])
    return (a & 0xF) | ((b >> 6) << 4), (a >> 4) | ((c >> 6) << 4)


@njit(cache=True, inline="always")
def _q3_scale(q, o, j):
    """Q3_K sub-block scale ``j`` (0..15) from the 12 packed bytes at ``q[o:]``, minus 32."""
    low = np.int64(q[o + j]) & 15 if j < 8 else np.int64(q[o + j - 8]) >> 4
    high = (np.int64(q[o + 8 + (j % 4)]) >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


@njit(cache=True, inline="always")
def _planes(u, e):
    """A 32-bit word of ``e``-bit codes transposed for ``PLANES`` (see the module docstring)."""
    u = np.int64(u)
    v = 0
    for g in range(32 // e):
        v |= ((u >> (e * g)) & ((1 << e) - 1)) << (8 * (g % 4) + e * (g // 4))
    return np.uint32(v)


@njit(cache=True)
def _repack_iqv(raw, s, out, d, r, t):
    """Row ``r``'s block of grid format ``t`` (bytes at ``raw[s:]``) decoded into the IQV
    group block at ``out[d:]``."""
    v = np.empty(256, np.int8)
    sc = np.empty(16, np.int32)
    dbits = _iqcodes.decode(t, raw, s, v, sc)
    nsub = _iqcodes.NSUB[t]
    out[d + 2 * r] = dbits & 0xFF
    out[d + 2 * r + 1] = (dbits >> 8) & 0xFF
    for k in range(16):
        out[d + IQV_SC + 16 * k + r] = sc[k * nsub // 16]
    code = _iqcodes.VALUE_CODE[t]
    for c in range(32):
        for j in range(4):
            lo = code[np.int64(v[4 * c + j]) + 128]
            hi = code[np.int64(v[4 * (c + 32) + j]) + 128]
            out[d + IQV_V + (c * 16 + r) * 4 + j] = lo | (hi << 4)
    for i in range(64):
        out[d + IQV_TAB + i] = _iqcodes.VALUE_U[t, i % 16]


@njit(cache=True, inline="always")
def _repack_op(raw, s, out, d, r, kind, n, e):
    """One field of row ``r``'s block (bytes at ``raw[s:]``) into the group block at
    ``out[d:]`` (see the field kinds in the module docstring)."""
    if kind == ROWS:
        for i in range(n):
            out[d + r * n + i] = raw[s + i]
    elif kind in (CHUNK4, XOR80):
        x = np.uint32(0x80808080 if kind == XOR80 else 0)
        for c in range(n // 4):
            store_u32(out, d + (c * 16 + r) * 4, load_u32(raw, s + 4 * c) ^ x)
    elif kind == PLANES:
        for c in range(n // 4):
            store_u32(out, d + (c * 16 + r) * 4, _planes(load_u32(raw, s + 4 * c), e))
    elif kind == T:
        if e == 4:
            for i in range(n // 4):
                store_u32(out, d + (i * 16 + r) * 4, load_u32(raw, s + i * 4))
        else:
            for i in range(n // e):
                for j in range(e):
                    out[d + (i * 16 + r) * e + j] = raw[s + i * e + j]
    elif kind == Q5HB:
        qh = np.int64(load_u32(raw, s))
        for j in range(4):
            v = 0
            for c in range(4):
                v |= ((qh >> (4 * c + j)) & 1) << (2 * c)
                v |= ((qh >> (16 + 4 * c + j)) & 1) << (2 * c + 1)
            out[d + r * 4 + j] = v
    elif kind == K4SC:
        for j in range(8):
            sc, mn = _k4_scale_min(raw, s, j)
            out[d + j * 16 + r] = sc
            out[d + 128 + j * 16 + r] = mn
    elif kind == Q3SC:
        for j in range(16):
            out[d + j * 16 + r] = np.uint8(_q3_scale(raw, s, j) & 0xFF)
    elif kind == IQV:
        _repack_iqv(raw, s, out, d, r, e)
    elif kind == IQ4XSSC:
        sh = np.int64(raw[s]) | (np.int64(raw[s + 1]) << 8)
        for j in range(8):
            lo = (np.int64(raw[s + 2 + j // 2]) >> (4 * (j % 2))) & 0xF
            ls = lo | (((sh >> (2 * j)) & 3) << 4)
            out[d + j * 16 + r] = np.uint8((ls - 32) & 0xFF)


@njit(cache=True, inline="always")
def _repack_group(raw, so0, nrows, nblk, src_bytes, dst_bytes, ops, out, do0, g, zero):
    """Row group ``g`` of one tensor: source rows at ``raw[so0:]``, group blocks to ``out[do0:]``.

    Field by field. In a full group the byte arrays (the bulk of every format) are moved one
    destination vector at a time (its 16 lanes are the 16 rows: a loop of constant length
    LLVM unrolls), and 2-byte per-row fields by pairs; ~6x the throughput of one generic
    :func:`_repack_op` per row and block. Other fields and a last, partial group go through
    :func:`_repack_op` (padding rows repack a zero block)."""
    row_bytes = nblk * src_bytes
    full = (g + 1) * 16 <= nrows
    for k in range(ops.shape[0]):
        kind, so, n, do, e = ops[k, 0], ops[k, 1], ops[k, 2], ops[k, 3], ops[k, 4]
        if full and (kind == CHUNK4 or kind == XOR80 or (kind == T and e == 4)):  # noqa: SIM109 (numba)
            x = np.uint32(0x80808080 if kind == XOR80 else 0)
            for b in range(nblk):
                dst = do0 + (g * nblk + b) * dst_bytes + do
                src = so0 + g * 16 * row_bytes + b * src_bytes + so
                for c in range(n // 4):
                    for r in range(16):
                        v = load_u32(raw, src + r * row_bytes + 4 * c) ^ x
                        store_u32(out, dst + (c * 16 + r) * 4, v)
        elif full and kind == T and (e == 2 or e == 1):  # f16/bf16 weights, int8 sub-scales
            for b in range(nblk):
                dst = do0 + (g * nblk + b) * dst_bytes + do
                src = so0 + g * 16 * row_bytes + b * src_bytes + so
                for i in range(n // e):
                    for r in range(16):
                        out[dst + (i * 16 + r) * e] = raw[src + r * row_bytes + i * e]
                        if e == 2:
                            out[dst + (i * 16 + r) * 2 + 1] = raw[src + r * row_bytes + i * 2 + 1]
        elif full and kind == ROWS and n == 2:
            for b in range(nblk):
                dst = do0 + (g * nblk + b) * dst_bytes + do
                src = so0 + g * 16 * row_bytes + b * src_bytes + so
                for r in range(16):
                    out[dst + 2 * r] = raw[src + r * row_bytes]
                    out[dst + 2 * r + 1] = raw[src + r * row_bytes + 1]
        else:
            for b in range(nblk):
                dst = do0 + (g * nblk + b) * dst_bytes + do
                for r in range(16):
                    if g * 16 + r < nrows:
                        src = so0 + (g * 16 + r) * row_bytes + b * src_bytes + so
                        _repack_op(raw, src, out, dst, r, kind, n, e)
                    else:
                        _repack_op(zero, so, out, dst, r, kind, n, e)


@njit(cache=True, parallel=True, nogil=True)
def _repack_jobs(raw, jobs, ops_all, out):
    """Repack several tensors in one parallel region. ``jobs`` int64 ``[n, 8]``: source
    offset, nrows, blocks per row, source / group block bytes, first op row and op count in
    ``ops_all``, destination offset. Work items are (tensor, row group) pairs."""
    n = jobs.shape[0]
    first = np.zeros(n + 1, np.int64)  # first work item of each job
    for j in range(n):
        first[j + 1] = first[j] + (jobs[j, 1] + 15) // 16
    zero = np.zeros(4096, dtype=np.uint8)
    for w in prange(first[n]):
        _repack_item(raw, jobs, first, ops_all, out, w, zero)


def check_tensor(
    nbytes: int, t: GGMLType | int, nrows: int, ncols: int, tensor: str | None = None
) -> None:
    """Raise :class:`ModelError` unless ``nbytes`` hold a repackable ``nrows x ncols``."""
    lay = layout(t, tensor)
    where = f"tensor {tensor!r}: " if tensor else ""
    if ncols % lay.qk:
        raise ModelError(f"{where}{lay.type.name} row length {ncols} is not a multiple of {lay.qk}")
    need = nrows * ncols // lay.qk * lay.src_bytes
    if nbytes < need:
        raise ModelError(f"{where}{lay.type.name} tensor has {nbytes} bytes, {need} needed")


@njit(cache=True, nogil=True)
def _advise(fn, addr, n, advice):
    """``fn(addr, n, advice)``: a C function passed in (a direct call from a parallel
    kernel would make numba treat the pointer as a constant and refuse to cache it)."""
    return fn(addr, n, np.int32(advice))


@njit(cache=True, inline="always")
def _repack_item(raw, jobs, first, ops_all, out, w, zero):
    """Work item ``w`` (a tensor's row group; ``first[j]`` = job ``j``'s first item)."""
    j = np.searchsorted(first, w, side="right") - 1
    so0, nrows, nblk, sb, db, o0, no, do0 = (
        jobs[j, 0], jobs[j, 1], jobs[j, 2], jobs[j, 3], jobs[j, 4], jobs[j, 5],
        jobs[j, 6], jobs[j, 7],
    )  # fmt: skip
    _repack_group(
        raw, so0, nrows, nblk, sb, db, ops_all[o0 : o0 + no], out, do0, w - first[j], zero
    )


@njit(cache=True, parallel=True, nogil=True)
def _repack_mapped(raw, chunks, jobs, first, ops_all, out, advise, base, ctl, c0, nth):
    """Repack a mapped file chunk by chunk, from chunk ``c0``, with no Python and no GIL
    between chunks. Chunk ``c`` = ``chunks[c]``: page-aligned byte range (start, length) and
    its jobs ``[j0, j1)`` (rows as in :func:`_repack_jobs`, source offsets into ``raw``);
    ``first[j]`` = first work item of job ``j``. With ``base`` (the address of ``raw``) each
    chunk's pages are faulted in before (``advise(addr, n, ctl[1])``: MADV_POPULATE_READ)
    and dropped after (``ctl[2]``: MADV_DONTNEED). Runs on ``nth`` threads; returns early
    (the next chunk) when another thread sets ``ctl[0]`` to ask for ``ctl[3]`` threads."""
    zero = np.zeros(4096, dtype=np.uint8)
    for c in range(c0, chunks.shape[0]):
        p0, plen, j0, j1 = chunks[c, 0], chunks[c, 1], chunks[c, 2], chunks[c, 3]
        if base != 0:
            _advise(advise, base + p0, plen, ctl[1])
        w0 = first[j0]
        for w in prange(first[j1] - w0):
            _repack_item(raw, jobs, first, ops_all, out, w0 + w, zero)
        if base != 0:
            _advise(advise, base + p0, plen, ctl[2])
        if ctl[0] != 0 and ctl[3] != nth:
            return c + 1
    return chunks.shape[0]


@njit(cache=True, nogil=True)
def _repack_mapped_1(raw, chunks, jobs, first, ops_all, out, advise, base, ctl, c0):
    """:func:`_repack_mapped` on the calling thread alone, until ``ctl[0]`` is set. Not a
    parallel kernel: launching each parallel region takes the GIL, so a one-thread parallel
    copy in the background waited for the caller's Python code at every chunk (a 48 ms copy
    took 133 ms beside ``llamacpy run``'s start-up)."""
    zero = np.zeros(4096, dtype=np.uint8)
    for c in range(c0, chunks.shape[0]):
        p0, plen, j0, j1 = chunks[c, 0], chunks[c, 1], chunks[c, 2], chunks[c, 3]
        if base != 0:
            _advise(advise, base + p0, plen, ctl[1])
        for w in range(first[j0], first[j1]):
            _repack_item(raw, jobs, first, ops_all, out, w, zero)
        if base != 0:
            _advise(advise, base + p0, plen, ctl[2])
        if ctl[0] != 0:
            return c + 1
    return chunks.shape[0]


def repack_plan(items, out_size: int):
    """``(jobs, first, ops)`` for :func:`_repack_mapped` (and ``_repack_jobs``) from ``items`` = ``(source offset,
    type, nrows, ncols, destination offset)`` (checked against ``out_size`` bytes)."""
    jobs = np.zeros((len(items), 8), np.int64)
    first = np.zeros(len(items) + 1, np.int64)
    ops: list[np.ndarray] = []
    n_ops = 0
    for i, (so, t, nrows, ncols, do) in enumerate(items):
        lay = layout(t)
        size = repacked_nbytes(t, nrows, ncols)
        if do < 0 or do + size > out_size:
            raise ModelError(f"repack destination [{do}, {do + size}) is outside {out_size} bytes")
        o = lay.ops_array
        jobs[i] = (so, nrows, ncols // lay.qk, lay.src_bytes, lay.dst_bytes, n_ops, len(o), do)
        first[i + 1] = first[i] + n_groups(nrows)
        ops.append(o)
        n_ops += len(o)
    return jobs, first, (np.concatenate(ops) if ops else np.zeros((0, 5), np.int64))


def repack_mapped(raw, chunks, items, out, advise, base: int, ctl) -> None:
    """Repack ``items`` (source offsets into ``raw``) chunk by chunk: see
    :func:`_repack_mapped`; ``chunks`` rows: (page start, page length, item range). Starts
    on the calling thread's thread count, or one thread while ``ctl[0]`` is 0, and goes
    on with ``ctl[3]`` threads once another thread sets ``ctl[0]``."""
    jobs, first, ops = repack_plan(items, out.size)
    c = 0
    while c < len(chunks):
        if not ctl[0]:
            c = _repack_mapped_1(raw, chunks, jobs, first, ops, out, advise, base, ctl, c)
            continue
        nth = int(ctl[3])
        numba.set_num_threads(nth)
        c = _repack_mapped(raw, chunks, jobs, first, ops, out, advise, base, ctl, c, nth)


def _check(raw: np.ndarray, lay: Layout, nrows: int, ncols: int) -> None:
    check_tensor(raw.size, lay.type, nrows, ncols)


def repack(raw: np.ndarray, t: GGMLType | int, nrows: int, ncols: int, out=None) -> np.ndarray:
    """Repack a GGUF tensor's bytes (``nrows`` rows of ``ncols`` weights) -> uint8 array."""
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if out is None:
        out = np.empty(repacked_nbytes(t, nrows, ncols), dtype=np.uint8)
    repack_many(raw, [(0, t, nrows, ncols, 0)], out)
    return out


def repack_many(raw: np.ndarray, items, out: np.ndarray) -> None:
    """Repack several tensors of one byte buffer in one parallel call (one launch, not one
    per tensor). ``items``: ``(source offset, type, nrows, ncols, destination offset)``."""
    for so, t, nrows, ncols, _ in items:
        check_tensor(raw[so:].size, t, nrows, ncols)
    jobs, _, ops = repack_plan(items, out.size)
    if len(items):
        _repack_jobs(raw, jobs, ops, out)


# ----------------------------------------------------------------------------- numpy twin
def _k4_scales_np(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scales, mins) [..., 8] from packed bytes [..., 12]."""
    q = q.astype(np.int64)
    sc = np.empty((*q.shape[:-1], 8), np.int64)
    mn = np.empty_like(sc)
    sc[..., :4] = q[..., 0:4] & 63
    mn[..., :4] = q[..., 4:8] & 63
    sc[..., 4:] = (q[..., 8:12] & 0xF) | ((q[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (q[..., 8:12] >> 4) | ((q[..., 4:8] >> 6) << 4)
    return sc, mn


def _q3_scales_np(q: np.ndarray) -> np.ndarray:
    """Signed scales [..., 16] from Q3_K's packed bytes [..., 12]."""
    q = q.astype(np.int64)
    low = np.concatenate([q[..., 0:8] & 0xF, q[..., 0:8] >> 4], axis=-1)
    j = np.arange(16)
    high = (q[..., 8 + j % 4] >> (2 * (j // 4))) & 3
    return (low | (high << 4)) - 32


def _iq4xs_scales_np(q: np.ndarray) -> np.ndarray:
    """Signed scales [..., 8] from IQ4_XS's scales_h (2 bytes) + scales_l (4 bytes)."""
    q = q.astype(np.int64)
    sh = q[..., 0] | (q[..., 1] << 8)
    j = np.arange(8)
    lo = (q[..., 2 + j // 2] >> (4 * (j % 2))) & 0xF
    return (lo | (((sh[..., None] >> (2 * j)) & 3) << 4)) - 32


def _q5_hbits_np(qh: np.ndarray) -> np.ndarray:
    """[..., 4] packed high bits -> [..., 4] bytes in chunk order (see ``Q5HB``)."""
    bits = np.unpackbits(qh, axis=-1, bitorder="little").astype(np.uint8)  # [..., 32]
    out = np.zeros((*qh.shape[:-1], 4), np.uint8)
    for j in range(4):
        for c in range(4):
            out[..., j] |= bits[..., 4 * c + j] << (2 * c)
            out[..., j] |= bits[..., 16 + 4 * c + j] << (2 * c + 1)
    return out


def _planes_np(f: np.ndarray, e: int, inverse: bool = False) -> np.ndarray:
    """``PLANES``' transposition of the 32-bit words of ``f`` [..., 4k] bytes (or its inverse)."""
    u = np.ascontiguousarray(f).view("<u4").astype(np.int64)
    v = np.zeros_like(u)
    for g in range(32 // e):
        a, b = e * g, 8 * (g % 4) + e * (g // 4)
        src, dst = (b, a) if inverse else (a, b)
        v |= ((u >> src) & ((1 << e) - 1)) << dst
    return v.astype("<u4").view(np.uint8)


def iq_module(t):
    """The :mod:`llamacpy.quants` module of grid / ternary format ``t``."""
    return next(m for m in _iqcodes.MODULES if int(m.TYPE) == int(t))


def _iqv_np(f: np.ndarray, t: int) -> np.ndarray:
    """Blocks ``[g, b, row, bytes]`` of grid format ``t`` -> IQV group blocks ``[g, b, IQV_BYTES]``."""
    ng, nblk = f.shape[:2]
    mod = iq_module(t)
    blocks = np.ascontiguousarray(f).reshape(-1, f.shape[-1]).view(mod.BLOCK).reshape(-1)
    dbits, v, sc = mod.decode_numpy(blocks)
    dbits = np.asarray(dbits)
    dbits = dbits.view(np.uint16) if dbits.dtype == np.float16 else dbits.astype(np.uint16)
    sc16 = np.repeat(sc.astype(np.int64), 16 // sc.shape[1], axis=1)  # [n, 16]
    out = np.zeros((ng, nblk, IQV_BYTES), np.uint8)
    out[..., :IQV_SC] = dbits.astype("<u2").view(np.uint8).reshape(ng, nblk, -1)
    sc16 = sc16.reshape(ng, nblk, GROUP, 16).swapaxes(-1, -2)
    out[..., IQV_SC:IQV_V] = sc16.astype(np.uint8).reshape(ng, nblk, -1)
    code = _iqcodes.VALUE_CODE[t][v.astype(np.int64) + 128]
    code = code.reshape(ng, nblk, GROUP, 64, 4).transpose(0, 1, 3, 2, 4)  # [.., vector, row, 4]
    packed = code[:, :, :32] | (code[:, :, 32:] << 4)
    out[..., IQV_V:IQV_TAB] = packed.reshape(ng, nblk, -1)
    out[..., IQV_TAB:] = np.tile(_iqcodes.VALUE_U[t], 4)
    return out


def repack_numpy(raw: np.ndarray, t: GGMLType | int, nrows: int, ncols: int) -> np.ndarray:
    """Vectorized twin of :func:`repack`."""
    lay = layout(t)
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    _check(raw, lay, nrows, ncols)
    nblk, ng = ncols // lay.qk, n_groups(nrows)
    blocks = np.zeros((ng * GROUP, nblk, lay.src_bytes), np.uint8)
    blocks[:nrows] = raw[: nrows * nblk * lay.src_bytes].reshape(nrows, nblk, lay.src_bytes)
    blocks = blocks.reshape(ng, GROUP, nblk, -1).transpose(0, 2, 1, 3)  # [g, b, r, bytes]
    out = np.zeros((ng, nblk, lay.dst_bytes), np.uint8)
    for kind, so, n, do, e in lay.ops:
        f = blocks[..., so : so + n]
        if kind == ROWS:
            v = f
        elif kind in (CHUNK4, XOR80, PLANES):
            f = _planes_np(f, e) if kind == PLANES else f
            v = f.reshape(ng, nblk, GROUP, n // 4, 4).transpose(0, 1, 3, 2, 4)
            v = v ^ np.uint8(0x80) if kind == XOR80 else v
        elif kind == T:
            v = f.reshape(ng, nblk, GROUP, n // e, e).transpose(0, 1, 3, 2, 4)
        elif kind == Q5HB:
            v = _q5_hbits_np(f)
        elif kind == K4SC:
            sc, mn = _k4_scales_np(f)
            v = np.concatenate([sc.swapaxes(-1, -2), mn.swapaxes(-1, -2)], axis=-2)
        elif kind == Q3SC:
            v = _q3_scales_np(f).swapaxes(-1, -2)
        elif kind == IQV:
            v = _iqv_np(f, e)
        else:  # IQ4XSSC
            v = _iq4xs_scales_np(f).swapaxes(-1, -2)
        v = np.ascontiguousarray(v).astype(np.uint8).reshape(ng, nblk, -1)
        out[:, :, do : do + v.shape[-1]] = v
    return out.reshape(-1)


def unpack_fields(packed: np.ndarray, t: GGMLType | int, nrows: int, ncols: int) -> dict:
    """Per-row fields of a repacked tensor, each ``[nrows, nblk, ...]`` in GGUF element order.

    Names: ``f<src_off>`` for copied fields (bytes, as in the GGUF block), ``hb`` (Q5 high
    bits as a [..., 32] 0/1 array), ``sc``/``mn`` (K-quant sub-block scales and mins),
    ``sc`` (Q3_K / IQ4_XS signed scales); IQV: ``d`` (f16 bits), ``sc`` (the scale of every
    16 weights) and ``v`` (int8 values).
    """
    lay = layout(t)
    nblk, ng = ncols // lay.qk, n_groups(nrows)
    p = np.asarray(packed, np.uint8)[: ng * nblk * lay.dst_bytes].reshape(ng, nblk, -1)
    fields = {}

    def rows(v):  # [g, b, r, ...] -> [rows, b, ...]
        v = np.moveaxis(v, 2, 1)
        return v.reshape(ng * GROUP, nblk, *v.shape[3:])[:nrows]

    for kind, so, n, do, e in lay.ops:
        if kind == ROWS:
            fields[f"f{so}"] = rows(p[:, :, do : do + GROUP * n].reshape(ng, nblk, GROUP, n))
        elif kind in (CHUNK4, XOR80, PLANES):
            v = p[:, :, do : do + GROUP * n].reshape(ng, nblk, n // 4, GROUP, 4)
            v = v.transpose(0, 1, 3, 2, 4).reshape(ng, nblk, GROUP, n)
            v = _planes_np(v, e, inverse=True) if kind == PLANES else v
            fields[f"f{so}"] = rows(v ^ np.uint8(0x80) if kind == XOR80 else v)
        elif kind == T:
            v = p[:, :, do : do + GROUP * n].reshape(ng, nblk, n // e, GROUP, e)
            fields[f"f{so}"] = rows(v.transpose(0, 1, 3, 2, 4).reshape(ng, nblk, GROUP, n))
        elif kind == Q5HB:
            v = rows(p[:, :, do : do + 64].reshape(ng, nblk, GROUP, 4)).astype(np.int64)
            hb = np.zeros((*v.shape[:-1], 32), np.int64)
            for j in range(4):
                for c in range(4):
                    hb[..., 4 * c + j] = (v[..., j] >> (2 * c)) & 1
                    hb[..., 16 + 4 * c + j] = (v[..., j] >> (2 * c + 1)) & 1
            fields["hb"] = hb
        elif kind == K4SC:
            v = p[:, :, do : do + 256].reshape(ng, nblk, 2, 8, GROUP).transpose(0, 1, 4, 2, 3)
            v = rows(v).astype(np.int64)
            fields["sc"], fields["mn"] = v[..., 0, :], v[..., 1, :]
        elif kind == IQV:
            q = p[:, :, do : do + IQV_BYTES]
            d16 = rows(np.ascontiguousarray(q[..., :IQV_SC]).reshape(ng, nblk, GROUP, 2))
            fields["d"] = np.ascontiguousarray(d16).view("<u2")[..., 0]
            sc = q[..., IQV_SC:IQV_V].reshape(ng, nblk, 16, GROUP).transpose(0, 1, 3, 2)
            fields["sc"] = rows(sc).astype(np.int64)
            b = q[..., IQV_V:IQV_TAB]
            code = np.concatenate([b & 15, b >> 4], axis=-1)  # vectors 0..31, then 32..63
            u = np.take_along_axis(q[..., IQV_TAB : IQV_TAB + 16], code, axis=-1)
            v = u.reshape(ng, nblk, 64, GROUP, 4).transpose(0, 1, 3, 2, 4)
            v = rows(np.ascontiguousarray(v).reshape(ng, nblk, GROUP, 256))
            fields["v"] = (np.ascontiguousarray(v) ^ np.uint8(0x80)).view(np.int8)
        else:  # Q3SC, IQ4XSSC: signed bytes [sub][row]
            nsub = 16 if kind == Q3SC else 8
            v = p[:, :, do : do + nsub * GROUP].reshape(ng, nblk, nsub, GROUP)
            fields["sc"] = rows(v.transpose(0, 1, 3, 2)).view(np.int8).astype(np.int64)
    return fields
