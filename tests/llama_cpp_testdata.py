"""llama.cpp's own test data, fetched once from the llama-cpp-python sdist on PyPI.

The sdist vendors llama.cpp's source, including the tokenizer test vocabularies
(``models/ggml-vocab-*.gguf`` with their ``.inp``/``.out`` golden pairs), the chat
templates (``models/templates/*.jinja``) and ``src/llama-vocab.cpp``. Only those members are
extracted, into ``$LLAMACPY_CACHE/testdata`` (else ``~/.cache/llamacpy/testdata``).

Use the session fixture ``llama_cpp_testdata`` (a :class:`pathlib.Path` to the extracted
``llama.cpp`` directory) by importing it into a test module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

SDIST_PACKAGE = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
_PREFIX = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
_WANTED = ("models/ggml-vocab-", "models/templates/", "src/llama-vocab.cpp")
_STAMP = ".complete"


def cache_root() -> Path:
    env = os.environ.get("LLAMACPY_CACHE")
    if env:
        return Path(env) / "testdata"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "llamacpy" / "testdata"


def testdata_dir() -> Path:
    return cache_root() / f"llama.cpp-{SDIST_VERSION}"


def _download_sdist(dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--no-binary",
        ":all:",
        f"{SDIST_PACKAGE}=={SDIST_VERSION}",
        "-d",
        str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed:\n{proc.stdout}\n{proc.stderr}")
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download left no sdist in {dest}")
    return found[0]


def ensure_testdata() -> Path:
    """Download and extract (once); returns the ``llama.cpp`` directory."""
    target = testdata_dir()
    if (target / _STAMP).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmpdir = Path(tmp)
        sdist = _download_sdist(tmpdir / "sdist")
        out = tmpdir / "llama.cpp"
        with tarfile.open(sdist) as tf:
            for member in tf:
                if not member.isfile() or not member.name.startswith(_PREFIX):
                    continue
                rel = member.name[len(_PREFIX) :]
                if not rel.startswith(_WANTED) or ".." in Path(rel).parts:
                    continue
                dest = out / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                src = tf.extractfile(member)
                assert src is not None
                with src, open(dest, "wb") as f:
                    shutil.copyfileobj(src, f)
        (out / _STAMP).write_text(f"{SDIST_PACKAGE}=={SDIST_VERSION}\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)
    return target


@pytest.fixture(scope="session")
def llama_cpp_testdata() -> Path:
    """Path to the extracted llama.cpp test data (downloaded from PyPI on first use)."""
    return ensure_testdata()


def read_vocab_tests(gguf: Path) -> list[tuple[bytes, list[int]]]:
    """The ``.inp``/``.out`` golden pairs of a ``ggml-vocab-*.gguf`` (as test-tokenizer-0
    reads them; duplicate inputs keep the last expectation)."""
    raw = gguf.with_name(gguf.name + ".inp").read_bytes()
    out_lines = gguf.with_name(gguf.name + ".out").read_bytes().split(b"\n")
    if out_lines and out_lines[-1] == b"":
        out_lines.pop()
    inputs = raw.split(b"\n__ggml_vocab_test__\n")
    if raw.endswith(b"\n__ggml_vocab_test__\n"):
        inputs.pop()
    if len(inputs) != len(out_lines):
        raise ValueError(f"{gguf.name}: {len(inputs)} inputs but {len(out_lines)} outputs")
    tests: dict[bytes, list[int]] = {}
    for text, line in zip(inputs, out_lines, strict=True):
        tests[text] = [int(x) for x in line.split()]
    return list(tests.items())


# --- fixtures generated from llama.cpp (scripts/make_tokenizer_fixtures.py) --------------

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def load_fixture(name: str) -> dict:
    """A gzipped JSON fixture from ``tests/fixtures/``."""
    import gzip
    import json

    with gzip.open(FIXTURES / name, "rt", encoding="utf-8") as f:
        return json.load(f)


def case_bytes(obj: dict, key: str = "") -> bytes:
    """Bytes stored as ``{"text": str}`` or ``{"hex": str}`` (optionally under ``key``)."""
    if key:
        obj = obj[key]
    if "text" in obj:
        return obj["text"].encode("utf-8")
    return bytes.fromhex(obj["hex"])


def pieces_sha256(tok, special: bool) -> str:
    """Hash of every token's piece, as the fixture script computes it."""
    import hashlib

    h = hashlib.sha256()
    for i in range(tok.n_vocab):
        p = tok.token_to_piece(i, special)
        h.update(len(p).to_bytes(4, "little") + p)
    return h.hexdigest()


def attrs_sha256(tok) -> str:
    import hashlib

    return hashlib.sha256(",".join(map(str, tok.vocab.attrs.tolist())).encode()).hexdigest()
