"""qwen35 (Qwen3.5 dense: Gated DeltaNet + gated full attention) through the numpy
specification (``models/reference.py``) and the engine's hybrid memory, and qwen35moe
(the same layers with routed experts and a gated shared expert for the FFN), qwen3next
(qwen35moe's layers in Qwen3-Next's layout: fused betas | alphas, value heads grouped by key
head; ``qwen3next_ssm_in``: the older files' fused ``ssm_in``) and lfm2
(short gated convolutions + attention; lfm2moe: with sigmoid-routed experts) through the
engine, against llama.cpp's logits (``tests/fixtures/engine/{arch}_logits.npz``,
``scripts/make_qwen35_fixtures.py``)."""

from __future__ import annotations

import hashlib
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from hybrid_checks import assert_close, assert_engine_close, context, reference_context
from llamacpy.engine import Context, ContextParams
from llamacpy.engine.batch import Batch
from llamacpy.errors import ModelError
from llamacpy.gguf import GGMLType, GGUFReader, GGUFValueType, GGUFWriter
from llamacpy.models.reference import Reference
from llamacpy.models.tiny import (
    write_tiny_lfm2,
    write_tiny_lfm2moe,
    write_tiny_qwen3next,
    write_tiny_qwen35,
    write_tiny_qwen35moe,
)

WRITERS = {"qwen35": write_tiny_qwen35, "qwen35moe": write_tiny_qwen35moe,
           "qwen3next": write_tiny_qwen3next,
           "qwen3next_ssm_in": partial(write_tiny_qwen3next, ssm_in=True),
           "lfm2": write_tiny_lfm2, "lfm2moe": write_tiny_lfm2moe}  # fmt: skip
FIXES = {
    arch: np.load(Path(__file__).parent / "fixtures" / "engine" / f"{arch}_logits.npz")
    for arch in WRITERS
}
FIX = FIXES["qwen35"]
SEED = 3
TOKENS, PROMPT = FIX["tokens"].tolist(), FIX["prompt"].tolist()
# of max |logit| (measured: qwen35 4.5e-5, 1.1e-7; qwen3next 1.0e-4, 8.2e-8)
RTOL = {"F32": 5e-4, "Q8_0": 1e-5}
# Q8_0 weights see their activations rounded to q8_0: a last-bit difference (numpy's float64
# sums) on a rounding boundary moves one activation a whole step, and the recurrent state
# carries it to the ubatch's later rows (measured, qwen35moe: rows 1-4 of the first ubatch
# of 5 within 8.8e-3, the others within 1e-7; the engine itself is bit-identical to
# llama.cpp; qwen3next_ssm_in's greedy decode: 3 of its 9 steps within 5.2e-3). As
# tests/test_reference.py: at most a third of the rows past RTOL, none past FLIPPED.
FLIPPED = 5e-2
_ctx, _reference = context, reference_context
_close, _engine_close = partial(assert_close, RTOL), partial(assert_engine_close, RTOL)


# the numpy specification: qwen35's stages, and qwen3next's (delta_net_*_grouped)
SPEC_ARCHS = ("qwen35", "qwen3next", "qwen3next_ssm_in")


