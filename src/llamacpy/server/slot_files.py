"""Slot files: a server slot's cached prompt saved to ``--slot-save-path`` and restored, as
llama-server's ``POST /slots/{id}?action=save|restore``.

A file is an uncompressed ``.npz`` (numpy's zip of arrays, read without pickle): the cached
tokens, the slot's sequence in the KV cache (``m.*``: K/V rows of its cells, positions, the
cache layout) and a fingerprint of what produced it (architecture, layers, vocabulary size
and a hash of every token's text). Restoring checks the fingerprint, the sizes (bounded by
the cache before anything is read) and the layout (model, cache type) and answers a clear
error on any mismatch; files are written to a temporary name and renamed, so a reader never
sees half a file.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import UsageError
from ..fileio import atomic_write

FORMAT = "llamacpy-slot-1"
_MARGIN = 1 << 20  # bytes a file may have beyond its arrays' (zip headers, fingerprint)


def check_filename(name: Any) -> str:
    """A file name inside the slot directory (llama-server's ``fs_validate_filename``
    spirit): a non-empty string without path separators, NUL, a leading dot or ``..``."""
    if not isinstance(name, str) or not name:
        raise UsageError("'filename' must be a non-empty string")
    if (
        len(name.encode("utf-8", "surrogatepass")) > 255
        or any(c in name for c in "/\\\0:")
        or name.startswith(".")
        or ".." in name
        or any(ord(c) < 32 for c in name)
        or name != name.strip()
    ):
        raise UsageError(f"Invalid filename: {name!r}")
    return name


def fingerprint(model: Any) -> dict:
    """What a slot file must have been saved from (computed once per serving model)."""
    fp = getattr(model, "_slot_fingerprint", None)
    if fp is None:
        tok = model.tokenizer
        h = hashlib.sha256()
        for i in range(int(tok.n_vocab)):
            h.update(tok.token_text(i).encode("utf-8", "surrogatepass") + b"\0")
        meta = model.info.metadata
        arch = str(meta.get("general.architecture", ""))
        fp = {
            "format": FORMAT,
            "architecture": arch,
            "n_layer": int(meta.get(f"{arch}.block_count", 0)),
            "n_embd": int(meta.get(f"{arch}.embedding_length", 0)),
            "n_vocab": int(tok.n_vocab),
            "vocab_sha256": h.hexdigest(),
        }
        model._slot_fingerprint = fp
    return fp


def write(path: Path, fp: dict, tokens: list[int], state: dict[str, np.ndarray]) -> int:
    """Write a slot file atomically; returns its size in bytes."""
    arrays = {f"m.{k}": np.ascontiguousarray(a) for k, a in state.items()}
    arrays["tokens"] = np.asarray(tokens, np.int32)
    arrays["fingerprint"] = np.frombuffer(json.dumps(fp, sort_keys=True).encode(), np.uint8)
    with atomic_write(path) as f:
        np.savez(f, **arrays)
    return path.stat().st_size


def read(
    path: Path, fp: dict, max_bytes: int, n_ctx: int
) -> tuple[list[int], dict[str, np.ndarray], int]:
    """(tokens, the sequence's state, bytes read) of a slot file, checked: a ``UsageError``
    names what is wrong (missing, too large, not a slot file, saved from another model)."""
    name = path.name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise UsageError(f"slot file {name!r} does not exist") from None
    except OSError as e:
        raise UsageError(f"slot file {name!r} cannot be read: {e.strerror}") from None
    limit = max_bytes + _MARGIN
    if size > limit:
        raise UsageError(f"slot file {name!r} is {size} bytes, more than this cache can hold")
    try:
        with zipfile.ZipFile(path) as z:
            if sum(i.file_size for i in z.infolist()) > limit:
                raise UsageError(f"slot file {name!r} holds more than this cache can hold")
            for info in z.infolist():  # each array no larger than its bytes say
                with z.open(info) as f:
                    major, _minor = np.lib.format.read_magic(f)
                    header = (
                        np.lib.format.read_array_header_1_0
                        if major == 1
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = header(f)
                if dtype.hasobject or int(np.prod(shape)) * dtype.itemsize > info.file_size:
                    raise UsageError(f"slot file {name!r}: array {info.filename!r} is damaged")
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except UsageError:
        raise
    except Exception as e:  # not a zip, a bad member, a pickled array, ...
        raise UsageError(f"slot file {name!r} is not a slot file ({type(e).__name__})") from None
    try:
        saved = json.loads(bytes(arrays.pop("fingerprint")).decode())
        tokens = arrays.pop("tokens")
    except (KeyError, ValueError, UnicodeDecodeError):
        raise UsageError(f"slot file {name!r} is not a slot file (no fingerprint)") from None
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise UsageError(f"slot file {name!r} is not a {FORMAT} file")
    for key in ("architecture", "n_layer", "n_embd", "n_vocab", "vocab_sha256"):
        if saved.get(key) != fp[key]:
            what = "vocabulary" if key == "vocab_sha256" else key
            raise UsageError(
                f"slot file {name!r} was saved from a different model ({what}: "
                f"{saved.get(key)!r} there, {fp[key]!r} here)"
            )
    if tokens.dtype != np.int32 or tokens.ndim != 1 or len(tokens) > n_ctx:
        raise UsageError(f"slot file {name!r}: the tokens do not fit a slot of {n_ctx}")
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= fp["n_vocab"]):
        raise UsageError(f"slot file {name!r}: a token id is outside the vocabulary")
    state = {k[2:]: a for k, a in arrays.items() if k.startswith("m.")}
    return tokens.tolist(), state, size
