"""``llamacpy tokenize`` against recorded ``llama-tokenize`` runs (same stdout, same exit code)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from llamacpy import cli
from llamacpy.cli import tokenize as tokenize_cli

pytestmark = pytest.mark.real_model

RUNS = json.loads((Path(__file__).parent / "fixtures/tokenizer/cli.json").read_text())


def _stdout_bytes(rec: dict) -> bytes:
    out = rec["stdout"]
    return out["text"].encode() if "text" in out else bytes.fromhex(out["hex"])


@pytest.fixture
def run_cli(monkeypatch, capsysbinary):

    def run(argv: list[str], stdin: bytes = b"") -> tuple[int, bytes, bytes]:
        fake = io.TextIOWrapper(io.BytesIO(stdin))
        monkeypatch.setattr(sys, "stdin", fake)
        rc = cli.main(argv)
        out, err = capsysbinary.readouterr()
        return rc, out, err

    return run


@pytest.mark.parametrize("rec", RUNS, ids=lambda r: f"{r['model']}:{' '.join(r['args'])}"[:80])
def test_same_output_as_llama_tokenize(rec, run_cli, smollm2_path, gemma3_path, tmp_path) -> None:
    model = {"smollm2": smollm2_path, "gemma3": gemma3_path}[rec["model"]]
    args = list(rec["args"])
    if rec["file"] is not None:
        f = tmp_path / "input.txt"
        f.write_bytes(rec["file"].encode())
        args = [str(f) if a == "{FILE}" else a for a in args]
    stdin = (rec["stdin"] or "").encode()
    rc, out, err = run_cli(["tokenize", "-m", str(model), *args], stdin)
    assert (rc != 0) == (rec["rc"] != 0), err
    assert out == _stdout_bytes(rec)
    if rc:
        assert err.startswith(b"llamacpy: error: ") and err.count(b"\n") == 1


def test_registry_name_and_errors(run_cli, smollm2_path) -> None:
    rc, out, _ = run_cli(["tokenize", "-m", "smollm2-135m", "-p", "Hello world", "--ids"])
    assert (rc, out) == (0, b"[19556, 905]\n")
    rc, out, err = run_cli(["tokenize", "-m", "no-such-model.gguf", "-p", "x"])
    assert rc == 1 and out == b"" and b"no-such-model.gguf" in err and b"Traceback" not in err
    rc, _, err = run_cli(["tokenize", "-m", str(smollm2_path), "-f", "/nonexistent/file"])
    assert rc == 1 and b"/nonexistent/file" in err and err.count(b"\n") == 1


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (rb"a\nb\tc\rd", b"a\nb\tc\rd"),
        (rb"\x41\x4A\x4", b"AJ\\x4"),
        (rb"\x-1\x 5", b"\xff\x05"),
        (rb"\q\\\'\"", b"\\q\\'\""),
        (b"end\\", b"end\\"),
    ],
)
def test_escape_processing(raw: bytes, expected: bytes) -> None:
    assert tokenize_cli.process_escapes(raw) == expected
