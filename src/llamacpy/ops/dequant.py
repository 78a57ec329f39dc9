"""Dequantization of repacked weights: whole tensors (numpy, the reference) and single rows
(numba: the embedding lookup ``get_rows`` reads the token table in its repacked layout, so a
tied output head and the embedding share one copy).

Both follow ggml's ``dequantize_row_*`` formulas exactly (float32 arithmetic).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..gguf.constants import GGMLType
from ..simd import bits_to_f32, f16_to_f32, load_f16, load_f32
from . import formats as F

KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8
)
_F32 = np.float32


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] bytes -> float32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(_F32)


def _nib(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = q.astype(np.int64)
    return q & 0xF, q >> 4


def dequantize_repacked_numpy(packed: np.ndarray, t: GGMLType | int, nrows: int, ncols: int):
    """float32 ``[nrows, ncols]`` from a repacked tensor (numpy twin of :func:`get_row`)."""
    t = GGMLType(t)
    f = F.unpack_fields(packed, t, nrows, ncols)
    if t == GGMLType.F32:
        return np.ascontiguousarray(f["f0"]).view(_F32).reshape(nrows, ncols)
    if t == GGMLType.F16:
        return np.ascontiguousarray(f["f0"]).view(np.float16).astype(_F32).reshape(nrows, ncols)
    if t == GGMLType.BF16:
        bits = np.ascontiguousarray(f["f0"]).view(np.uint16).astype(np.uint32) << 16
        return bits.view(_F32).reshape(nrows, ncols)
    if t in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.IQ4_NL):
        lo, hi = _nib(f["f2" if t != GGMLType.Q4_1 else "f4"])
        q = np.concatenate([lo, hi], axis=-1)
        d = _f16(f["f0"])[..., None]
        if t == GGMLType.Q4_0:
            y = (q - 8).astype(_F32) * d
        elif t == GGMLType.IQ4_NL:
            y = KVALUES_IQ4NL[q].astype(_F32) * d
        else:
            y = q.astype(_F32) * d + _f16(f["f2"])[..., None]
    elif t in (GGMLType.Q5_0, GGMLType.Q5_1):
        lo, hi = _nib(f["f6" if t == GGMLType.Q5_0 else "f8"])
        q = np.concatenate([lo, hi], axis=-1) | (f["hb"] << 4)
        d = _f16(f["f0"])[..., None]
        if t == GGMLType.Q5_0:
            y = (q - 16).astype(_F32) * d
        else:
            y = q.astype(_F32) * d + _f16(f["f2"])[..., None]
    elif t == GGMLType.Q8_0:
        y = f["f2"].view(np.int8).astype(_F32) * _f16(f["f0"])[..., None]
    else:
        y = _dequant_k(t, f)
    return np.ascontiguousarray(y, dtype=_F32).reshape(nrows, ncols)


def _dequant_k(t: GGMLType, f: dict) -> np.ndarray:
    """The 256-element super-block formats; returns [rows, nblk, 256]."""
    if t == GGMLType.Q2_K:
        d, dmin = _f16(f["f80"])[..., None], _f16(f["f82"])[..., None]
        sc = f["f0"].astype(np.int64)  # [r, b, 16]
        qs = f["f16"].astype(np.int64).reshape(*sc.shape[:2], 2, 32)  # two halves of 32 bytes
        out = np.empty((*sc.shape[:2], 2, 4, 2, 16), _F32)
        for j in range(4):
            v = (qs >> (2 * j)) & 3
            for h in range(2):  # which 16 bytes of the half
                idx = np.arange(2) * 8 + 2 * j + h  # sub-block of each half
                dl = d * (sc[..., idx] & 0xF).astype(_F32)
                ml = dmin * (sc[..., idx] >> 4).astype(_F32)
                out[..., j, h, :] = dl[..., None] * v[..., h * 16 : (h + 1) * 16] - ml[..., None]
        return out.reshape(*sc.shape[:2], 256)
    if t == GGMLType.Q3_K:
        d = _f16(f["f108"])[..., None]
        sc = f["sc"]  # [r, b, 16] signed
        hm = f["f0"].astype(np.int64)  # [r, b, 32]
        qs = f["f32"].astype(np.int64).reshape(*sc.shape[:2], 2, 32)
        out = np.empty((*sc.shape[:2], 2, 4, 2, 16), _F32)
        for n in range(2):
            for j in range(4):
                low = (qs[..., n, :] >> (2 * j)) & 3
                high = (hm >> (4 * n + j)) & 1
                v = low - np.where(high == 1, 0, 4)
                for h in range(2):
                    dl = d[..., 0] * sc[..., 8 * n + 2 * j + h].astype(_F32)
                    out[..., n, j, h, :] = dl[..., None] * v[..., h * 16 : (h + 1) * 16]
        return out.reshape(*sc.shape[:2], 256)
    if t in (GGMLType.Q4_K, GGMLType.Q5_K):
        d, dmin = _f16(f["f0"]), _f16(f["f2"])
        sc, mn = f["sc"], f["mn"]
        q = f["f16" if t == GGMLType.Q4_K else "f48"].astype(np.int64).reshape(*sc.shape[:2], 4, 32)
        out = np.empty((*sc.shape[:2], 4, 2, 32), _F32)
        for j in range(4):
            for h in range(2):
                v = (q[..., j, :] >> (4 * h)) & 0xF
                if t == GGMLType.Q5_K:
                    v = v + ((f["f16"].astype(np.int64) >> (2 * j + h)) & 1) * 16
                dl = d * sc[..., 2 * j + h].astype(_F32)
                ml = dmin * mn[..., 2 * j + h].astype(_F32)
                out[..., j, h, :] = dl[..., None] * v - ml[..., None]
        return out.reshape(*sc.shape[:2], 256)
    if t == GGMLType.Q6_K:
        d = _f16(f["f208"])
        sc = f["f192"].view(np.int8).astype(np.int64)  # [r, b, 16]
        ql = f["f0"].astype(np.int64).reshape(*sc.shape[:2], 2, 64)
        qh = f["f128"].astype(np.int64).reshape(*sc.shape[:2], 2, 32)
        out = np.empty((*sc.shape[:2], 2, 4, 32), _F32)
        for n in range(2):
            a, b, h = ql[..., n, :32], ql[..., n, 32:], qh[..., n, :]
            quads = (
                (a & 0xF) | ((h & 3) << 4),
                (b & 0xF) | (((h >> 2) & 3) << 4),
                (a >> 4) | (((h >> 4) & 3) << 4),
                (b >> 4) | (((h >> 6) & 3) << 4),
            )
            for k, v in enumerate(quads):
                s = sc[..., 8 * n + 2 * k : 8 * n + 2 * k + 2].astype(_F32)  # two 16-blocks
                dl = np.repeat(d[..., None] * s, 16, axis=-1)
                out[..., n, k, :] = dl * (v - 32).astype(_F32)
        return out.reshape(*sc.shape[:2], 256)
    if t == GGMLType.IQ4_XS:
        d = _f16(f["f0"])
        sc = f["sc"]  # [r, b, 8] signed (ls - 32)
        lo, hi = _nib(f["f8"].reshape(*sc.shape[:2], 8, 16))
        q = np.concatenate([lo, hi], axis=-1)  # [r, b, 8, 32]
        dl = d[..., None] * sc.astype(_F32)
        return (dl[..., None] * KVALUES_IQ4NL[q].astype(_F32)).reshape(*sc.shape[:2], 256)
    raise AssertionError(t)


# ----------------------------------------------------------------------------- numba row
@njit(cache=True)
def get_row(w, off, t, ncols, row, out):
    """Dequantize row ``row`` of a repacked tensor (type id ``t``, starting at ``w[off]``)
    into ``out[:ncols]``; the twin of :func:`dequantize_repacked_numpy`."""
    g, r = row // 16, row % 16
    if t == 0 or t == 1 or t == 30:  # F32, F16, BF16: blocks of 16, [k][r][e]
        e = 4 if t == 0 else 2
        gb = ncols * 16 * e
        for k in range(ncols):
            o = off + g * gb + (k * 16 + r) * e
            if t == 0:
                out[k] = load_f32(w, o)
            elif t == 1:
                out[k] = load_f16(w, o)
            else:
                bits = np.int64(w[o]) | (np.int64(w[o + 1]) << 8)
                out[k] = bits_to_f32(bits << 16)
        return
    qk = 256 if t in (10, 11, 12, 13, 14, 23) else 32
    nblk = ncols // qk
    bb = _group_block_bytes(t)
    for b in range(nblk):
        o = off + (g * nblk + b) * bb
        _dequant_block(w, o, t, r, out, b * qk)


@njit(cache=True, inline="always")
def _group_block_bytes(t):
    if t == 2 or t == 20:
        return 288
    if t == 3:
        return 320
    if t == 6:
        return 352
    if t == 7:
        return 384
    if t == 8:
        return 544
    if t == 10:
        return 1344
    if t == 11:
        return 1824
    if t == 12:
        return 2368
    if t == 13:
        return 2880
    if t == 14:
        return 3360
    return 2208  # IQ4_XS


@njit(cache=True, inline="always")
def _c4(w, o, r, i):
    """Byte ``i`` of row ``r`` in a CHUNK4 field starting at ``w[o]``."""
    return np.int64(w[o + ((i // 4) * 16 + r) * 4 + i % 4])


@njit(cache=True, inline="always")
def _h(w, o, r):
    return f16_to_f32(np.int64(w[o + 2 * r]) | (np.int64(w[o + 2 * r + 1]) << 8))


@njit(cache=True)
def _dequant_block(w, o, t, r, out, y0):
    if t == 2 or t == 3 or t == 20:  # Q4_0, Q4_1, IQ4_NL
        d = _h(w, o, r)
        qo = o + (64 if t == 3 else 32)
        for j in range(16):
            q = _c4(w, qo, r, j)
            lo, hi = q & 0xF, q >> 4
            if t == 2:
                out[y0 + j] = np.float32(lo - 8) * d
                out[y0 + j + 16] = np.float32(hi - 8) * d
            elif t == 20:
                out[y0 + j] = np.float32(KVALUES_IQ4NL[lo]) * d
                out[y0 + j + 16] = np.float32(KVALUES_IQ4NL[hi]) * d
            else:
                m = _h(w, o + 32, r)
                out[y0 + j] = np.float32(lo) * d + m
                out[y0 + j + 16] = np.float32(hi) * d + m
    elif t == 6 or t == 7:  # Q5_0, Q5_1
        d = _h(w, o, r)
        hbo = o + (32 if t == 6 else 64)
        qo = o + (96 if t == 6 else 128)
        for j in range(16):
            q = _c4(w, qo, r, j)
            hb = np.int64(w[hbo + r * 4 + j % 4])
            c = j // 4
            lo = (q & 0xF) | (((hb >> (2 * c)) & 1) << 4)
            hi = (q >> 4) | (((hb >> (2 * c + 1)) & 1) << 4)
            if t == 6:
                out[y0 + j] = np.float32(lo - 16) * d
                out[y0 + j + 16] = np.float32(hi - 16) * d
            else:
                m = _h(w, o + 32, r)
                out[y0 + j] = np.float32(lo) * d + m
                out[y0 + j + 16] = np.float32(hi) * d + m
    elif t == 8:  # Q8_0
        d = _h(w, o, r)
        for j in range(32):
            q = _c4(w, o + 32, r, j) ^ 0x80  # stored xored with 0x80 (unsigned)
            out[y0 + j] = np.float32(q - 256 if q >= 128 else q) * d
    else:
        _dequant_block_k(w, o, t, r, out, y0)


@njit(cache=True)
def _dequant_block_k(w, o, t, r, out, y0):
    if t == 10:  # Q2_K
        d, dmin = _h(w, o, r), _h(w, o + 32, r)
        for n in range(2):
            for j in range(4):
                for h in range(2):
                    s = np.int64(w[o + 64 + (8 * n + 2 * j + h) * 16 + r])
                    dl = d * np.float32(s & 0xF)
                    ml = dmin * np.float32(s >> 4)
                    for l in range(16):
                        q = (_c4(w, o + 320, r, 32 * n + 16 * h + l) >> (2 * j)) & 3
                        out[y0 + 128 * n + 32 * j + 16 * h + l] = dl * np.float32(q) - ml
    elif t == 11:  # Q3_K
        d = _h(w, o, r)
        for n in range(2):
            for j in range(4):
                for h in range(2):
                    s = np.int64(np.int8(w[o + 32 + (8 * n + 2 * j + h) * 16 + r]))
                    dl = d * np.float32(s)
                    for l in range(16):
                        i = 16 * h + l
                        q = (_c4(w, o + 800, r, 32 * n + i) >> (2 * j)) & 3
                        hb = (_c4(w, o + 288, r, i) >> (4 * n + j)) & 1
                        out[y0 + 128 * n + 32 * j + i] = dl * np.float32(q - (0 if hb else 4))
    elif t == 12 or t == 13:  # Q4_K, Q5_K
        d, dmin = _h(w, o, r), _h(w, o + 32, r)
        qo = o + (320 if t == 12 else 832)
        for j in range(4):
            for h in range(2):
                sc = np.int64(w[o + 64 + (2 * j + h) * 16 + r])
                mn = np.int64(w[o + 192 + (2 * j + h) * 16 + r])
                dl = d * np.float32(sc)
                ml = dmin * np.float32(mn)
                for l in range(32):
                    q = (_c4(w, qo, r, 32 * j + l) >> (4 * h)) & 0xF
                    if t == 13:
                        q += ((_c4(w, o + 320, r, l) >> (2 * j + h)) & 1) * 16
                    out[y0 + 64 * j + 32 * h + l] = dl * np.float32(q) - ml
    elif t == 14:  # Q6_K
        d = _h(w, o, r)
        for n in range(2):
            for l in range(32):
                a = _c4(w, o + 288, r, 64 * n + l)
                b = _c4(w, o + 288, r, 64 * n + 32 + l)
                h = _c4(w, o + 2336, r, 32 * n + l)
                qs = (
                    (a & 0xF) | ((h & 3) << 4),
                    (b & 0xF) | (((h >> 2) & 3) << 4),
                    (a >> 4) | (((h >> 4) & 3) << 4),
                    (b >> 4) | (((h >> 6) & 3) << 4),
                )
                for k in range(4):
                    s = np.int64(np.int8(w[o + 32 + (8 * n + 2 * k + l // 16) * 16 + r]))
                    out[y0 + 128 * n + 32 * k + l] = d * np.float32(s) * np.float32(qs[k] - 32)
    else:  # IQ4_XS
        d = _h(w, o, r)
        for ib in range(8):
            s = np.int64(np.int8(w[o + 32 + ib * 16 + r]))
            dl = d * np.float32(s)
            for j in range(16):
                q = _c4(w, o + 160, r, 16 * ib + j)
                out[y0 + 32 * ib + j] = dl * np.float32(KVALUES_IQ4NL[q & 0xF])
                out[y0 + 32 * ib + j + 16] = dl * np.float32(KVALUES_IQ4NL[q >> 4])
