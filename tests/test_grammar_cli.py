"""``llamacpy run --grammar/--grammar-file``: the text llama-completion prints with the same
seed, sampler settings and grammar (fixtures recorded with llama.cpp), and grammar errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamacpy import cli

FIX = Path(__file__).parent / "fixtures" / "grammar"
DATA = json.loads((FIX / "cli_grammar.json").read_text())


def test_fixture_count():
    assert len(DATA["cases"]) == 12
    assert {c["model"] for c in DATA["cases"]} == {"smollm2-135m", "gemma3-270m"}


@pytest.mark.parametrize("case", DATA["cases"], ids=lambda c: c["name"])
def test_same_text_as_llama_completion(case, capsys, request, reuse_model):
    path = request.getfixturevalue(
        "smollm2_path" if case["model"] == "smollm2-135m" else "gemma3_path"
    )
    code = cli.main(["run", "-m", str(path), "-t", "1", "-p", case["prompt"], "-n",
                     str(DATA["n_predict"]), "-c", str(DATA["n_ctx"]), "--grammar-file",
                     str(FIX / "gbnf" / case["grammar"]), *case["flags"]])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == case["text"]


def test_grammar_errors_are_one_line(capsys, smollm2_path, tmp_path):
    code = cli.main(["run", "-m", str(smollm2_path), "-p", "x", "--grammar", 'root ::= "a" (b'])
    err = capsys.readouterr().err
    assert (
        code == 1
        and "grammar: expecting ')' at line 1, column 16" in err
        and "Traceback" not in err
    )
    code = cli.main(
        ["run", "-m", str(smollm2_path), "-p", "x", "--grammar-file", str(tmp_path / "no")]
    )
    err = capsys.readouterr().err
    assert code == 1 and "could not open grammar file" in err
    code = cli.main(
        ["run", "-m", str(smollm2_path), "-p", "x", "--grammar", "a", "--grammar-file", "b"]
    )
    assert code == 1 and "not both" in capsys.readouterr().err


def test_grammar_is_checked_before_the_model_loads(capsys, tmp_path, monkeypatch):
    from llamacpy.cli import run

    def no_load(args):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(run, "load", no_load)
    missing = str(tmp_path / "missing.gguf")
    for grammar, where in (('root ::= "a" (b', "line 1, column 16"),
                           ('root ::= x\nx ::= "a" | y', "undefined rule 'y' at line 2, column 13")):  # fmt: skip
        code = cli.main(["run", "-m", missing, "-p", "x", "--grammar", grammar])
        err = capsys.readouterr().err
        assert code == 1 and where in err and len(err.strip().splitlines()) == 1, err
