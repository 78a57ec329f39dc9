"""Start-up without the cyclic collector: the console command turns it off and always gets it
back (frozen start-up objects), a library load restores the caller's setting."""

from __future__ import annotations

import gc
import mmap

import numpy as np
import pytest

from llamacpy import _startup
from llamacpy.api.model import load_model
from llamacpy.cli import main
from llamacpy.engine import ContextParams
from llamacpy.gguf import GGMLType
from llamacpy.models.tiny import write_tiny_llama


@pytest.fixture
def collector():
    """Leave the collector as it was (enabled, nothing frozen) whatever a test does."""
    was = gc.isenabled()
    yield
    _startup._paused = False
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def test_pause_then_resume_freezes_and_enables(collector):
    gc.enable()
    _startup.pause_gc()
    assert not gc.isenabled()
    _startup.resume_gc()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.unfreeze()
    _startup.resume_gc()  # a second call does nothing
    assert gc.get_freeze_count() == 0


def test_resume_leaves_a_collector_it_did_not_pause(collector):
    gc.disable()
    _startup.pause_gc()  # already off: not ours to turn back on
    _startup.resume_gc()
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_gc_paused_restores_the_previous_state(collector):
    for before in (True, False):
        (gc.enable if before else gc.disable)()
        with _startup.gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == before


def test_command_without_a_model_gets_the_collector_back(collector, capsys):
    gc.enable()
    _startup.pause_gc()
    assert main(["models", "list"]) == 0
    assert gc.isenabled()


def test_model_load_ends_start_up(collector, tmp_path, monkeypatch):
    import llamacpy.api.model as api_model

    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, GGMLType.Q8_0)
    seen = []

    def resume() -> None:
        seen.append(gc.isenabled())  # off during the load
        _startup.resume_gc()

    monkeypatch.setattr(api_model, "resume_gc", resume)
    gc.enable()
    _startup.pause_gc()
    load_model(path, ContextParams(n_ctx=64, n_threads=1))
    assert seen == [False] and gc.isenabled() and gc.get_freeze_count() > 0


def test_reserved_memory_is_taken_once_and_only_if_large_enough(monkeypatch):
    monkeypatch.setattr(_startup, "_reserve", None)
    _startup.reserve_memory(1 << 20)  # under the minimum: ignored
    assert _startup.take_memory(1) is None
    _startup.reserve_memory(40 << 20)
    assert _startup.take_memory(41 << 20) is None  # too small: dropped
    assert _startup.take_memory(1) is None  # the reservation is over either way
    _startup.reserve_memory((40 << 20) + 5)
    mm = _startup.take_memory(33 << 20)
    assert mm is not None and len(mm) >= (40 << 20) + 5
    arr = np.frombuffer(mm, np.uint8, count=33 << 20)
    assert arr.flags.writeable and not arr[:: 1 << 12].any()  # zeroed, faulted in
    arr[-1] = 7
    assert _startup.take_memory(1) is None


def test_weights_use_the_reserved_memory(tmp_path, monkeypatch):
    from llamacpy.models import load_model as load_weights

    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, GGMLType.Q8_0)
    plain = load_weights(path, background=False).store.buf.copy()
    monkeypatch.setattr(_startup, "_reserve", None)
    monkeypatch.setattr(_startup, "_MIN_RESERVE", 0)
    _startup.reserve_memory(path.stat().st_size)
    store = load_weights(path, background=True).store
    base = store.buf.base
    assert isinstance(getattr(base, "obj", base), mmap.mmap)  # the reserved map
    np.testing.assert_array_equal(store.buf, plain)


def test_quantize_command_gets_the_collector_back(collector, tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, GGMLType.F32)
    gc.enable()
    _startup.pause_gc()
    assert main(["quantize", str(path), str(tmp_path / "q8.gguf"), "Q8_0", "1"]) == 0
    assert gc.isenabled() and (tmp_path / "q8.gguf").stat().st_size > 0


def test_weight_estimate_covers_repacking_and_every_shard(tmp_path):
    one = tmp_path / "m.gguf"
    one.write_bytes(b"\0" * 1000)
    assert _startup.weight_bytes_estimate(str(one)) == 1040  # +4%: unpacked K-quant scales
    shards = [tmp_path / f"big-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    for i, s in enumerate(shards):
        s.write_bytes(b"\0" * (100 * (i + 1)))
    assert _startup.weight_bytes_estimate(str(shards[0])) == 624  # (100+200+300) * 1.04


def test_yaml_is_deferred_until_used():
    """numba imports yaml at start-up; a stand-in defers the real module to its first use,
    which then works as the module itself (safe_load, YAMLError)."""
    import subprocess
    import sys

    code = (
        "import sys, llamacpy, numba\n"
        "assert 'yaml.reader' not in sys.modules, 'yaml ran at start-up'\n"
        "import yaml\n"
        "assert yaml.safe_load('a: [1, 2]') == {'a': [1, 2]}\n"
        "try:\n"
        "    yaml.safe_load('a: [1')\n"
        "except yaml.YAMLError:\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
