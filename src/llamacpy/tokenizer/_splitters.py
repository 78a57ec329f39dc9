"""llama.cpp's hand-written pre-tokenizer splitters, compiled with numba.

Each function takes the text as code points, llama.cpp's flag table, and the current
segmentation (``offsets``: lengths in code points, summing to ``len(cpts)``) and returns the
refined segmentation, exactly as ``unicode_regex_split_custom_*`` in llama.cpp's unicode.cpp.
A position outside the current segment reads as "no code point" (flags 0).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_LETTER = 0x0004
_NUMBER = 0x0002
_ACCENT = 0x0010
_WS = 0x0100
_OUT = 0xFFFFFFFF
_CR = 13
_LF = 10
_SP = 32
_APOS = 39


@njit(cache=True, inline="always")
def _cpt(cpts, ini, end, pos):  # pragma: no cover - numba
    return np.int64(cpts[pos]) if ini <= pos < end else np.int64(_OUT)


@njit(cache=True, inline="always")
def _fl(cpts, flags, ini, end, pos):  # pragma: no cover - numba
    if ini <= pos < end:
        c = cpts[pos]
        return np.int64(flags[c]) if c < flags.shape[0] else np.int64(1)
    return np.int64(0)


@njit(cache=True, inline="always")
def _crlf(c):  # pragma: no cover - numba
    return (c == _CR) | (c == _LF)


@njit(cache=True, inline="always")
def _low(lower, c):  # pragma: no cover - numba
    return np.int64(lower[c]) if 0 <= c < lower.shape[0] else c


@njit(cache=True)
def split_gpt2(cpts, flags, offsets):  # pragma: no cover - numba
    out = np.empty(cpts.shape[0] + 1, np.int64)
    n_out = 0
    start = 0
    for off in offsets:
        ini = start
        end = start + off
        start = end
        pos = ini
        prev = ini
        while pos < end:
            cpt = _cpt(cpts, ini, end, pos)
            flags0 = _fl(cpts, flags, ini, end, pos)
            if cpt == _APOS and pos + 1 < end:
                nxt = _cpt(cpts, ini, end, pos + 1)
                if nxt == 115 or nxt == 116 or nxt == 109 or nxt == 100:  # s t m d
                    new = pos + 2
                    if new > prev:
                        out[n_out] = new - prev
                        n_out += 1
                    pos += new - prev
                    prev = new
                    continue
                if pos + 2 < end:
                    nn = _cpt(cpts, ini, end, pos + 2)
                    if (
                        (nxt == 114 and nn == 101)
                        or (nxt == 118 and nn == 101)
                        or (nxt == 108 and nn == 108)
                    ):
                        new = pos + 3
                        if new > prev:
                            out[n_out] = new - prev
                            n_out += 1
                        pos += new - prev
                        prev = new
                        continue
            f2 = _fl(cpts, flags, ini, end, pos + 1) if cpt == _SP else flags0
            if f2 & _LETTER:
                pos += 1 if cpt == _SP else 0
                while f2 & _LETTER:
                    pos += 1
                    f2 = _fl(cpts, flags, ini, end, pos)
            elif f2 & _NUMBER:
                pos += 1 if cpt == _SP else 0
                while f2 & _NUMBER:
                    pos += 1
                    f2 = _fl(cpts, flags, ini, end, pos)
            elif not (f2 & (_WS | _LETTER | _NUMBER)) and f2 != 0:
                pos += 1 if cpt == _SP else 0
                while not (f2 & (_WS | _LETTER | _NUMBER)) and f2 != 0:
                    pos += 1
                    f2 = _fl(cpts, flags, ini, end, pos)
            else:
                nws = 0
                while _fl(cpts, flags, ini, end, pos + nws) & _WS:
                    nws += 1
                if nws > 1 and _cpt(cpts, ini, end, pos + nws) != _OUT:
                    pos += nws - 1
                elif nws > 0:
                    pos += nws
                else:
                    pos += 1
            if pos > prev:
                out[n_out] = pos - prev
                n_out += 1
            prev = pos
    return out[:n_out].copy()


@njit(cache=True)
def split_llama3(cpts, flags, lower, offsets, max_digits, accent_marks):  # pragma: no cover
    """LLAMA3 (max_digits=3), QWEN2 (max_digits=1) and QWEN35 (accent_marks=True)."""
    out = np.empty(cpts.shape[0] + 1, np.int64)
    n_out = 0
    start = 0
    lm = _LETTER | _ACCENT if accent_marks else _LETTER
    for off in offsets:
        ini = start
        end = start + off
        start = end
        pos = ini
        prev = ini
        while pos < end:
            cpt = _cpt(cpts, ini, end, pos)
            flags0 = _fl(cpts, flags, ini, end, pos)
            if cpt == _APOS and pos + 1 < end:
                nxt = _low(lower, _cpt(cpts, ini, end, pos + 1))
                if nxt == 115 or nxt == 116 or nxt == 109 or nxt == 100:
                    new = pos + 2
                    if new > prev:
                        out[n_out] = new - prev
                        n_out += 1
                    pos += new - prev
                    prev = new
                    continue
                if pos + 2 < end:
                    nn = _low(lower, _cpt(cpts, ini, end, pos + 2))
                    if (
                        (nxt == 114 and nn == 101)
                        or (nxt == 118 and nn == 101)
                        or (nxt == 108 and nn == 108)
                    ):
                        new = pos + 3
                        if new > prev:
                            out[n_out] = new - prev
                            n_out += 1
                        pos += new - prev
                        prev = new
                        continue
            matched = False
            # [^\r\n\p{L}\p{N}]?\p{L}+  (or [\p{L}\p{M}]+)
            if not (_crlf(cpt) or (flags0 & _NUMBER)) and (
                (flags0 & lm) or (_fl(cpts, flags, ini, end, pos + 1) & lm)
            ):
                pos += 1
                while _fl(cpts, flags, ini, end, pos) & lm:
                    pos += 1
                matched = True
            if not matched and (flags0 & _NUMBER):
                if max_digits == 1:
                    pos += 1
                else:
                    ini_d = pos
                    while _fl(cpts, flags, ini, end, pos) & _NUMBER:
                        pos += 1
                        if pos - ini_d >= max_digits:
                            if pos > prev:
                                out[n_out] = pos - prev
                                n_out += 1
                            prev = pos
                            ini_d = pos
                matched = True
            if not matched:
                f2 = _fl(cpts, flags, ini, end, pos + 1) if cpt == _SP else flags0
                excl = _WS | lm | _NUMBER
                if not (f2 & excl) and flags0 != 0:
                    pos += 1 if cpt == _SP else 0
                    while not (f2 & excl) and f2 != 0:
                        pos += 1
                        f2 = _fl(cpts, flags, ini, end, pos)
                    c2 = _cpt(cpts, ini, end, pos)
                    while _crlf(c2):
                        pos += 1
                        c2 = _cpt(cpts, ini, end, pos)
                    matched = True
            if not matched:
                nws = 0
                last_rn = 0
                while _fl(cpts, flags, ini, end, pos + nws) & _WS:
                    c2 = _cpt(cpts, ini, end, pos + nws)
                    if _crlf(c2):
                        last_rn = pos + nws + 1
                    nws += 1
                if last_rn > 0:
                    pos = last_rn
                elif nws > 1 and _cpt(cpts, ini, end, pos + nws) != _OUT:
                    pos += nws - 1
                elif nws > 0:
                    pos += nws
                else:
                    pos += 1
            if pos > prev:
                out[n_out] = pos - prev
                n_out += 1
            prev = pos
    return out[:n_out].copy()


@njit(cache=True, inline="always")
def _is_han(c):  # pragma: no cover - numba
    return (
        (0x4E00 <= c <= 0x9FFF)
        or (0x3400 <= c <= 0x4DBF)
        or (0x20000 <= c <= 0x2A6DF)
        or (0x2A700 <= c <= 0x2B73F)
        or (0x2B740 <= c <= 0x2B81F)
        or (0x2B820 <= c <= 0x2CEAF)
        or (0x2CEB0 <= c <= 0x2EBEF)
        or (0xF900 <= c <= 0xFAFF)
        or (0x2F800 <= c <= 0x2FA1F)
    )


@njit(cache=True)
def split_kimi_k2(cpts, flags, lower, offsets):  # pragma: no cover - numba
    out = np.empty(cpts.shape[0] + 1, np.int64)
    n_out = 0
    start = 0
    for off in offsets:
        ini = start
        end = start + off
        start = end
        pos = ini
        prev = ini
        while pos < end:
            cpt = _cpt(cpts, ini, end, pos)
            flags0 = _fl(cpts, flags, ini, end, pos)
            if _is_han(cpt):
                while _is_han(_cpt(cpts, ini, end, pos)):
                    pos += 1
                if pos > prev:
                    out[n_out] = pos - prev
                    n_out += 1
                prev = pos
                continue
            lead_ok = not (_crlf(cpt) or (flags0 & (_LETTER | _NUMBER)))
            is_letter_pattern = ((flags0 & _LETTER) and not _is_han(cpt)) or (
                lead_ok
                and (_fl(cpts, flags, ini, end, pos + 1) & _LETTER)
                and not _is_han(_cpt(cpts, ini, end, pos + 1))
            )
            if is_letter_pattern:
                has_lead = False
                if lead_ok:
                    has_lead = True
                    pos += 1
                has_letters = False
                while (_fl(cpts, flags, ini, end, pos) & _LETTER) and not _is_han(
                    _cpt(cpts, ini, end, pos)
                ):
                    has_letters = True
                    pos += 1
                if has_letters or (
                    not has_lead
                    and (_fl(cpts, flags, ini, end, pos) & _LETTER)
                    and not _is_han(_cpt(cpts, ini, end, pos))
                ):
                    if not has_letters:
                        pos += 1
                    while (_fl(cpts, flags, ini, end, pos) & _LETTER) and not _is_han(
                        _cpt(cpts, ini, end, pos)
                    ):
                        pos += 1
                    if _cpt(cpts, ini, end, pos) == _APOS and pos + 1 < end:
                        nxt = _low(lower, _cpt(cpts, ini, end, pos + 1))
                        if nxt == 115 or nxt == 116 or nxt == 109 or nxt == 100:
                            pos += 2
                        elif pos + 2 < end:
                            nn = _low(lower, _cpt(cpts, ini, end, pos + 2))
                            if (
                                (nxt == 114 and nn == 101)
                                or (nxt == 118 and nn == 101)
                                or (nxt == 108 and nn == 108)
                            ):
                                pos += 3
                    if pos > prev:
                        out[n_out] = pos - prev
                        n_out += 1
                    prev = pos
                    continue
                elif has_lead:
                    pos -= 1
            if flags0 & _NUMBER:
                ini_d = pos
                while _fl(cpts, flags, ini, end, pos) & _NUMBER:
                    pos += 1
                    if pos - ini_d >= 3:
                        if pos > prev:
                            out[n_out] = pos - prev
                            n_out += 1
                        prev = pos
                        ini_d = pos
            else:
                f2 = _fl(cpts, flags, ini, end, pos + 1) if cpt == _SP else flags0
                if not (f2 & (_WS | _LETTER | _NUMBER)) and f2 != 0:
                    pos += 1 if cpt == _SP else 0
                    while not (f2 & (_WS | _LETTER | _NUMBER)) and f2 != 0:
                        pos += 1
                        f2 = _fl(cpts, flags, ini, end, pos)
                    c2 = _cpt(cpts, ini, end, pos)
                    while _crlf(c2):
                        pos += 1
                        c2 = _cpt(cpts, ini, end, pos)
                else:
                    nws = 0
                    last_rn = 0
                    while _fl(cpts, flags, ini, end, pos + nws) & _WS:
                        c2 = _cpt(cpts, ini, end, pos + nws)
                        if _crlf(c2):
                            last_rn = pos + nws + 1
                        nws += 1
                    if last_rn > 0:
                        pos = last_rn
                    elif nws > 1 and _cpt(cpts, ini, end, pos + nws) != _OUT:
                        pos += nws - 1
                    elif nws > 0:
                        pos += nws
                    else:
                        pos += 1
            if pos > prev:
                out[n_out] = pos - prev
                n_out += 1
            prev = pos
    return out[:n_out].copy()


@njit(cache=True)
def split_digit_groups(cpts, flags, offsets):  # pragma: no cover - numba
    """AFMOE / tiny_aya digits: each digit run split so that groups of 3 end the run."""
    out = np.empty(cpts.shape[0] + 1, np.int64)
    n_out = 0
    start = 0
    for off in offsets:
        ini = start
        end = start + off
        start = end
        pos = ini
        prev = ini
        while pos < end:
            if _fl(cpts, flags, ini, end, pos) & _NUMBER:
                dstart = pos
                count = 0
                while (_fl(cpts, flags, ini, end, pos) & _NUMBER) and pos < end:
                    count += 1
                    pos += 1
                rem = count % 3
                cur = dstart
                if rem > 0:
                    if cur + rem > prev:
                        out[n_out] = cur + rem - prev
                        n_out += 1
                    prev = cur + rem
                    cur += rem
                while cur < dstart + count:
                    if cur + 3 > prev:
                        out[n_out] = cur + 3 - prev
                        n_out += 1
                    prev = cur + 3
                    cur += 3
                continue
            pos += 1
        if prev < end:
            out[n_out] = end - prev
            n_out += 1
    return out[:n_out].copy()


@njit(cache=True)
def split_newlines(cpts, offsets):  # pragma: no cover - numba
    """``[^\\n]+|[\\n]+``: runs of newlines and runs of anything else."""
    out = np.empty(cpts.shape[0] + 1, np.int64)
    n_out = 0
    start = 0
    for off in offsets:
        ini = start
        end = start + off
        start = end
        pos = ini
        while pos < end:
            nl = cpts[pos] == _LF
            run = pos
            while pos < end and (cpts[pos] == _LF) == nl:
                pos += 1
            out[n_out] = pos - run
            n_out += 1
    return out[:n_out].copy()
