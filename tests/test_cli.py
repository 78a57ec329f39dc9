"""The `llamacpy` command as a whole: entry points, help, and error conventions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llamacpy.cli import SUBCOMMANDS, main


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llamacpy", *args], capture_output=True, text=True, timeout=600
    )


def test_python_dash_m_and_help() -> None:
    p = _run("--help")
    assert p.returncode == 0
    for name in SUBCOMMANDS:
        assert name in p.stdout
    assert _run("--version").stdout.startswith("llamacpy ")


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "usage: llamacpy" in capsys.readouterr().err


def test_unknown_subcommand_is_a_usage_error() -> None:
    p = _run("frobnicate")
    assert p.returncode == 2
    assert "invalid choice" in p.stderr and "Traceback" not in p.stderr


def test_library_errors_are_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 16)
    p = _run("gguf", "dump", str(bad))
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llamacpy: error: ")
    assert "byte offset" in lines[0]


def test_unknown_model_name() -> None:
    p = _run("models", "path", "no-such-model")
    assert p.returncode == 1
    assert p.stderr.strip() == (
        "llamacpy: error: unknown model 'no-such-model'; known models: gemma3-270m, smollm2-135m"
    )


@pytest.mark.parametrize("command", ["run", "chat", "serve", "perplexity", "embed", "bench"])
def test_llama_cpp_gpu_flags_are_accepted_with_a_note(command):
    from llamacpy import cli

    argv = [command, "-m", "x", "-ngl", "99", "-sm", "row", "-mg", "0", "-ts", "3,1", "-dev",
            "none", "-nkvo"]  # fmt: skip
    plain = [command, "-m", "x"] + (["-f", "x.txt"] if command == "perplexity" else [])
    args = cli.build_parser(command).parse_args(plain + argv[3:])
    assert args.compat_gpu_layers == "99" and args.compat_split_mode == "row"
    (note,) = cli.compat_notes(args)
    assert "--gpu-layers" in note and "--no-kv-offload" in note and "no effect" in note
    assert cli.compat_notes(cli.build_parser(command).parse_args(plain)) == []


def test_run_accepts_no_cnv_fa_and_no_warmup():
    from llamacpy import cli

    args = cli.build_parser("run").parse_args(["run", "-m", "x", "-no-cnv", "-fa", "--no-warmup"])
    assert args.compat_no_conversation and args.compat_flash_attn == "on"
    assert args.no_warmup and not hasattr(args, "compat_no_warmup")  # a real flag here
    assert "warm" not in " ".join(cli.compat_notes(args))


def test_warm_up_leaves_an_empty_cache_and_the_same_logits(smollm2_path):
    """The warm-up decode leaves nothing behind: the next prompt's logits are those of a
    fresh context, bit for bit."""
    import numpy as np

    from llamacpy.api.generation import warm_up
    from llamacpy.api.model import load_model
    from llamacpy.engine import Batch, ContextParams

    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1, n_threads_batch=1)
    model = load_model(str(smollm2_path), params)
    ids = model.tokenizer.encode("The sky is blue because", add_special=True)
    cold = np.array(model.ctx.decode(Batch.from_tokens(ids)))
    model.ctx.clear()
    warm_up(model.ctx, model.tokenizer)
    assert model.ctx.kv.seq_pos_max(0) == -1
    assert np.array_equal(np.array(model.ctx.decode(Batch.from_tokens(ids))), cold)


@pytest.mark.parametrize("token", ["-nkvx", "-ngx", "-tb2x"])
def test_an_unknown_short_option_is_named_not_split(token, capsys):
    from llamacpy import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["run", "-m", "x", token, "1", "-p", "hi"])
    assert e.value.code == 2
    assert f"unrecognized option '{token}'" in capsys.readouterr().err


def test_serve_infill_and_slot_flags(tmp_path, smollm2_path, capsys):
    from llamacpy import cli

    p = cli.build_parser("serve")
    args = p.parse_args(["serve", "-m", "x", "--spm-infill", "--slot-save-path", str(tmp_path)])
    assert args.spm_infill and args.slot_save_path == str(tmp_path)
    assert not p.parse_args(["serve", "-m", "x"]).spm_infill
    code = cli.main(["serve", "-m", str(smollm2_path), "--slot-save-path", str(tmp_path / "no")])
    assert code == 1 and "--slot-save-path" in capsys.readouterr().err
