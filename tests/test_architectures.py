"""The shared runner every registered architecture goes through, and the variants' agreement
with llama.cpp.

* ``BUILDERS`` writes a tiny random model of each architecture (``llamacpy.models.tiny``);
  registering an architecture without an entry here fails
  ``test_every_architecture_has_a_tiny_model``.
* Decoders: logits shapes, cached decode (prompt, then one token at a time) == one full
  forward, a batch of two sequences == each alone, ``seq_rm`` + re-decode == the first pass.
  Encoders (bert): embedding shapes, two sequences in one batch == each alone.
* the cases of ``tiny.LLAMA_CPP_CASES`` (qwen2, qwen3, phi3 with short and long rope
  factors, smollm3, qwen3moe, gpt-oss, gemma2 (attention and final soft-caps), olmo2, gemma4
  (dense; a dense FFN beside experts, split or fused gate|up; 31B's and E2B's layouts, which
  the shared runner checks too: ``RUNNER_VARIANTS``), a llama file with experts (Mixtral), a llama file with
  ``llama.attention.sliding_window``: llama.cpp ignores the key for ``llama``, so do we) vs llama.cpp's logits and greedy continuations (``tests/fixtures/engine/arch_logits.npz``,
  ``scripts/make_arch_fixtures.py``).
* An unknown ``general.architecture`` is an error listing the supported ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from llamacpy.engine import Batch, Context, ContextParams
from llamacpy.errors import ModelError, UsageError
from llamacpy.gguf import GGMLType, GGUFValueType, GGUFWriter
from llamacpy.models import load_model, supported_architectures
from llamacpy.models.tiny import (
    LLAMA_CPP_CASES,
    TINY_ARCHS,
    write_tiny_bert,
    write_tiny_granitehybrid,
    write_tiny_lfm2,
    write_tiny_lfm2moe,
    write_tiny_llama,
    write_tiny_mamba2,
    write_tiny_qwen3next,
    write_tiny_qwen35,
    write_tiny_qwen35moe,
)

FIX = np.load(Path(__file__).parent / "fixtures" / "engine" / "arch_logits.npz")
SEED = 3  # the fixtures' seed
RTOL_F32 = 1e-3  # of max |logit|, F32 weights (the bound)
RTOL_Q8_0 = 1e-5
# F32 weights with quantized experts (gpt-oss's MXFP4): the experts' inputs are rounded to
# q8_0, so a last-bit difference of an F32 matmul that moves one activation across a
# rounding step shows as a whole step in that token's logits
RTOL_F32_QUANT_EXPERTS = 1e-2

Builder = Callable[[Path, GGMLType], None]


def _decoder(arch: str, **kw) -> Builder:
    return lambda path, t: write_tiny_llama(path, t, seed=SEED, arch=arch, **kw)


# architecture -> writer of a tiny random model of it (every registered one needs one)
BUILDERS: dict[str, Builder] = {arch: _decoder(arch) for arch in TINY_ARCHS}
BUILDERS["bert"] = lambda path, t: write_tiny_bert(path, t, seed=SEED)
BUILDERS["qwen35"] = lambda path, t: write_tiny_qwen35(path, t, seed=SEED)  # hybrids
BUILDERS["qwen35moe"] = lambda path, t: write_tiny_qwen35moe(path, t, seed=SEED)
BUILDERS["qwen3next"] = lambda path, t: write_tiny_qwen3next(path, t, seed=SEED)
BUILDERS["lfm2"] = lambda path, t: write_tiny_lfm2(path, t, seed=SEED)
BUILDERS["lfm2moe"] = lambda path, t: write_tiny_lfm2moe(path, t, seed=SEED)
BUILDERS["mamba2"] = lambda path, t: write_tiny_mamba2(path, t, seed=SEED)  # recurrent only
BUILDERS["granitehybrid"] = lambda path, t: write_tiny_granitehybrid(path, t, seed=SEED)
ENCODERS = {"bert"}
TOKENS = FIX["tokens"].tolist()  # 18 tokens: past gemma3's window of 4
PROMPT = FIX["prompt"].tolist()


# variants the shared runner checks beside each architecture's own tiny model: gemma4 files
# laid out as released (local layers of another head size, values from keys; shared KV
# layers, per-layer embeddings, per-layer FFN sizes)
RUNNER_VARIANTS = ("gemma4_31b", "gemma4_e2b")
DECODERS = sorted(set(supported_architectures()) - ENCODERS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("arch")


def tiny(model_dir: Path, arch: str, t: GGMLType = GGMLType.Q8_0, **kw) -> Path:
    if arch in RUNNER_VARIANTS:  # (a case of LLAMA_CPP_CASES)
        arch, opts, _ = LLAMA_CPP_CASES[arch]
        kw = {**opts, **kw}
    name = f"{arch}_{t.name}" + "".join(f"_{k}{v}" for k, v in kw.items())
    path = model_dir / f"{name}.gguf"
    if not path.exists():
        if kw:
            _decoder(arch, **kw)(path, t)
        else:
            BUILDERS[arch](path, t)
    return path


def _params(**kw) -> ContextParams:
    return ContextParams(**{"n_ctx": 64, "n_threads": 2, "kernel_formats": "all", **kw})


def test_every_architecture_has_a_tiny_model() -> None:
    missing = sorted(set(supported_architectures()) - set(BUILDERS))
    assert not missing, f"registered without a tiny model in BUILDERS: {missing}"


# ---------------------------------------------------------------------- shared runner
@pytest.mark.parametrize("arch", [*supported_architectures(), *RUNNER_VARIANTS])
def test_shapes_and_cached_decode(model_dir: Path, arch: str) -> None:
    path = tiny(model_dir, arch)
    if arch in ENCODERS:
        ctx = Context(path, _params(embeddings=True))
        h = ctx.encode(Batch.from_tokens(TOKENS))
        assert h.shape == (len(TOKENS), ctx.model.hparams.n_embd)
        assert np.isfinite(h).all()
        emb = ctx.embed(TOKENS)
        assert emb.shape == (ctx.model.hparams.n_embd,)
        return
    ctx = Context(path, _params())
    hp = ctx.model.hparams
    assert hp.arch == LLAMA_CPP_CASES[arch][0] if arch in RUNNER_VARIANTS else arch
    full = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    assert full.shape == (len(TOKENS), hp.n_vocab) and full.dtype == np.float32
    assert np.isfinite(full).all() and full.std() > 0.01
    last = ctx.decode(Batch.from_tokens([5], pos0=len(TOKENS)))
    assert last.shape == (1, hp.n_vocab)
    ctx.clear()
    k = 5  # a prompt, then one token at a time
    steps = [ctx.decode(Batch.from_tokens(TOKENS[:k], logits="all"))]
    steps += [ctx.decode(Batch.from_tokens([t], pos0=i)) for i, t in enumerate(TOKENS) if i >= k]
    np.testing.assert_array_equal(np.concatenate(steps), full)


@pytest.mark.parametrize("arch", [*supported_architectures(), *RUNNER_VARIANTS])
def test_two_sequences_in_one_batch_equal_each_alone(model_dir: Path, arch: str) -> None:
    path = tiny(model_dir, arch)
    a, b = TOKENS[:9], [7, 80, 90, 100, 11, 12]
    if arch in ENCODERS:
        ctx = Context(path, _params(n_seq_max=2, embeddings=True))
        batch = Batch()
        for i, t in enumerate(a):
            batch.add(t, i, 0)
        for i, t in enumerate(b):
            batch.add(t, i, 1)
        h = ctx.encode(batch)
        for rows, toks in ((h[: len(a)], a), (h[len(a) :], b)):
            single = ctx.encode(Batch.from_tokens(toks))
            np.testing.assert_allclose(rows, single, atol=3e-3)
        return
    ctx = Context(path, _params(n_seq_max=2))
    alone = []
    for toks in (a, b):
        ctx.clear()
        first = ctx.decode(Batch.from_tokens(toks))[0]
        nxt = ctx.decode(Batch.from_tokens([5], pos0=len(toks)))[0]
        alone.append((first, nxt))
    ctx.clear()
    batch = Batch()
    for i in range(max(len(a), len(b))):  # interleaved
        if i < len(a):
            batch.add(a[i], i, 0, i == len(a) - 1)
        if i < len(b):
            batch.add(b[i], i, 1, i == len(b) - 1)
    first = ctx.decode(batch)  # rows in batch order: b's last token comes before a's
    step = ctx.decode(Batch().add(5, len(a), 0, True).add(5, len(b), 1, True))
    np.testing.assert_array_equal(first[1], alone[0][0])
    np.testing.assert_array_equal(first[0], alone[1][0])
    for s in range(2):
        np.testing.assert_array_equal(step[s], alone[s][1])


@pytest.mark.parametrize("arch", [*DECODERS, *RUNNER_VARIANTS])
def test_seq_rm_then_redecode(model_dir: Path, arch: str) -> None:
    ctx = Context(tiny(model_dir, arch), _params())
    full = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    p0 = 7
    if not ctx.seq_rm(0, p0, -1):  # a recurrent state cannot drop its tail (llama.cpp)
        assert any(ctx.model.layer_rec), "only a recurrent memory refuses a tail"
        assert ctx.seq_rm(0, -1, -1)
        p0 = 0
    again = ctx.decode(Batch.from_tokens(TOKENS[p0:], pos0=p0, logits="all"))
    np.testing.assert_array_equal(again, full[p0:])


@pytest.mark.parametrize("arch", [*DECODERS, *RUNNER_VARIANTS])
def test_k_shift_keeps_attention_relative(model_dir: Path, arch: str) -> None:
    """Moving a sequence by +5 re-ropes its keys (each layer's rope, phi3's factors): what
    comes next is unchanged up to rounding (F32 cache: the shift keeps full precision, but
    attention reads the keys rounded to f16 as llama.cpp's does, so the two orders of
    rounding differ by up to a few percent of the largest logit). (As llama.cpp, a K-shift applies
    the rope attention factor again; the phi3 model here has none, to test the factors, and
    gpt-oss's ropes linearly here: YaRN's magnitude scale would be applied twice too.)"""
    own = {"phi3": {"attn_factor": 1.0}, "gpt-oss": {"rope": "linear"}}.get(arch, {})
    path = tiny(model_dir, arch, **own)
    ctx = Context(path, _params(type_k="f32", type_v="f32"))
    fresh = ctx.decode(Batch.from_tokens(TOKENS[:9]))[0]
    ctx.clear()
    ctx.decode(Batch.from_tokens(TOKENS[:8]))
    ctx.seq_add(0, 0, -1, 5)
    shifted = ctx.decode(Batch.from_tokens([TOKENS[8]], pos0=13))[0]
    np.testing.assert_allclose(shifted, fresh, rtol=0, atol=5e-2 * np.abs(fresh).max())


# ---------------------------------------------------------------------- vs llama.cpp
# case -> (arch, tiny-model options, n_ctx); see scripts/make_arch_fixtures.py
CASES = LLAMA_CPP_CASES
# 26 random F32 layers with routed experts: on the third greedy step our top logit is 0.09
# above llama.cpp's pick (not traced; presumably an expert choice moved by F32 rounding, as
# its teacher-forced logits agree within the bound); the Q8_0 file's continuation is
# identical, its logits bit for bit
F32_NO_GREEDY = {"deepseek2_lite"}
# gemma4 files as released: F32 rows within 6e-4 of max|logit| but for one token each (31B's
# layout: 1.2e-3; E2B's, 6 layers with per-layer embeddings: 3.5e-3), presumably an input
# of the f16-table GELU moved across an f16 rounding step by the F32 matmuls' other order of
# sums (not traced); the Q8_0 files agree bit for bit, the top tokens and greedy
# continuations are identical
RTOL_F32_CASE = {"gemma4_31b": 2e-3, "gemma4_e2b": 5e-3}


@pytest.mark.parametrize("t", [GGMLType.F32, GGMLType.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_llama_cpp(model_dir: Path, case: str, t: GGMLType) -> None:
    arch, opts, n_ctx = CASES[case]
    if arch not in supported_architectures():
        pytest.fail(f"{arch!r} is not registered")
    path = tiny(model_dir, arch, t, **opts)
    key = f"{case}.{t.name}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(FIX[f"{key}.sha256"])
    ctx = Context(path, _params(n_ctx=n_ctx))
    if opts.get("sliding_window"):  # llama.cpp ignores the key for llama files
        assert ctx.model.n_swa == (0 if arch == "llama" else opts["sliding_window"])
    got = ctx.decode(Batch.from_tokens(TOKENS, logits="all"))
    want = FIX[f"{key}.logits"]
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max()) / scale
    rtol = RTOL_F32_CASE.get(case, RTOL_F32) if t == GGMLType.F32 else RTOL_Q8_0
    if t == GGMLType.F32 and opts.get("experts_type", -1) >= 0:
        rtol = RTOL_F32_QUANT_EXPERTS
    assert err <= rtol, f"{key}: {err:.2e}"
    # the same top token wherever llama.cpp's top two are told apart by more than the bound
    top2 = np.sort(want, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 2 * RTOL_F32 * scale
    assert clear.sum() >= len(TOKENS) - 2
    np.testing.assert_array_equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
    if t == GGMLType.F32 and case in F32_NO_GREEDY:
        return
    # greedy continuation
    ctx.clear()
    lg = ctx.decode(Batch.from_tokens(PROMPT))[0]
    out = []
    for i in range(len(FIX[f"{key}.greedy"])):
        out.append(int(lg.argmax()))
        lg = ctx.decode(Batch.from_tokens([out[-1]], pos0=len(PROMPT) + i))[0]
    assert out == FIX[f"{key}.greedy"].tolist()


# ---------------------------------------------------------------------- errors
def test_unknown_architecture_lists_the_supported_ones(tmp_path: Path) -> None:
    path = tmp_path / "made_up.gguf"
    w = GGUFWriter(path)
    w.add("general.architecture", "made-up-arch")
    w.add("made-up-arch.block_count", 1, GGUFValueType.UINT32)
    w.add_tensor("token_embd.weight", GGMLType.F32, (16, 4), np.zeros(64, np.float32))
    w.write()
    with pytest.raises(ModelError, match="made-up-arch") as e:
        load_model(path)
    for arch in supported_architectures():
        assert arch in str(e.value)
    with pytest.raises(ModelError, match="supported: "):
        Context(path, _params())


def test_fused_tensor_split_is_checked(model_dir: Path) -> None:
    """Splitting a fused tensor into row ranges that do not add up is a clear error; the
    ranges that do give matrices of those rows."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    path = tiny(model_dir, "phi3", GGMLType.F32)
    mf = model_file(path)
    try:
        shapes = {t.name: t.shape for t in mf.tensors}
        with pytest.raises(ModelError, match="attn_qkv"):
            check_model(mf.metadata, {**shapes, "blk.0.attn_qkv.weight": (256, 484)})
        with pytest.raises(ModelError, match="ffn_up.weight' is missing"):
            check_model(mf.metadata, {k: v for k, v in shapes.items() if "ffn_up" not in k})
        b = load_model(path).blk[0]
        q, k, v = b.attn_q, b.attn_k, b.attn_v
        assert (q.nrows, k.nrows, v.nrows) == (256, 128, 128) and q.ncols == 256
        raw = mf.tensor("blk.0.attn_qkv.weight").raw.view(np.float32).reshape(512, 256)
        store = load_model(path).store
        for m, r0 in ((q, 0), (k, 256), (v, 384)):
            info = store.matrices[m.index][1]
            np.testing.assert_array_equal(
                info.raw.view(np.float32).reshape(m.nrows, 256), raw[r0 : r0 + m.nrows]
            )
    finally:
        mf.close()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"blk.1.attn_sinks.weight": None}, "'blk.1.attn_sinks.weight' is missing"),
        ({"blk.0.ffn_up_exps.bias": None}, "'blk.0.ffn_up_exps.bias' is missing"),
        ({"blk.0.post_attention_norm.weight": None}, "post_attention_norm.weight' is missing"),
        ({"blk.0.attn_sinks.weight": (8,)}, "'blk.0.attn_sinks.weight' has shape"),
        ({"blk.1.ffn_down_exps.bias": (256, 3)}, "'blk.1.ffn_down_exps.bias' has shape"),
        ({"blk.0.ffn_gate_inp.bias": (5,)}, "'blk.0.ffn_gate_inp.bias' has shape"),
    ],
)
def test_gpt_oss_missing_or_misshapen_tensor_is_named(model_dir: Path, edit, match) -> None:
    """A gpt-oss file without one of its own tensors (sinks, expert biases, the
    post-attention norm), or with one of the wrong shape, is refused naming the tensor."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    mf = model_file(tiny(model_dir, "gpt-oss", GGMLType.F32))
    try:
        shapes = {t.name: t.shape for t in mf.tensors} | edit
        shapes = {k: v for k, v in shapes.items() if v is not None}
        check_model(mf.metadata, {t.name: t.shape for t in mf.tensors})  # the file as is
        with pytest.raises(ModelError, match=match):
            check_model(mf.metadata, shapes)
    finally:
        mf.close()


@pytest.mark.parametrize(
    ("arch", "edit", "match"),
    [
        ("olmo2", {"blk.1.attn_q_norm.weight": (64,)}, "'blk.1.attn_q_norm.weight' has shape"),
        ("olmo2", {"blk.0.attn_k_norm.weight": (256,)}, "'blk.0.attn_k_norm.weight' has shape"),
        ("olmo2", {"blk.0.post_ffw_norm.weight": None}, "'blk.0.post_ffw_norm.weight' is missing"),
        ("gemma2", {"blk.1.post_attention_norm.weight": None}, "post_attention_norm.weight' is"),
        ("gemma2", {"blk.0.attn_q_norm.weight": (64,)}, "'blk.0.attn_q_norm.weight': this"),
    ],
)
def test_dense_missing_or_misshapen_tensor_is_named(model_dir: Path, arch, edit, match) -> None:
    """An olmo2 / gemma2 file without one of its norms, with a norm of the wrong size
    (olmo2's Q/K norms span the whole projections, not a head), or with a tensor of
    another variant, is refused naming the tensor."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    mf = model_file(tiny(model_dir, arch, GGMLType.F32))
    try:
        shapes = {t.name: t.shape for t in mf.tensors}
        check_model(mf.metadata, shapes)  # the file as is
        edited = {k: v for k, v in (shapes | edit).items() if v is not None}
        with pytest.raises(ModelError, match=match):
            check_model(mf.metadata, edited)
    finally:
        mf.close()


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("gemma2.attn_logit_softcapping", -1.0, "'gemma2.attn_logit_softcapping' has invalid"),
        ("gemma2.final_logit_softcapping", "x", "'gemma2.final_logit_softcapping' must be a"),
        ("gemma2.attention.sliding_window", 0, "'gemma2.attention.sliding_window' has invalid"),
    ],
)
def test_gemma2_bad_key_is_named(model_dir: Path, key, value, match) -> None:
    """gemma2's own keys are checked: the soft-caps are numbers >= 0, the window >= 1."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    mf = model_file(tiny(model_dir, "gemma2", GGMLType.F32))
    try:
        shapes = {t.name: t.shape for t in mf.tensors}
        with pytest.raises(ModelError, match=match):
            check_model({**mf.metadata, key: value}, shapes)
    finally:
        mf.close()


def test_gemma2_defaults_follow_llama_cpp(model_dir: Path) -> None:
    """Without its keys a gemma2 file gets llama.cpp's defaults: a window of 4096 with even
    layers local, attention scores capped at 50 and logits at 30; the local layers' rope
    base is the file's ``rope.freq_base_swa``, the global ones' the context's."""
    mf_path = tiny(model_dir, "gemma2", GGMLType.F32)
    m = load_model(mf_path)
    assert (m.attn_logit_softcap(), m.logit_softcap()) == (1.0, 3.0)  # the tiny file's
    assert m.layer_swa == (True, False) and m.n_swa == 4
    assert (m.rope_swa.freq_base, m.rope.freq_base) == (1000.0, 10000.0)
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    mf = model_file(mf_path)
    try:
        md = {k: v for k, v in mf.metadata.items() if "softcapping" not in k}
        md = {k: v for k, v in md.items() if not k.endswith(".sliding_window")}
        hp = check_model(md, {t.name: t.shape for t in mf.tensors})
    finally:
        mf.close()
    assert hp.n_swa == 4096
    assert hp.extra["attn_logit_softcapping"] == 50.0
    assert hp.extra["final_logit_softcapping"] == 30.0