@pytest.fixture(
    scope="module",
    params=[(a, t) for a in SPEC_ARCHS for t in ("F32", "Q8_0")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def model(request, tmp_path_factory):
    arch, name = request.param
    t = GGMLType[name]
    path = tmp_path_factory.mktemp("qwen35") / f"{arch}_{t.name}.gguf"
    WRITERS[arch](path, t, seed=SEED)
    fix = FIXES[arch]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(fix[f"{t.name}.sha256"])
    return t.name, path, fix


def test_prompt_logits_match_llama_cpp(model) -> None:
    name, path, fix = model
    got = _reference(path).decode(Batch.from_tokens(TOKENS, logits="all"))
    _close(name, got, fix[f"{name}.logits"])


def test_greedy_decode_matches_llama_cpp_step_by_step(model) -> None:
    name, path, fix = model
    ctx = _reference(path)
    steps, greedy = fix[f"{name}.steps"], fix[f"{name}.greedy"].tolist()
    logits = ctx.decode(Batch.from_tokens(PROMPT))[0]
    out, got = [], [logits]
    for k in range(len(greedy)):
        out.append(int(logits.argmax()))
        logits = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(PROMPT) + k))[0]
        got.append(logits)
    assert out == greedy
    got = np.array(got)
    assert (got.argmax(-1) == steps.argmax(-1)).all()
    rel = np.abs(got - steps).max(-1) / np.abs(steps).max()
    if name == "F32":
        assert rel.max() < RTOL[name], rel
    else:  # (the numpy twin's float64 sums may flip a q8 rounding: see FLIPPED)
        assert rel.max() < FLIPPED and (rel >= RTOL[name]).sum() <= len(rel) // 3, rel
    # prefix reuse as llama.cpp: a tail cannot be removed from a recurrent state
    for (seq, p0, p1), want in zip(fix["seq_rm_args"].tolist(), fix[f"{name}.seq_rm"].tolist()):
        assert ctx.seq_rm(seq, p0, p1) is bool(want)


def test_a_prompt_in_several_ubatches_continues_the_state(model) -> None:
    name, path, fix = model
    ctx = _reference(path)
    ctx.decode(Batch.from_tokens(TOKENS[:7]))
    ctx.decode(Batch.from_tokens(TOKENS[7:12], pos0=7))
    last = ctx.decode(Batch.from_tokens(TOKENS[12:], pos0=12))
    _close(name, last, fix[f"{name}.logits"][-1:])


# ----------------------------------------------------------------------------- the engine
# The architecture module (models/qwen35.py) through Context: its compiled stages
# (Gated DeltaNet, gated attention) and the hybrid memory, against llama.cpp's logits.


@pytest.fixture(
    scope="module",
    params=[(a, t) for a in WRITERS for t in ("F32", "Q8_0")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def gguf(request, tmp_path_factory):
    """(weight type, path of the tiny model, llama.cpp's fixtures of it)."""
    arch, name = request.param
    path = tmp_path_factory.mktemp("qwen35_engine") / f"{arch}_{name}.gguf"
    WRITERS[arch](path, GGMLType[name], seed=SEED)
    fix = FIXES[arch]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(fix[f"{name}.sha256"])
    return name, path, fix


@pytest.mark.parametrize(("n_ubatch", "n_threads"), [(512, 2), (7, 1), (1, 2), (3, 2)])
def test_engine_prompt_logits_match_llama_cpp(gguf, n_ubatch, n_threads) -> None:
    name, path, fix = gguf
    ctx = _ctx(path, n_ubatch=n_ubatch, n_threads=n_threads)
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    _engine_close(name, got, fix[f"{name}.logits"])


def test_engine_greedy_decode_matches_llama_cpp(gguf) -> None:
    name, path, fix = gguf
    ctx = _ctx(path)
    steps, greedy = fix[f"{name}.steps"], fix[f"{name}.greedy"].tolist()
    logits = ctx.decode(Batch.from_tokens(PROMPT))
    out = []
    for k in range(len(greedy)):
        _engine_close(name, logits, steps[k][None])
        out.append(int(logits[0].argmax()))
        logits = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(PROMPT) + k))
    assert out == greedy
    for (seq, p0, p1), want in zip(fix["seq_rm_args"].tolist(), fix[f"{name}.seq_rm"].tolist()):
        assert ctx.seq_rm(seq, p0, p1) is bool(want)


