"""mamba2 (Mamba-2: every layer a selective state-space mixer, no attention) through the
numpy specification (``models/reference.py``, ``models/mamba2_ref.py``) and through the
engine (compiled stages ``mamba2_*``, ``ops/ssm.py``, the recurrent memory), against
llama.cpp's logits (``tests/fixtures/engine/mamba2_logits.npz``,
``scripts/make_qwen35_fixtures.py --arch mamba2``)."""

from __future__ import annotations

import hashlib
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from hybrid_checks import assert_close, assert_engine_close, context, reference_context
from llamacpy.engine.batch import Batch
from llamacpy.errors import ModelError
from llamacpy.gguf import GGMLType, GGUFReader, GGUFValueType, GGUFWriter
from llamacpy.models.mamba2_ref import conv_bias_step, scan_step
from llamacpy.models.reference import Reference
from llamacpy.models.tiny import write_tiny_mamba2
from llamacpy.ops.ssm import conv_bias_tokens, scan_head

FIX = np.load(Path(__file__).parent / "fixtures" / "engine" / "mamba2_logits.npz")
SEED = 3
TOKENS, PROMPT = FIX["tokens"].tolist(), FIX["prompt"].tolist()
# of max |logit| (measured: reference F32 1.4e-6, Q8_0 1.1e-7; engine F32 3.6e-6, Q8_0 0)
RTOL = {"F32": 5e-5, "Q8_0": 1e-5}
_ctx, _reference = context, reference_context
_close, _engine_close = partial(assert_close, RTOL), partial(assert_engine_close, RTOL)


@pytest.fixture(scope="module", params=["F32", "Q8_0"])
def gguf(request, tmp_path_factory):
    """(weight type, path of the tiny model)."""
    t = GGMLType[request.param]
    path = tmp_path_factory.mktemp("mamba2") / f"mamba2_{t.name}.gguf"
    write_tiny_mamba2(path, t, seed=SEED)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(FIX[f"{t.name}.sha256"])
    return t.name, path


# ----------------------------------------------------------------------------- specification
def test_reference_prompt_logits_match_llama_cpp(gguf) -> None:
    name, path = gguf
    got = _reference(path).decode(Batch.from_tokens(TOKENS, logits="all"))
    _close(name, got, FIX[f"{name}.logits"])


def test_reference_greedy_decode_and_split_prompt_match_llama_cpp(gguf) -> None:
    name, path = gguf
    ctx = _reference(path)
    steps, greedy = FIX[f"{name}.steps"], FIX[f"{name}.greedy"].tolist()
    logits = ctx.decode(Batch.from_tokens(PROMPT))[0]
    out = []
    for k in range(len(greedy)):
        _close(name, logits[None], steps[k][None])
        out.append(int(logits.argmax()))
        logits = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(PROMPT) + k))[0]
    assert out == greedy
    ctx = _reference(path)  # a prompt in three ubatches continues the state
    ctx.decode(Batch.from_tokens(TOKENS[:7]))
    ctx.decode(Batch.from_tokens(TOKENS[7:12], pos0=7))
    last = ctx.decode(Batch.from_tokens(TOKENS[12:], pos0=12))
    _close(name, last, FIX[f"{name}.logits"][-1:])


# ----------------------------------------------------------------------------- the engine
@pytest.mark.parametrize(("n_ubatch", "n_threads"), [(512, 2), (7, 1), (1, 2), (3, 2), (5, 3)])
def test_engine_prompt_logits_match_llama_cpp(gguf, n_ubatch, n_threads) -> None:
    name, path = gguf
    ctx = _ctx(path, n_ubatch=n_ubatch, n_threads=n_threads)
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    _engine_close(name, got, FIX[f"{name}.logits"])


def test_engine_greedy_decode_matches_llama_cpp(gguf) -> None:
    name, path = gguf
    ctx = _ctx(path)
    steps, greedy = FIX[f"{name}.steps"], FIX[f"{name}.greedy"].tolist()
    logits = ctx.decode(Batch.from_tokens(PROMPT))
    out = []
    for k in range(len(greedy)):
        _engine_close(name, logits, steps[k][None])
        out.append(int(logits[0].argmax()))
        logits = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(PROMPT) + k))
    _engine_close(name, logits, steps[-1][None])
    assert out == greedy
    # a tail cannot be removed from a recurrent state; the whole sequence can (llama.cpp)
    for (seq, p0, p1), want in zip(FIX["seq_rm_args"].tolist(), FIX[f"{name}.seq_rm"].tolist()):
        assert ctx.seq_rm(seq, p0, p1) is bool(want)