# ---------------------------------------------------------------------- deepseek2
@pytest.mark.parametrize(("n_ubatch", "n_threads"), [(1, 1), (3, 2), (8, 1), (64, 2), (512, 2)])
def test_deepseek2_q8_0_any_ubatch_and_threads(model_dir: Path, n_ubatch, n_threads) -> None:
    """The latent attention and grouped experts of the Q8_0 tiny deepseek2 give llama.cpp's
    logits bit for bit whatever the ubatch size (rows, tiled attention; single-token decode
    steps) and thread count."""
    path = tiny(model_dir, "deepseek2", GGMLType.Q8_0)
    p = _params(n_ubatch=n_ubatch, n_batch=64, n_threads=n_threads, n_threads_batch=n_threads)
    got = Context(path, p).decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_array_equal(got, FIX["deepseek2.Q8_0.logits"])


@pytest.mark.parametrize(("n_ubatch", "n_threads"), [(80, 2), (80, 1), (7, 2)])
def test_deepseek2_q8_0_long_prompt(model_dir: Path, n_ubatch, n_threads) -> None:
    """80 tokens in one ubatch (tiled attention) or in ubatches of 7 (rows): llama.cpp's
    logits at the same ubatch size, bit for bit, with 1 or 2 threads."""
    path = tiny(model_dir, "deepseek2", GGMLType.Q8_0)
    tokens = np.random.default_rng(7).integers(3, 259, 80).tolist()  # as the fixture's
    p = _params(n_ctx=256, n_batch=128, n_ubatch=n_ubatch, n_threads=n_threads,
                n_threads_batch=n_threads)  # fmt: skip
    got = Context(path, p).decode(Batch.from_tokens(tokens, logits="all"))
    np.testing.assert_array_equal(got, FIX[f"deepseek2.Q8_0.long{n_ubatch}"])