def test_engine_sequences_interleaved_in_a_ubatch_keep_their_own_state(gguf) -> None:
    """Two sequences decoded together (tokens interleaved, each its own state row) give
    each one's logits alone, and a copied state continues as the original (deterministic
    contexts: attention in order of position, so the cells' places do not matter)."""
    _name, path, _fix = gguf
    a, b = TOKENS[:9], TOKENS[5:16]
    alone = []
    for toks in (a, b):
        ctx = _ctx(path, n_seq_max=2, deterministic=True)
        alone.append(ctx.decode(Batch.from_tokens(toks, logits="all")))
    ctx = _ctx(path, n_seq_max=2, n_ubatch=8, deterministic=True)
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
    step = [ctx.decode(Batch.from_tokens([7], pos0=len(b), seq_id=s)) for s in (0, 1)]
    np.testing.assert_array_equal(step[0], step[1])


def test_compiled_stages_match_the_reference(gguf, monkeypatch) -> None:
    """The compiled forward against models/reference.py's stage functions (the Branch
    picks the Gated DeltaNet or the gated attention stages per layer), ubatch by ubatch."""
    name, path, _fix = gguf
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
    rel = np.array(rows)
    if name == "F32":
        assert rel.max() < RTOL[name], rel
    else:
        assert rel.max() < FLIPPED and (rel >= RTOL[name]).sum() <= len(rel) // 3, rel


def _copy(
    tmp_path, t: GGMLType, drop: str = "", writer=write_tiny_qwen35, reshape=None
) -> tuple[GGUFReader, GGUFWriter]:
    """The tiny model's fields and tensors (but ``drop``; shapes through ``reshape``) queued
    on a writer of a new file (``tiny.gguf`` -> ``edited.gguf``)."""
    src = tmp_path / "tiny.gguf"
    writer(src, t, seed=SEED)
    r = GGUFReader(src)
    w = GGUFWriter(tmp_path / "edited.gguf")
    for f in r.fields.values():
        w.add_field(f)
    for info in r.tensors:
        if info.name == drop:
            continue
        if reshape is None:
            w.add_tensor_info(info)
        else:
            w.add_tensor(info.name, info.type, reshape(info), lambda info=info: info.raw)
    return r, w


MISSING = [
    (write_tiny_qwen35, "blk.1.ssm_out.weight", r"layer 1 is a Gated DeltaNet"),
    (write_tiny_qwen35moe, "blk.3.attn_q_norm.weight", r"layer 3 is a full-attention"),
    (write_tiny_qwen35moe, "blk.2.ffn_gate_inp_shexp.weight", r"required by qwen35moe"),
    (write_tiny_qwen35moe, "blk.0.ffn_down_exps.weight", r"required by qwen35moe"),
    (write_tiny_qwen3next, "blk.1.ssm_ba.weight", r"layer 1 is a Gated DeltaNet"),
    (write_tiny_qwen3next, "blk.0.attn_gate.weight", r"layer 0 is a Gated DeltaNet"),
    (write_tiny_qwen3next, "blk.3.attn_q_norm.weight", r"layer 3 is a full-attention"),
    (write_tiny_qwen3next, "blk.2.ffn_gate_inp_shexp.weight", r"required by qwen3next"),
    (write_tiny_lfm2, "blk.1.shortconv.in_proj.weight", r"layer 1 is a convolution layer"),
    (write_tiny_lfm2, "blk.2.attn_k_norm.weight", r"layer 2 is an attention layer"),
    (write_tiny_lfm2moe, "blk.2.exp_probs_b.bias", r"layer 2 has a mixture-of-experts FFN"),
    (write_tiny_lfm2moe, "blk.0.ffn_up.weight", r"layer 0 has a dense FFN"),
]


@pytest.mark.parametrize(("writer", "tensor", "why"), MISSING, ids=[m[1] for m in MISSING])
def test_a_missing_tensor_is_named(tmp_path, writer, tensor, why) -> None:
    _r, w = _copy(tmp_path, GGMLType.F32, drop=tensor, writer=writer)
    w.write()
    with pytest.raises(ModelError, match=re.escape(repr(tensor)) + ".*" + why):
        _ctx(tmp_path / "edited.gguf")