def test_engine_sequences_interleaved_keep_their_own_state(gguf) -> None:
    """Two sequences decoded together (tokens interleaved, each its own state rows) give
    each one's logits alone; a copied state continues as the original; a saved and
    restored state gives the same next logits."""
    _name, path = gguf
    a, b = TOKENS[:9], TOKENS[5:16]
    alone = [_ctx(path, n_seq_max=2).decode(Batch.from_tokens(t, logits="all")) for t in (a, b)]
    ctx = _ctx(path, n_seq_max=2, n_ubatch=8)
    batch = Batch()
    for i in range(max(len(a), len(b))):
        for s, toks in enumerate((a, b)):
            if i < len(toks):
                batch.add(toks[i], i, s, logits=True)
    got = ctx.decode(batch)
    seq = np.array([s for i in range(len(b)) for s in (0, 1) if i < (len(a), len(b))[s]])
    for s in (0, 1):
        np.testing.assert_array_equal(got[seq == s], alone[s])
    ctx.seq_rm(0, -1, -1)
    ctx.seq_cp(1, 0)
    state = ctx.kv.get_state()
    step = [ctx.decode(Batch.from_tokens([7], pos0=len(b), seq_id=s)) for s in (0, 1)]
    np.testing.assert_array_equal(step[0], step[1])
    ctx.kv.set_state(state)
    again = ctx.decode(Batch.from_tokens([7], pos0=len(b), seq_id=1))
    np.testing.assert_array_equal(again, step[1])