def test_deepseek2_cache_holds_latent_rows_only(model_dir: Path) -> None:
    """The cache of a latent-attention layer is one row of kv_lora_rank + rope dims per
    token (f16: 2 bytes each), no V rows (the values are read from the same rows)."""
    ctx = Context(tiny(model_dir, "deepseek2", GGMLType.Q8_0), _params(n_ctx=64))
    hp = ctx.model.hparams
    r = hp.extra["n_lora_kv"]
    assert hp.n_embd_head_k == r + hp.n_rot and hp.n_head_kv == 1
    assert ctx.kv.nbytes == hp.n_layer * 64 * (r + hp.n_rot) * 2
    with pytest.raises(UsageError, match="q8_0"):
        Context(tiny(model_dir, "deepseek2", GGMLType.Q8_0), _params(type_k="q8_0"))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"deepseek2.attention.key_length_mla": None}, "older attn_kv_b form"),
        ({"deepseek2.attention.head_count_kv": 4}, "one KV head"),
        ({"deepseek2.expert_group_count": 3}, "expert_group_count"),
        ({"deepseek2.expert_group_used_count": 4}, "expert_group_used_count"),
        ({"deepseek2.expert_gating_func": 3}, "expert_gating_func is 3"),
        ({"deepseek2.attention.temperature_scale": 0.5}, "temperature_scale"),
        ({"deepseek2.attention.key_length": 100}, "key_length"),
        ({"deepseek2.expert_weights_norm": 2}, "expert_weights_norm' must be a bool"),
        ({"deepseek2.leading_dense_block_count": 9}, "leading_dense_block_count"),
    ],
)
def test_deepseek2_bad_key_is_named(model_dir: Path, edit, match) -> None:
    """deepseek2's keys are checked before any weight is read, naming the key."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    mf = model_file(tiny(model_dir, "deepseek2", GGMLType.F32))
    try:
        shapes = {t.name: t.shape for t in mf.tensors}
        check_model(mf.metadata, shapes)  # the file as is
        md = {k: v for k, v in (dict(mf.metadata) | edit).items() if v is not None}
        with pytest.raises(ModelError, match=match):
            check_model(md, shapes)
    finally:
        mf.close()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ({"blk.1.attn_kv_b.weight": (96, 256)}, "'blk.1.attn_kv_b.weight': this"),
        ({"blk.0.attn_q_b.weight": None}, "'blk.0.attn_q_b.weight' is missing"),
        ({"blk.2.attn_k_b.weight": (32, 96, 2)}, "'blk.2.attn_k_b.weight' has shape"),
        ({"blk.0.ffn_gate.weight": None}, "'blk.0.ffn_gate.weight' is missing"),
        ({"blk.1.ffn_up_shexp.weight": None}, "'blk.1.ffn_up_shexp.weight' is missing"),
        ({"blk.2.ffn_down_shexp.weight": (64, 256)}, "'blk.2.ffn_down_shexp.weight' has"),
        ({"blk.1.ffn_gate_inp.weight": None}, "'blk.1.ffn_gate_inp.weight' is missing"),
    ],
)
def test_deepseek2_missing_or_misshapen_tensor_is_named(model_dir: Path, edit, match) -> None:
    """A deepseek2 file with the older ``attn_kv_b``, without a tensor its layers need (q's
    low rank, the leading layer's dense FFN, the experts' router or shared experts), or
    with one of the wrong shape, is refused naming the tensor."""
    _refused_with_tensors(tiny(model_dir, "deepseek2", GGMLType.F32), edit, match)


def _refused_with_tensors(path: Path, edit: dict, match: str) -> None:
    """``check_model`` refuses the file at ``path`` with its tensor shapes changed by ``edit``
    (``None``: the tensor removed), with a :class:`ModelError` matching ``match``."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    mf = model_file(path)
    try:
        shapes = {t.name: t.shape for t in mf.tensors}
        edited = {k: v for k, v in (shapes | edit).items() if v is not None}
        with pytest.raises(ModelError, match=match):
            check_model(mf.metadata, edited)
    finally:
        mf.close()