def test_qwen3next_channels_from_attn_qkv_or_ssm_in(tmp_path) -> None:
    """A qwen3next Gated DeltaNet layer needs ``attn_qkv`` + ``attn_gate`` or the older
    ``ssm_in``; with both, ``attn_qkv`` runs (as llama.cpp): the logits of the file
    without ``ssm_in``."""
    older = partial(write_tiny_qwen3next, ssm_in=True)
    _r, w = _copy(tmp_path, GGMLType.F32, drop="blk.0.ssm_in.weight", writer=older)
    w.write()
    with pytest.raises(ModelError, match=r"'blk.0.attn_qkv.weight' is missing.*layer 0 is a Ga"):
        _ctx(tmp_path / "edited.gguf")
    r, w = _copy(tmp_path, GGMLType.Q8_0, writer=write_tiny_qwen3next)
    e = int(r.metadata["qwen3next.embedding_length"])
    qkvz = r.tensor("blk.1.attn_qkv.weight").shape[1] + r.tensor("blk.1.attn_gate.weight").shape[1]
    junk = np.random.default_rng(0).standard_normal((qkvz, e)).astype(np.float32)
    w.add_tensor("blk.1.ssm_in.weight", GGMLType.F32, (e, qkvz), junk.view(np.uint8))
    w.write()
    got = _ctx(tmp_path / "edited.gguf").decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_array_equal(got, FIXES["qwen3next"]["Q8_0.logits"])


def test_qwen3next_bad_layouts_are_refused(tmp_path) -> None:
    """Value heads not a whole number of times the key heads, qwen35's split beta / alpha,
    a fused ``ssm_ba`` of the wrong size: typed errors naming the key or tensor."""
    with pytest.raises(ModelError, match=r"time_step_rank \(3, the value heads\) must be a mul"):
        write_tiny_qwen3next(tmp_path / "odd.gguf", GGMLType.F32, seed=SEED, dt_rank=3)
        _ctx(tmp_path / "odd.gguf")
    r, w = _copy(tmp_path, GGMLType.F32, writer=write_tiny_qwen3next)
    e = int(r.metadata["qwen3next.embedding_length"])
    beta = np.zeros((4, e), np.float32)
    w.add_tensor("blk.0.ssm_beta.weight", GGMLType.F32, (e, 4), beta.view(np.uint8))
    w.write()
    with pytest.raises(ModelError, match=r"'blk.0.ssm_beta.weight'.*not supported"):
        _ctx(tmp_path / "edited.gguf")
    (tmp_path / "edited.gguf").unlink()
    _r, w = _copy(tmp_path, GGMLType.F32, writer=write_tiny_qwen3next,
                  reshape=lambda t: (t.shape[0], 4, 2) if t.name.endswith("ssm_ba.weight")
                  else t.shape)  # fmt: skip
    w.write()
    with pytest.raises(ModelError, match=r"'blk.0.ssm_ba.weight' has shape \(256, 4, 2\)"):
        _ctx(tmp_path / "edited.gguf")


def test_recurrent_layers_flags_say_each_layers_kind(tmp_path) -> None:
    """A file's ``attention.recurrent_layers`` (converted files have it) gives each layer's
    kind, as llama.cpp reads it: the tiny file's layout flagged runs as before, a layout
    its tensors do not fit is refused naming the tensor, a list of the wrong length too."""
    for flags, err in (
        ([True, True, True, False], None),
        ([True, True, False, True], r"'blk.2.attn_q.weight' is missing.*layer 2 is a full-att"),
        ([True, True, True], r"recurrent_layers' must hold one flag per block \(4\)"),
    ):
        _r, w = _copy(tmp_path, GGMLType.Q8_0, writer=write_tiny_qwen3next)
        w.add("qwen3next.attention.recurrent_layers", np.array(flags, bool))
        w.write()
        if err is None:
            ctx = _ctx(tmp_path / "edited.gguf")
            got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
            np.testing.assert_array_equal(got, FIXES["qwen3next"]["Q8_0.logits"])
        else:
            with pytest.raises(ModelError, match=err):
                _ctx(tmp_path / "edited.gguf")
        (tmp_path / "edited.gguf").unlink()


