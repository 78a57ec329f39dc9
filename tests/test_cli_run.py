"""``llamacpy run``: llama-completion's seed parity (fixtures recorded with llama.cpp),
text-only stdout, llama.cpp's timing lines on stderr, context overflow and context shift."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llamacpy import cli

FIXTURES = Path(__file__).parent / "fixtures" / "generation"
CLI_CASES = json.loads((FIXTURES / "cli_completions.json").read_text())


@pytest.fixture
def main():
    """``llamacpy``'s entry point (``main(argv) -> exit code``)."""
    return cli.main


def run(main, capsys, path, *args):
    code = main(["run", "-m", str(path), "-t", "1", "--no-display-prompt", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CLI_CASES["cases"], ids=lambda c: c["name"])
def test_seed_parity_with_llama_completion(main, capsys, smollm2_path, reuse_model, case):
    code, out, err = run(main, capsys, smollm2_path, "-p", case["prompt"], "-n",
                         str(CLI_CASES["n_predict"]), "-c", str(CLI_CASES["n_ctx"]),
                         *case["flags"])  # fmt: skip
    assert code == 0, err
    assert out == case["text"] + "\n"


def test_stdout_is_text_and_stderr_has_timings(main, capsys, smollm2_path, reuse_model):
    code, out, err = run(main, capsys, smollm2_path, "-p", "The capital of France is",
                         "-n", "6", "-c", "256", "--temp", "0")  # fmt: skip
    assert code == 0
    assert out == " Paris.\n\nThe United\n"
    assert re.search(r"load time = +\d+\.\d\d ms", err)
    assert re.search(r"prompt eval time = +\d+\.\d\d ms / +5 tokens \( +\d+\.\d\d ms per token, "
                     r"+\d+\.\d\d tokens per second\)", err)  # fmt: skip
    assert re.search(r"eval time = +\d+\.\d\d ms / +5 runs", err)


def test_prompt_is_displayed_as_llama_completion_does(main, capsys, smollm2_path, reuse_model):
    # the prompt's tokens as text (the BOS-less SmolLM2 prompt is the text itself), then the
    # generated text and a newline
    code = main(["run", "-m", str(smollm2_path), "-t", "1", "-p", "The capital of France is",
                 "-n", "6", "-c", "256", "--temp", "0"])  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 0 and out == "The capital of France is Paris.\n\nThe United\n"
    code = main(["run", "-m", str(smollm2_path), "-t", "1", "-p", "<|im_start|>Hi", "-n", "1",
                 "-c", "256", "--temp", "0", "--special", "--display-prompt"])  # fmt: skip
    shown, _ = capsys.readouterr()
    code = main(["run", "-m", str(smollm2_path), "-t", "1", "-p", "<|im_start|>Hi", "-n", "1",
                 "-c", "256", "--temp", "0"])  # fmt: skip
    hidden, _ = capsys.readouterr()
    assert shown.startswith("<|im_start|>Hi") and hidden.startswith("Hi")


def test_prompt_file_and_escapes(main, capsys, smollm2_path, reuse_model, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("The capital of France is\n")  # one trailing newline is dropped
    code, out_f, _ = run(main, capsys, smollm2_path, "-f", str(f), "-n", "3", "-c", "256",
                         "--temp", "0")  # fmt: skip
    assert code == 0 and out_f == " Paris.\n\n"
    code, out_e, _ = run(main, capsys, smollm2_path, "-p", "Q: 1+1?\\nA:", "-n", "2", "-c",
                         "256", "--temp", "0")  # fmt: skip
    code, out_n, _ = run(main, capsys, smollm2_path, "-p", "Q: 1+1?\nA:", "-n", "2", "-c",
                         "256", "--temp", "0")  # fmt: skip
    assert out_e == out_n


def test_generation_stops_when_the_context_is_full(main, capsys, smollm2_path, reuse_model):
    code, _out, err = run(main, capsys, smollm2_path, "-p", "Count: 1, 2, 3,", "-n", "-1",
                         "-c", "32", "--temp", "0", "--ignore-eos")  # fmt: skip
    assert code == 0
    assert "context full" in err
    # prompt + generated tokens fill the 32 cells; the last one is not decoded
    n_prompt = int(re.search(r"prompt eval time = +[\d.]+ ms / +(\d+) tokens", err).group(1))
    m = re.search(r" eval time = +[\d.]+ ms / +(\d+) runs", err)
    assert m and int(m.group(1)) == 32 - n_prompt - 1


def test_context_shift_keeps_generating(main, capsys, smollm2_path, reuse_model):
    code, _out, err = run(main, capsys, smollm2_path, "-p", "Count: 1, 2, 3,", "-n", "40",
                         "-c", "32", "--temp", "0", "--ignore-eos", "--context-shift",
                         "--keep", "-1")  # fmt: skip
    assert code == 0 and "context full" not in err
    m = re.search(r"eval time = +[\d.]+ ms / +(\d+) runs", err)
    assert m and int(m.group(1)) == 39


SHIFT = json.loads((FIXTURES / "context_shift.json").read_text())


@pytest.mark.parametrize("case", SHIFT["cases"], ids=lambda c: f"{c['model']}-keep{c['keep']}")
def test_context_shift_output_is_llama_completions(main, capsys, request, case):
    # greedy past a full context: the same tokens kept and discarded, the same keys re-roped
    path = request.getfixturevalue(case["model"].split("-")[0] + "_path")
    code, out, err = run(main, capsys, path, "-p", SHIFT["prompt"], "-c", str(SHIFT["n_ctx"]),
                         "-n", str(SHIFT["n_predict"]), "--temp", "0", "--ignore-eos",
                         "--context-shift", "--keep", str(case["keep"]))  # fmt: skip
    assert code == 0, err
    assert out == case["text"] + "\n"


def test_prompt_longer_than_the_context_names_both(main, capsys, smollm2_path, reuse_model):
    code, out, err = run(main, capsys, smollm2_path, "-p", "word " * 40, "-c", "32")
    assert code == 1 and out == ""
    assert re.search(r"error: the prompt is too long: \d\d tokens, but the context holds "
                     r"n_ctx = 32", err)  # fmt: skip
    assert "Traceback" not in err and err.count("\n") == 1


def test_usage_errors_are_one_line(main, capsys, smollm2_path):
    code = main(["run", "-m", str(smollm2_path)])
    _, err = capsys.readouterr()
    assert code == 1 and "-p PROMPT or -f FILE" in err and err.count("\n") == 1
    code = main(["run", "-m", str(smollm2_path), "-p", "x", "--temp", "0", "-l", "nonsense"])
    _, err = capsys.readouterr()
    assert code == 1 and "--logit-bias" in err


def test_negative_predict_below_minus_two_is_an_error(main, capsys, smollm2_path):
    code = main(["run", "-m", str(smollm2_path), "-p", "x", "-n", "-5"])
    _, err = capsys.readouterr()
    assert code == 1 and "-n/--predict" in err and "-5" in err and err.count("\n") == 1