def test_deepseek2_defaults_follow_llama_cpp(model_dir: Path) -> None:
    """Without its router keys a deepseek2 file routes as V2's did in llama.cpp: softmax
    (``expert_gating_func`` absent), weights not normalized nor scaled, no groups; the K.Q
    scale is ``1 / sqrt(key_length_mla)`` without YaRN."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    mf = model_file(tiny(model_dir, "deepseek2", GGMLType.F32))
    try:
        drop = ("expert_gating_func", "expert_weights_norm", "expert_weights_scale", "group")
        md = {k: v for k, v in mf.metadata.items() if not any(d in k for d in drop)}
        shapes = {t.name: t.shape for t in mf.tensors if "exp_probs_b" not in t.name}
        x = check_model(md, shapes).extra
    finally:
        mf.close()
    assert x["expert_gating_func"] == 1 and not x["expert_weights_norm"]
    assert (x["expert_weights_scale"], x["n_expert_groups"]) == (0.0, 0)
    m = load_model(tiny(model_dir, "deepseek2", GGMLType.F32))
    assert m.attention_scales()[0] == float(np.float32(1.0) / np.sqrt(np.float32(64)))


# ---------------------------------------------------------------------- gemma4
@pytest.mark.parametrize(
    "case", ["gemma4", "gemma4_moe", "gemma4_moe_fused", "gemma4_31b", "gemma4_e2b"]
)
@pytest.mark.parametrize(("n_ubatch", "n_threads"), [(512, 2), (7, 1), (3, 2), (1, 1)])
def test_gemma4_q8_0_any_ubatch_and_threads(model_dir: Path, case, n_ubatch, n_threads) -> None:
    """The Q8_0 tiny gemma4 (dense; a dense FFN beside experts; 31B's and E2B's layouts)
    gives llama.cpp's logits bit for bit whatever the ubatch size (rows of 18, 7, 3 tokens;
    single-token steps) and thread count."""
    arch, opts, n_ctx = CASES[case]
    path = tiny(model_dir, arch, GGMLType.Q8_0, **opts)
    p = _params(n_ctx=n_ctx, n_ubatch=n_ubatch, n_batch=64, n_threads=n_threads,
                n_threads_batch=n_threads)  # fmt: skip
    got = Context(path, p).decode(Batch.from_tokens(TOKENS, logits="all"))
    np.testing.assert_array_equal(got, FIX[f"{case}.Q8_0.logits"])


@pytest.mark.parametrize("case", ["gemma4_31b", "gemma4_e2b"])
@pytest.mark.parametrize(("n_ubatch", "n_threads"), [(80, 2), (80, 1), (7, 2)])
def test_gemma4_q8_0_long_prompt(model_dir: Path, case, n_ubatch, n_threads) -> None:
    """31B's and E2B's layouts over 80 tokens in one ubatch (tiled attention in both cache
    parts, each of its head size) or in ubatches of 7: llama.cpp's logits at the same ubatch
    size, bit for bit, with 1 or 2 threads."""
    arch, opts, _ = CASES[case]
    path = tiny(model_dir, arch, GGMLType.Q8_0, **opts)
    tokens = np.random.default_rng(7).integers(3, 259, 80).tolist()  # as the fixture's
    p = _params(n_ctx=256, n_batch=128, n_ubatch=n_ubatch, n_threads=n_threads,
                n_threads_batch=n_threads)  # fmt: skip
    got = Context(path, p).decode(Batch.from_tokens(tokens, logits="all"))
    np.testing.assert_array_equal(got, FIX[f"{case}.Q8_0.long{n_ubatch}"])


def test_gemma4_layers_follow_the_file(model_dir: Path) -> None:
    """The tiny file's pattern (local, local, global), window 4, the local layers' rope base
    without frequency factors, the global layer's with them; no scales of the scores or the
    queries; the layers' output scales read."""
    m = load_model(tiny(model_dir, "gemma4", GGMLType.F32))
    assert m.layer_swa == (True, True, False) and m.n_swa == 4
    assert (m.rope_swa.freq_base, m.rope_swa.factors) == (1000.0, False)
    assert (m.rope.freq_base, m.rope.factors) == (10000.0, True)
    assert m.attention_scales() == (1.0, 1.0) and m.logit_softcap() == 3.0
    assert all(b.layer_output_scale is not None for b in m.blk)
    assert m.freqs_arr.shape == (32,) and m.freqs_arr[-1] == np.float32(1e30)


