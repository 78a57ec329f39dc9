"""Slot save/restore (``--slot-save-path``, ``POST /slots/{id}?action=save|restore``): a
saved conversation resumes after a restart without its prompt being read again, and a file
that does not fit this server is a clear 400; one sequence's KV state round trip in the
engine (plain and sliding-window caches)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams
from llamacpy.server import ServerConfig, ServerState, slot_files
from test_server import running

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle:"


def _server(path, **cfg):
    from llamacpy.api.serving import ServingModel

    params = ContextParams(n_ctx=1024, n_batch=128, n_ubatch=128, n_threads=1, n_threads_batch=1)
    model = ServingModel.load(str(path), params, n_parallel=2)
    state = ServerState(ServerConfig(**cfg), model, model_name="m")
    return model, state


def _complete(base, slot):
    r = httpx.post(base + "/completion", json={"prompt": PROMPT, "n_predict": 8, "id_slot": slot,
                                              "temperature": 0}, timeout=600)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.real_model
def test_save_then_restore_in_a_new_server_skips_the_prompt(smollm2_path, tmp_path):
    _, state = _server(smollm2_path, slot_save_path=str(tmp_path))
    with running(state) as base:
        first = _complete(base, 0)
        n_cached = httpx.get(base + "/slots").json()[0]["n_past"]
        r = httpx.post(base + "/slots/0?action=save", json={"filename": "story.bin"})
        assert r.status_code == 200, r.text
        saved = r.json()
        assert saved["id_slot"] == 0 and saved["filename"] == "story.bin"
        assert saved["n_saved"] == n_cached > first["tokens_evaluated"]
        assert saved["n_written"] == (tmp_path / "story.bin").stat().st_size
        assert sorted(p.name for p in tmp_path.iterdir()) == ["story.bin"]  # no temp files
        ref = _complete(base, 0)  # the same request on the cache as saved
        assert ref["timings"]["cache_n"] == first["tokens_evaluated"] - 1
    # a "restarted" server: a fresh context
    _, state2 = _server(smollm2_path, slot_save_path=str(tmp_path))
    with running(state2) as base:
        r = httpx.post(base + "/slots/1?action=restore", json={"filename": "story.bin"})
        assert r.status_code == 200, r.text
        assert r.json()["n_restored"] == n_cached and r.json()["id_slot"] == 1
        assert httpx.get(base + "/slots").json()[1]["n_past"] == n_cached
        again = _complete(base, 1)
        # the whole prompt was in the restored cells: only its last token is decoded again
        assert again["timings"]["cache_n"] == first["tokens_evaluated"] - 1
        assert again["content"] == ref["content"]


@pytest.mark.real_model
def test_bad_requests_and_files_are_clear_400s(smollm2_path, tmp_path):
    model, state = _server(smollm2_path, slot_save_path=str(tmp_path))
    (tmp_path / "junk.bin").write_bytes(b"not a zip at all")
    with running(state) as base:
        _complete(base, 0)
        ok = httpx.post(base + "/slots/0?action=save", json={"filename": "good.bin"})
        assert ok.status_code == 200
        fp = slot_files.fingerprint(model)
        tokens, st = model.scheduler.save_slot(model.scheduler.slots[0])
        slot_files.write(tmp_path / "other.bin", dict(fp, n_vocab=fp["n_vocab"] + 1), tokens, st)
        layout = st["layout"].copy()
        layout[-1] = 8  # a q8_0 V cache
        slot_files.write(tmp_path / "q8.bin", fp, tokens, dict(st, layout=layout))
        slot_files.write(tmp_path / "short.bin", fp, tokens[:-3], st)
        cases = [
            ("save", {"filename": "../escape.bin"}, "Invalid filename"),
            ("save", {"filename": ""}, "non-empty"),
            ("save", {"filename": ".hidden"}, "Invalid filename"),
            ("save", {}, "non-empty"),
            ("restore", {"filename": "missing.bin"}, "does not exist"),
            ("restore", {"filename": "junk.bin"}, "not a slot file"),
            ("restore", {"filename": "other.bin"}, "different model (n_vocab"),
            ("restore", {"filename": "q8.bin"}, "different model or cache type"),
            ("restore", {"filename": "short.bin"}, "do not match"),
        ]
        for action, body, words in cases:
            r = httpx.post(base + f"/slots/1?action={action}", json=body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], (body, r.text)
        assert httpx.get(base + "/health").status_code == 200
        assert httpx.get(base + "/slots").json()[1]["n_past"] == 0  # nothing half-restored
        r = httpx.post(base + "/slots/1?action=restore", json={"filename": "good.bin"})
        assert r.status_code == 200
    _, plain = _server(smollm2_path)  # no --slot-save-path
    with running(plain) as base:
        r = httpx.post(base + "/slots/0?action=save", json={"filename": "good.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]


@pytest.mark.real_model
@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_one_sequence_round_trip_gives_the_same_logits(request, which):
    """A sequence saved, removed and restored (into other cells, next to another sequence)
    continues exactly as it would have; gemma3's cache has a sliding-window part."""
    path = request.getfixturevalue(f"{which}_path")
    ctx = Context(str(path), ContextParams(n_ctx=1024, n_seq_max=2, n_threads=1,
                                           n_threads_batch=1, deterministic=True))  # fmt: skip
    rng = np.random.default_rng(1)
    a = rng.integers(100, 20000, 600).tolist()
    ctx.decode(Batch.from_tokens(a, logits="none"))
    want = ctx.decode(Batch.from_tokens([5], pos0=len(a)))[0]
    ctx.seq_rm(0, len(a), -1)
    state = ctx.kv.get_seq_state(0)
    ctx.seq_rm(0, -1, -1)
    ctx.decode(Batch.from_tokens(a[:50], seq_id=1, logits="none"))  # other cells in use
    ctx.kv.set_seq_state(0, state)
    assert ctx.kv.seq_pos_max(0) == len(a) - 1
    got = ctx.decode(Batch.from_tokens([5], pos0=len(a)))[0]
    np.testing.assert_array_equal(got, want)
    key = next(k for k in state if k.endswith("pos"))
    bad = dict(state, **{key: state[key][::-1].copy()})
    with pytest.raises(Exception, match="increasing"):
        ctx.kv.set_seq_state(0, bad)
