"""The first-run compile helper (``llamacpy.kernel_warm``): its manifest lists kernels and
signatures the command really uses, it compiles them into the disk cache, it is skipped
when turned off or when there is nothing to compile."""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
from numba.core import serialize, types

from llamacpy import kernel_progress, kernel_warm

COMMAND = ["run", "-c", "512", "-n", "8", "--temp", "0", "-p", "The three primary colors are"]


def test_manifest_lists_helper_jobs_for_run_and_chat():
    for command in ("run", "chat"):
        jobs = kernel_warm.helper_jobs(command)
        kids = [kid for kid, _ in jobs]
        assert "llamacpy.models.compose:launch" in kids
        assert "llamacpy.ops.formats:_repack_mapped" in kids
        assert "llamacpy.models.compose:worker" not in kids  # the command compiles it
        for kid, sigs in jobs:
            assert sigs, kid
            disp = kernel_warm.dispatcher(kid)
            assert hasattr(disp, "py_func"), kid
            for s in sigs:
                sig = pickle.loads(base64.b64decode(s))
                assert isinstance(sig, tuple) and all(isinstance(t, types.Type) for t in sig)


def test_helper_signatures_are_the_ones_a_run_uses(smollm2_path):
    """A stale manifest (a kernel's argument types changed) would have the helper compile
    machine code nobody loads: every recorded signature must be one the command compiles
    or loads. If this fails, run scripts/make_kernel_manifest.py."""
    probe = textwrap.dedent(
        f"""
        import base64, json, pickle, sys
        from llamacpy import cli, kernel_warm
        code = cli.main([{COMMAND[0]!r}, "-m", {str(smollm2_path)!r}, *{COMMAND[1:]!r}])
        from llamacpy.ops import formats
        missing = []
        for kid, sigs in kernel_warm.helper_jobs("run"):
            used = set(kernel_warm.dispatcher(kid).signatures)
            if kid.endswith(":_repack_mapped"):  # later starts: _repack_mapped_1's + nth
                from numba.core import types
                used = {{(*s, types.int64) for s in formats._repack_mapped_1.signatures}}
            for s in sigs:
                if pickle.loads(base64.b64decode(s)) not in used:
                    missing.append(kid)
        print("RESULT", json.dumps([code, missing]))
        """
    )
    # the manifest records a default run's kernels: the model's formats only
    env = dict(os.environ, LLAMACPY_COMPILE_HELPER="0", LLAMACPY_KERNEL_FORMATS="model")
    r = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=1800
    )
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, r.stderr[-2000:]
    code, missing = json.loads(line[-1][7:])
    assert code == 0
    assert missing == [], "stale kernel_manifest.json: run scripts/make_kernel_manifest.py"


def test_compile_jobs_compiles_a_recorded_signature(tmp_path, monkeypatch):
    (tmp_path / "warm_probe_mod.py").write_text(
        "from numba import njit\n\n@njit\ndef twice(x):\n    return x * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sig = base64.b64encode(serialize.dumps((types.float64,))).decode()
    bad = base64.b64encode(b"not a pickle").decode()
    jobs = [("warm_probe_mod:twice", [sig]), ("warm_probe_mod:missing", [sig]),
            ("warm_probe_mod:twice", [bad])]  # fmt: skip
    done = kernel_warm.compile_jobs(jobs)
    assert done == ["warm_probe_mod:twice"]  # the unknown kernel and the bad pickle: skipped
    import warm_probe_mod

    assert (types.float64,) in warm_probe_mod.twice.signatures


def test_compile_jobs_stops_when_the_parent_is_gone(tmp_path, monkeypatch):
    (tmp_path / "warm_probe_mod2.py").write_text(
        "from numba import njit\n\n@njit\ndef once(x):\n    return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sig = base64.b64encode(serialize.dumps((types.int64,))).decode()
    assert kernel_warm.compile_jobs([("warm_probe_mod2:once", [sig])], parent=-1) == []


@pytest.mark.parametrize("setting", ["0"])
def test_helper_is_not_started_when_turned_off(monkeypatch, setting):
    monkeypatch.setenv(kernel_warm.ENV, setting)
    started = []
    monkeypatch.setattr(kernel_warm.subprocess, "Popen", lambda *a, **k: started.append(a))
    assert kernel_warm.start("run") == []
    assert started == []


def test_helper_is_not_started_when_everything_is_cached(monkeypatch):
    monkeypatch.setenv(kernel_warm.ENV, "1")
    monkeypatch.setattr(kernel_progress, "is_cached", lambda kid: True)
    started = []
    monkeypatch.setattr(kernel_warm.subprocess, "Popen", lambda *a, **k: started.append(a))
    assert kernel_warm.start("run") == []
    assert started == []


def test_helper_start_returns_its_kernels_and_progress_leaves_them_out(monkeypatch):
    monkeypatch.setenv(kernel_warm.ENV, "1")
    monkeypatch.setattr(kernel_warm, "_cpus", lambda: 2)
    monkeypatch.setattr(kernel_progress, "is_cached", lambda kid: kid.endswith(":launch"))
    started = []
    monkeypatch.setattr(kernel_warm.subprocess, "Popen", lambda *a, **k: started.append(a[0]))
    todo = kernel_warm.start("run")
    assert started and started[0][1:4] == ["-m", "llamacpy.kernel_warm", str(os.getpid())]
    assert "llamacpy.models.compose:launch" not in todo  # cached
    assert "llamacpy.tokenizer.bpe:_bpe_batch" in todo
    started.clear()
    monkeypatch.setattr(kernel_progress, "_active", None)
    monkeypatch.setattr(kernel_progress.event, "register", lambda *a: None)
    p = kernel_progress.show_compile_progress("run")
    assert started == []  # a warm start compiles nothing: no helper, no cache reads
    p._begin(0.0)  # the first compile event
    assert len(started) == 1
    assert not set(todo) & set(p.planned)
    assert "llamacpy.models.compose:worker" in p.planned
    p._begin(0.0)  # later compiles start no other helper
    assert len(started) == 1