def test_gemma4_layouts_as_released_follow_the_file(model_dir: Path) -> None:
    """31B's layout: each layer's row of the model table has its kind's head size, rope
    dimensions and KV heads; the global layer reads its values from its keys; each cache
    part has its kind's heads and head size. E2B's: the last 3 layers attend the KV of
    layers 1 (local) and 2 (global) and have no cache rows; FFN sizes per layer."""
    ctx = Context(tiny(model_dir, "gemma4_31b", GGMLType.F32), _params())
    m = ctx.model
    assert m.model_row["head_dim"].tolist() == [32, 32, 64]
    assert m.model_row["n_rot"].tolist() == [32, 32, 64]
    assert m.model_row["n_head_kv"].tolist() == [2, 2, 1]
    assert m.blk[2].attn_v is None and m.blk[1].attn_v is not None
    assert m.kv_geometry == ((1, 64), (2, 32)) and m.rope_swa.n_rot == 32
    assert ctx.kv.base.k.shape[:2] == (1, 1) and ctx.kv.swa.k.shape[:2] == (2, 2)
    assert (ctx.kv.base.head_dim, ctx.kv.swa.head_dim) == (64, 32)
    ctx = Context(tiny(model_dir, "gemma4_e2b", GGMLType.F32), _params())
    m, lt = ctx.model, ctx.model.layer_table
    assert m.kv_layers == (0, 1, 2) and m.kv_layer_swa == (True, True, False)
    assert lt["kv_shared"].tolist() == [0, 0, 0, 1, 1, 1]
    assert lt["kv_index"].tolist() == [0, 1, 0, 1, 1, 0]  # (3, 4 -> layer 1; 5 -> layer 2)
    assert m.model_row["n_ff"].tolist() == [512] * 3 + [1024] * 3
    assert m.model_row["n_embd_pl"].tolist() == [32] * 6 and m.blk[5].inp_gate is not None
    assert ctx.kv.base.k.shape[0] == 1 and ctx.kv.swa.k.shape[0] == 2
    assert len(m.rope_layers) == 3