def test_compiled_stages_match_the_reference(gguf, monkeypatch) -> None:
    """The compiled forward against models/reference.py's stage functions, ubatch by
    ubatch (the states of both start equal: the reference works on copies)."""
    name, path = gguf
    ctx = _ctx(path, n_ubatch=5)
    ref, compiled, rows = Reference(ctx.model), ctx.model.forward, []

    def both(ws, ub, kv, n_threads, deterministic=False):
        mine = tuple(a.copy() for a in kv[:4])
        want = ref.forward(ub, (*mine, kv[4]), n_threads)
        got = compiled(ws, ub, kv, n_threads, deterministic)
        rows.extend(np.abs(got - want).max(-1) / np.abs(want).max())
        assert (got.argmax(-1) == want.argmax(-1)).all()
        return got

    monkeypatch.setattr(ctx.model, "forward", both)
    ctx.decode(Batch.from_tokens(TOKENS[:12], logits="all"))
    ctx.decode(Batch.from_tokens([3], pos0=12))
    assert np.array(rows).max() < RTOL[name], rows


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("d_state", [64, 128, 80, 16])
def test_scan_head_matches_its_twin(d_state) -> None:
    """ops.ssm.scan_head (the compiled scan of one head, ggml's AVX-512 lane order and its
    scalar tail) against mamba2_ref.scan_step, over a few tokens."""
    rng = np.random.default_rng(d_state)
    f = np.float32
    nh, hd, ng = 4, 32, 2
    inner = nh * hd
    S = rng.standard_normal((nh, hd, d_state)).astype(f)
    flat = S.reshape(-1).copy()
    for _ in range(3):
        x = rng.standard_normal((nh, hd)).astype(f)
        dt = (2.0 * rng.standard_normal(nh)).astype(f)
        dt[0] = 25.0  # softplus's linear branch
        a = -np.exp(rng.standard_normal(nh)).astype(f)
        d = rng.standard_normal(nh).astype(f)
        bc = rng.standard_normal((2, ng, d_state)).astype(f)
        row = np.concatenate([x.reshape(-1), bc.reshape(-1)]).astype(f)
        y = np.zeros(inner, f)
        for h in range(nh):
            b0 = inner + h // (nh // ng) * d_state
            scan_head(flat[h * hd * d_state :], row, h * hd, hd, row, b0, b0 + ng * d_state,
                      d_state, dt[h], a[h], d[h], y, h * hd)  # fmt: skip
        want = scan_step(S, x, dt, a, bc[0], bc[1], d)
        np.testing.assert_allclose(y, want.reshape(-1), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(flat, S.reshape(-1), rtol=1e-5, atol=1e-6)


def test_conv_with_bias_matches_its_twin() -> None:
    """ops.ssm.conv_bias_tokens (tokens of two sequences interleaved) against
    mamba2_ref.conv_bias_step: equal, states included."""
    rng = np.random.default_rng(1)
    f = np.float32
    ch, taps, n, off = 32, 4, 5, 10
    state = rng.standard_normal((2, ch, taps - 1)).astype(f)
    w, b = rng.standard_normal((ch, taps)).astype(f), rng.standard_normal(ch).astype(f)
    x = rng.standard_normal((n, off + ch)).astype(f)
    rows = np.array([1, 0, 1, 1, 0], np.int32)
    mine, out = state.copy(), np.zeros((n, ch), f)
    conv_bias_tokens(x, off, n, rows, mine, w, b, out, 0, ch)
    for t in range(n):
        np.testing.assert_array_equal(out[t], conv_bias_step(state[rows[t]], x[t, off:], w, b))
    np.testing.assert_array_equal(mine, state)


# ----------------------------------------------------------------------------- bad files
def _edited(tmp_path, drop: str = "", keys: dict | None = None) -> Path:
    """The tiny F32 model with tensor ``drop`` left out and ``keys`` set."""
    src = tmp_path / "tiny.gguf"
    write_tiny_mamba2(src, GGMLType.F32, seed=SEED)
    r = GGUFReader(src)
    w = GGUFWriter(tmp_path / "edited.gguf")
    for fld in r.fields.values():
        if fld.key not in (keys or {}):
            w.add_field(fld)
    for k, v in (keys or {}).items():
        if v is not None:
            w.add(k, v, GGUFValueType.UINT32)
    for info in r.tensors:
        if info.name != drop:
            w.add_tensor_info(info)
    w.write()
    return tmp_path / "edited.gguf"


@pytest.mark.parametrize(
    "tensor",
    ["blk.1.ssm_d", "blk.2.ssm_conv1d.bias", "blk.0.ssm_norm.weight", "output_norm.weight"],
)
def test_a_missing_tensor_is_named(tmp_path, tensor) -> None:
    with pytest.raises(ModelError, match=re.escape(repr(tensor)) + ".*required by mamba2"):
        _ctx(_edited(tmp_path, drop=tensor))


BAD_KEYS = [
    ({"mamba2.ssm.group_count": None}, r"'mamba2.ssm.group_count' is missing"),
    (
        {"mamba2.ssm.time_step_rank": 3},
        r"inner_size \(256\) must be a multiple of .*time_step_rank",
    ),
    ({"mamba2.ssm.group_count": 3}, r"time_step_rank \(4.*multiple of .*group_count \(3\)"),
    ({"mamba2.ssm.time_step_rank": 32}, r"head size \(.*time_step_rank = 8\).*multiples of 16"),
    ({"mamba2.ssm.conv_kernel": 1}, r"'mamba2.ssm.conv_kernel' has invalid value 1"),
    ({"mamba2.ssm.state_size": 32}, r"tensor 'blk.0.ssm_in.weight' has shape"),
]


@pytest.mark.parametrize(("keys", "why"), BAD_KEYS, ids=[str(k) for k, _ in BAD_KEYS])
def test_bad_hyper_parameters_are_refused_by_name(tmp_path, keys, why) -> None:
    with pytest.raises(ModelError, match=why):
        _ctx(_edited(tmp_path, keys=keys))


def test_session_resumes_from_a_checkpoint(gguf) -> None:
    """A state-space model's state cannot be rewound either: a prompt departing from the
    cached one after its checkpoint decodes only from there, as a fresh session would."""
    from llamacpy.api.generation import Session
    from llamacpy.engine.scheduler import CHECKPOINT_BACK

    name, path = gguf
    if name != "Q8_0":
        pytest.skip("one weight type is enough")
    first = [(7 * i + 3) % 250 + 1 for i in range(30)]
    second = [*first[:-2], 11, 12, 13]
    s = Session(_ctx(path), tokenizer=None)
    s.ingest(first)
    n0 = s.n_decoded
    s.ingest(second)
    assert s.n_decoded - n0 == len(second) - (len(first) - CHECKPOINT_BACK)
    fresh = Session(_ctx(path), tokenizer=None)
    fresh.ingest(second)
    np.testing.assert_array_equal(s.last_logits, fresh.last_logits)
