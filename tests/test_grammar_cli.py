"""``llamacpy run --grammar/--grammar-file/-j/-jf``: the text llama-completion prints with
the same seed, sampler settings and grammar or JSON schema (fixtures recorded with
llama.cpp), and grammar and schema errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamacpy import cli

FIX = Path(__file__).parent / "fixtures" / "grammar"
DATA = json.loads((FIX / "cli_grammar.json").read_text())


def test_fixture_count():
    assert len(DATA["cases"]) == 24
    assert {c["model"] for c in DATA["cases"]} == {"smollm2-135m", "gemma3-270m"}
    assert sum("schema" in c for c in DATA["cases"]) == 12


def _constraint(case: dict) -> list[str]:
    if "grammar" in case:
        return ["--grammar-file", str(FIX / "gbnf" / case["grammar"])]
    return ["-j", (FIX / "schemas" / case["schema"]).read_text().strip()]


@pytest.mark.parametrize("case", DATA["cases"], ids=lambda c: c["name"])
def test_same_text_as_llama_completion(case, capsys, request, reuse_model):
    path = request.getfixturevalue(
        "smollm2_path" if case["model"] == "smollm2-135m" else "gemma3_path"
    )
    code = cli.main(["run", "-m", str(path), "-t", "1", "--no-display-prompt", "-p", case["prompt"], "-n",
                     str(DATA["n_predict"]), "-c", str(DATA["n_ctx"]), *_constraint(case),
                     *case["flags"]])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == case["text"] + "\n"


def test_json_schema_file_and_schema_output(capsys, smollm2_path, reuse_model):
    """-jf reads the schema from a file; the output (complete here) is valid for it."""
    import jsonschema

    schema = FIX / "schemas" / "person.json"
    code = cli.main(["run", "-m", str(smollm2_path), "-t", "1", "--no-display-prompt", "-p",
                     "A JSON object describing a person:", "-n", "64", "-s", "42", "-jf",
                     str(schema)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    jsonschema.validate(json.loads(out), json.loads(schema.read_text()))


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
    assert code == 1 and "not several" in capsys.readouterr().err


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


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["-j", '{"type": "object", "properties": {"a": {"$ref": "http://x/y"}}}'],
            "JSON schema error at #/properties/a: unsupported $ref http://x/y",
        ),
        (["-j", '{"type": '], "JSON schema error at #: not valid JSON"),
        (["-jf", "/nonexistent/schema.json"], "could not open JSON schema file"),
        (["-j", "{}", "--grammar", "root ::= x"], "give one of --grammar, --json-schema"),
    ],
)
def test_schema_errors_are_one_line_before_the_model_loads(flags, message, capsys, monkeypatch):
    from llamacpy.cli import run

    monkeypatch.setattr(run, "load", lambda args: pytest.fail("the model was loaded"))
    code = cli.main(["run", "-m", "missing.gguf", "-p", "x", *flags])
    err = capsys.readouterr().err
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_unsupported_pattern_is_a_warning_line(capsys, monkeypatch):
    from llamacpy.cli import run

    class Stop(BaseException):
        pass

    def stop(args):
        raise Stop

    monkeypatch.setattr(run, "load", stop)
    schema = '{"type": "string", "pattern": "^\\\\w+$"}'
    with pytest.raises(Stop):  # the grammar is made: the model would load next
        cli.main(["run", "-m", "missing.gguf", "-p", "x", "-j", schema])
    err = capsys.readouterr().err
    assert "warning: JSON schema conversion was incomplete: pattern ^\\w+$ is not supported" in err