@pytest.mark.parametrize(
    ("case", "key", "value", "match"),
    [
        ("gemma4", "gemma4.attention.key_length_swa", 32, "key_length_swa"),  # != value's
        ("gemma4", "gemma4.rope.dimension_count_swa", 66, "dimension_count_swa"),
        ("gemma4", "gemma4.attention.shared_kv_layers", 2, "shared_kv_layers"),  # < 2 left
        ("gemma4", "gemma4.attention.shared_kv_layers", 1, "not of its kind"),
        ("gemma4", "gemma4.embedding_length_per_layer_input", 16, "per_layer_token_embd"),
        ("gemma4", "gemma4.embedding_length_per_layer_input", 24, "multiple of 16"),
        ("gemma4", "gemma4.attention.head_count_kv", [2, 2, 0], "head_count_kv"),
        ("gemma4", "gemma4.attention.head_count_kv", [2, 1, 1], "head_count_kv"),
        ("gemma4", "gemma4.feed_forward_length", [512, 1024], "feed_forward_length"),
        ("gemma4_e2b", "gemma4.embedding_length_per_layer_input", 16, "per_layer_token_embd"),
        ("gemma4", "gemma4.attention.sliding_window_pattern", 2, "sliding_window_pattern"),
        ("gemma4", "gemma4.attention.sliding_window_pattern", [True], "lists 1 layers"),
        ("gemma4", "gemma4.attention.sliding_window", None, "sliding_window' is missing"),
        ("gemma4_moe", "gemma4.expert_used_count", 5, "expert_used_count"),
        ("gemma4_moe", "gemma4.expert_feed_forward_length", 40, "expert_feed_forward_length"),
    ],
)
def test_gemma4_unsupported_or_bad_key_is_named(model_dir: Path, case, key, value, match) -> None:
    """Inconsistent keys are refused naming the key (or the tensor they need): local head
    sizes of keys and values apart, more rope dimensions than the head, shared KV layers
    leaving fewer than 2 layers with KV or reading a layer of the other kind, per-layer
    embeddings without their tensors or of a size the kernels do not take, a kind of layers
    with several (or no) KV heads, a per-layer FFN size list of the wrong length."""
    from llamacpy.models import check_model
    from llamacpy.models.weights import model_file

    arch, opts, _ = CASES[case]
    mf = model_file(tiny(model_dir, arch, GGMLType.F32, **opts))
    try:
        shapes = {t.name: t.shape for t in mf.tensors}
        check_model(mf.metadata, shapes)  # the file as is
        md = {k: v for k, v in {**mf.metadata, key: value}.items() if v is not None}
        with pytest.raises(ModelError, match=match):
            check_model(md, shapes)
    finally:
        mf.close()