def test_multi_token_prediction_blocks_are_not_part_of_the_trunk(tmp_path) -> None:
    """A file with ``nextn_predict_layers`` blocks after the trunk (their tensors named
    ``blk.N.nextn.*``) runs the trunk only, as llama.cpp: the logits of the file without them."""
    r, w = _copy(tmp_path, GGMLType.Q8_0)
    w.add("qwen35.block_count", 5, GGUFValueType.UINT32)
    w.add("qwen35.nextn_predict_layers", 1, GGUFValueType.UINT32)
    e = int(r.metadata["qwen35.embedding_length"])
    eh = np.random.default_rng(0).standard_normal((e, 2 * e)).astype(np.float32)
    w.add_tensor("blk.4.nextn.eh_proj.weight", GGMLType.F32, (2 * e, e), eh.view(np.uint8))
    w.write()
    got = _ctx(tmp_path / "edited.gguf").decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_array_equal(got, FIX["Q8_0.logits"])


def test_a_two_dimensional_shared_expert_gate_loads(tmp_path) -> None:
    """Converted files keep ``ffn_gate_inp_shexp`` as ``[n_embd, 1]`` (a torch ``[1, n_embd]``
    weight); llama.cpp loads it as the declared ``[n_embd]``, and so do we: same logits."""
    gate = "ffn_gate_inp_shexp.weight"
    _r, w = _copy(tmp_path, GGMLType.Q8_0, writer=write_tiny_qwen35moe,
                  reshape=lambda t: (*t.shape, 1) if t.name.endswith(gate) else t.shape)  # fmt: skip
    w.write()
    src, dst = tmp_path / "tiny.gguf", tmp_path / "edited.gguf"
    assert GGUFReader(dst).tensor("blk.0." + gate).shape == (256, 1)
    got = [_ctx(p).decode(Batch.from_tokens(TOKENS[:6], logits="all")) for p in (src, dst)]
    np.testing.assert_array_equal(got[0], got[1])


def test_per_layer_kv_heads_only_for_hybrids(tmp_path) -> None:
    """A head_count_kv array with zeros is a hybrid's (lfm2); elsewhere it is refused by
    name, and lfm2 checks its length."""
    from llamacpy.models.tiny import write_tiny_llama

    src = tmp_path / "llama.gguf"
    write_tiny_llama(src, GGMLType.F32, seed=1)
    r = GGUFReader(src)
    w = GGUFWriter(tmp_path / "edited.gguf")
    n_layer = int(r.metadata["llama.block_count"])
    for f in r.fields.values():
        if f.key == "llama.attention.head_count_kv":
            w.add(f.key, np.array([0] + [2] * (n_layer - 1), np.uint32))
        else:
            w.add_field(f)
    for info in r.tensors:
        w.add_tensor_info(info)
    w.write()
    with pytest.raises(ModelError, match=r"per-layer values \[0, 2\].*head_count_kv"):
        Context(tmp_path / "edited.gguf", ContextParams(n_ctx=32))
    _r, w = _copy(tmp_path, GGMLType.F32, writer=write_tiny_lfm2)
    w.add("lfm2.attention.head_count_kv", np.array([0, 0, 2], np.uint32))
    w.write()
    with pytest.raises(ModelError, match="has 3 entries for 4 layers"):
        Context(tmp_path / "edited.gguf", ContextParams(n_ctx=32))