@pytest.mark.parametrize(
    ("case", "edit", "match"),
    [
        ("gemma4", {"rope_freqs.weight": None}, "'rope_freqs.weight' is missing"),
        ("gemma4", {"blk.0.attn_k.weight": None}, "'blk.0.attn_k.weight' is missing"),
        ("gemma4", {"blk.1.attn_v.weight": (256, 96)}, "'blk.1.attn_v.weight' has"),
        ("gemma4_31b", {"blk.0.attn_q.weight": (256, 256)}, "'blk.0.attn_q.weight' has"),
        ("gemma4_31b", {"blk.2.attn_k.weight": (256, 128)}, "'blk.2.attn_k.weight' has"),
        ("gemma4_e2b", {"blk.2.attn_k_norm.weight": None}, "'blk.2.attn_k_norm.weight' is"),
        ("gemma4_e2b", {"blk.4.ffn_up.weight": (256, 512)}, "'blk.4.ffn_up.weight' has"),
        ("gemma4_e2b", {"per_layer_proj_norm.weight": None}, "per_layer_proj_norm"),
        ("gemma4_e2b", {"blk.5.proj.weight": (16, 256)}, "'blk.5.proj.weight' has"),
        ("gemma4", {"blk.2.layer_output_scale.weight": (2,)}, "layer_output_scale.weight' has"),
        ("gemma4", {"per_layer_token_embd.weight": (256, 259)}, "per_layer_token_embd"),
        ("gemma4_moe", {"blk.1.pre_ffw_norm_2.weight": None}, "'blk.1.pre_ffw_norm_2.weight' is"),
        ("gemma4_moe", {"blk.0.ffn_gate_inp.scale": None}, "'blk.0.ffn_gate_inp.scale' is"),
        ("gemma4_moe", {"blk.0.ffn_down_exps.scale": (3,)}, "'blk.0.ffn_down_exps.scale' has"),
        ("gemma4_moe_fused", {"blk.1.ffn_gate_up_exps.weight": (256, 96, 4)}, "gate_up_exps"),
        ("gemma4_moe_fused", {"blk.0.ffn_down_exps.weight": None}, "down_exps.weight' is"),
    ],
)
def test_gemma4_missing_or_misshapen_tensor_is_named(model_dir: Path, case, edit, match) -> None:
    """A gemma4 file without the global layers' rope factors, the keys of a layer with KV of
    its own, a per-layer embedding tensor or a tensor of its layers of experts, or with a
    tensor of the wrong shape for its layer (local and global head sizes and KV heads,
    per-layer FFN sizes; the fused gate|up of the experts too) is refused naming the
    tensor."""
    arch, opts, _ = CASES[case]
    _refused_with_tensors(tiny(model_dir, arch, GGMLType.F32, **opts), edit, match)