@pytest.mark.parametrize("writer", [write_tiny_lfm2, write_tiny_qwen35], ids=["lfm2", "qwen35"])
def test_server_resumes_a_diverging_prompt_from_a_checkpoint(tmp_path, writer) -> None:
    """A hybrid's state cannot be rewound: the server keeps a checkpoint of each prompt's
    state a few tokens before its end, so a next prompt that departs from the cached one
    after that point (a chat's next turn re-rendering the reply) decodes only its tail,
    and answers exactly as from scratch."""
    import httpx

    from llamacpy.api.serving import ServingModel
    from llamacpy.engine.scheduler import CHECKPOINT_BACK
    from llamacpy.server import ServerConfig, ServerState
    from test_server import running

    path = tmp_path / "hybrid.gguf"
    writer(path, GGMLType.Q8_0, seed=SEED)
    first = [(7 * i + 3) % 250 + 1 for i in range(40)]
    second = [*first[:-3], 11, 12, 13, 14, 15]
    body = {"n_predict": 6, "temperature": 0, "return_tokens": True}

    def serve():
        params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
        model = ServingModel.load(str(path), params, n_parallel=1, max_queue=2)
        return running(ServerState(ServerConfig(timeout=600), model, model_name="m"))

    with serve() as base:
        http = httpx.Client(base_url=base, timeout=600)
        http.post("/completion", json={"prompt": first, **body})
        again = http.post("/completion", json={"prompt": second, **body}).json()
        diverged = http.post("/completion", json={"prompt": [5, *second[1:]], **body}).json()
    assert again["timings"]["cache_n"] == len(first) - CHECKPOINT_BACK
    assert diverged["timings"]["cache_n"] == 0  # no checkpoint fits: from the start
    with serve() as base:
        fresh = httpx.Client(base_url=base, timeout=600).post(
            "/completion", json={"prompt": second, **body}).json()  # fmt: skip
    assert fresh["timings"]["cache_n"] == 0
    assert again["tokens"] == fresh["tokens"] and again["content"] == fresh["content"]


def test_lfm2moe_needs_the_sigmoid_router(tmp_path) -> None:
    _r, w = _copy(tmp_path, GGMLType.F32, writer=write_tiny_lfm2moe)
    w.add("lfm2moe.expert_gating_func", 1, GGUFValueType.UINT32)
    w.write()
    with pytest.raises(ModelError, match=r"expert_gating_func is 1; only the sigmoid router"):
        Context(tmp_path / "edited.gguf", ContextParams(n_ctx=32))


@pytest.mark.parametrize("writer", [write_tiny_lfm2, write_tiny_qwen35], ids=["lfm2", "qwen35"])
def test_session_resumes_a_diverging_prompt_from_a_checkpoint(tmp_path, writer) -> None:
    """The ``Llama`` API and the CLI chat keep checkpoints as the server does: a next prompt
    that departs from the cached one after its checkpoint decodes only from there, with the
    logits a fresh session gives; one departing before every checkpoint starts over."""
    from llamacpy.api.generation import Session
    from llamacpy.engine.scheduler import CHECKPOINT_BACK

    path = tmp_path / "hybrid.gguf"
    writer(path, GGMLType.Q8_0, seed=SEED)
    first = [(7 * i + 3) % 250 + 1 for i in range(40)]
    second = [*first[:-3], 11, 12, 13, 14, 15]
    params = ContextParams(n_ctx=256, n_batch=64, n_ubatch=64, n_threads=1)
    s = Session(Context(path, params), tokenizer=None)
    s.ingest(first)
    assert [c[0] for c in s.checkpoints] == [len(first) - CHECKPOINT_BACK]
    n0 = s.n_decoded
    s.ingest(second)
    assert s.n_decoded - n0 == len(second) - (len(first) - CHECKPOINT_BACK)
    fresh = Session(Context(path, params), tokenizer=None)
    fresh.ingest(second)
    np.testing.assert_array_equal(s.last_logits, fresh.last_logits)
    n1 = s.n_decoded
    s.ingest([5, *second[1:]])  # no checkpoint fits: from the start
    assert s.n_decoded - n1 == len(second)
    assert [c[0] for c in s.checkpoints] == [len(second) - CHECKPOINT_BACK]
