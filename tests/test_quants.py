"""llamacpy.quants: registry, dequantization (numba == numpy twin == gguf-py) and the legacy
quantizers byte for byte against gguf-py (llama.cpp's own Python reference)."""

from __future__ import annotations

from pathlib import Path

import gguf
import gguf.quants as gq
import numpy as np
import pytest

import llamacpy.quants as Q
from llamacpy.errors import LlamacpyError
from llamacpy.gguf.constants import GGML_BLOCK_SIZES, GGMLType

pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning"
)

ALL = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS", "MXFP4",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0",
    "NVFP4", "Q1_0", "Q2_0",
]  # fmt: skip
# every format quantizes (IQ2_XXS, IQ2_XS and IQ1_S only with an importance matrix)
DEQUANT_ONLY: set[str] = set()
# llama.cpp aborts on some non-finite or huge input in these: our quantizers raise QuantError
ABORTING = {"IQ3_XXS", "IQ3_S"}
QUANT = [t for t in ALL if t not in DEQUANT_ONLY]
# ggml_quantize_requires_imatrix: ggml asserts on quantizing these without one
NEEDS_IMATRIX = {"IQ2_XXS", "IQ2_XS", "IQ1_S"}
# quantizers that abort (ggml) / raise QuantError (here) on a NaN in a row
ABORTS_ON_NAN = {"IQ2_XS", "IQ2_S"}
GRID_QUANT = ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
# gguf-py has no Q8_1/Q8_K/Q1_0/Q2_0 dequantizer
GGUF_DEQUANT = [t for t in ALL if t not in ("Q8_1", "Q8_K", "Q1_0", "Q2_0")]
GGUF_QUANT = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16", "MXFP4"]  # all gguf-py quantizes
VEC_DOT = {
    "F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q5_0": "Q8_0",
    "Q5_1": "Q8_1", "Q8_0": "Q8_0", "Q8_1": "Q8_1", "Q2_K": "Q8_K", "Q3_K": "Q8_K",
    "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K", "Q8_K": None, "IQ4_NL": "Q8_0",
    "IQ4_XS": "Q8_K", "MXFP4": "Q8_0", **dict.fromkeys(ALL[ALL.index("IQ2_XXS") :], "Q8_K"),
    "NVFP4": "Q8_0", "Q1_0": "Q8_0", "Q2_0": "Q8_0",
}  # fmt: skip


def assert_same_bits(a: np.ndarray, b: np.ndarray) -> None:
    """Equal float32 arrays bit for bit (-0.0 != 0.0), any NaN matching any NaN."""
    a = np.asarray(a, dtype=np.float32).reshape(-1)
    b = np.asarray(b, dtype=np.float32).reshape(-1)
    assert a.shape == b.shape
    same = (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))
    assert same.all(), f"{(~same).sum()} of {a.size} differ, first at {np.argmin(same)}"


def gguf_type(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name]


def random_blocks(name: str, n_blocks: int, seed: int, sane: bool = True) -> np.ndarray:
    """Random bytes for ``n_blocks`` blocks; with ``sane`` the float fields (scales) are
    finite values of moderate size, so dequantized results are finite."""
    fmt = Q.get(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, n_blocks * fmt.type_size, dtype=np.uint8)
    if not sane:
        return raw
    dt = fmt.block_dtype
    blocks = raw.view(dt)
    if name == "BF16":
        f = rng.uniform(-4, 4, n_blocks).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    if name == "MXFP4":  # E8M0 exponents: 2**-28 .. 2**27
        blocks["e"] = rng.integers(100, 156, n_blocks)
        return raw
    if name == "IQ1_M":  # the f16 d in the scale words' top nibbles: 2**-3 .. 2**1
        blocks["sc"][:, 3] = (blocks["sc"][:, 3] & 0x0FFF) | rng.choice([0x3000, 0x4000], n_blocks)
    if dt.fields is None:  # F32 / F16: the data themselves are floats
        return rng.uniform(-4, 4, n_blocks).astype(dt).view(np.uint8)
    for field, (fdt, _) in dt.fields.items():
        if fdt.kind == "f":
            blocks[field] = rng.uniform(-2, 2, blocks[field].shape).astype(fdt)
    return raw


# ----------------------------------------------------------------------------- registry


def test_registry_has_every_format_with_consistent_layout():
    assert sorted(f.name for f in Q.formats().values()) == sorted(ALL)
    for name in ALL:
        fmt = Q.get(name)
        assert fmt is Q.get(GGMLType[name]) is Q.get(int(GGMLType[name])) is Q.get(name.lower())
        assert (fmt.block_size, fmt.type_size) == GGML_BLOCK_SIZES[GGMLType[name]]
        assert fmt.block_dtype.itemsize == fmt.type_size
        expected = VEC_DOT[name]
        assert fmt.vec_dot_type == (GGMLType[expected] if expected else None)
        assert callable(fmt.dequantize) and callable(fmt.dequantize_numpy)
        if name in DEQUANT_ONLY:
            assert fmt.quantize is None and fmt.quantize_numpy is None
            with pytest.raises(Q.UnsupportedQuantTypeError, match=f"{name}.*for quantization"):
                Q.quantize(np.zeros(256, np.float32), name)
        else:
            assert callable(fmt.quantize) and callable(fmt.quantize_numpy)


def test_unsupported_type_error_names_type_and_tensor():
    with pytest.raises(Q.UnsupportedQuantTypeError, match=r"I8.*'blk\.0\.ffn_up\.weight'"):
        Q.get(GGMLType.I8, tensor="blk.0.ffn_up.weight")
    with pytest.raises(LlamacpyError, match="unknown ggml type 99"):
        Q.get(99)
    with pytest.raises(Q.UnsupportedQuantTypeError, match="F64"):
        Q.dequantize(b"\0" * 64, GGMLType.F64)
    with pytest.raises(Q.UnsupportedQuantTypeError, match="I32"):
        Q.quantize(np.zeros(64, np.float32), "I32")


def test_unsupported_type_of_a_tensor_info_names_the_tensor():
    class FakeInfo:
        name = "blk.3.attn_k.weight"
        type = GGMLType.I16
        np_shape = (2, 256)
        raw = np.zeros(2 * 512, np.uint8)

    with pytest.raises(Q.UnsupportedQuantTypeError, match=r"I16.*blk\.3\.attn_k\.weight"):
        Q.dequantize(FakeInfo())


def test_bad_lengths_and_imatrix_raise_quant_error():
    with pytest.raises(Q.QuantError, match="multiple of the block size 32"):
        Q.quantize(np.zeros((2, 48), np.float32), "Q4_0")
    with pytest.raises(Q.QuantError, match="imatrix"):
        Q.quantize(np.zeros((2, 256), np.float32), "Q4_K", imatrix=np.ones(128, np.float32))
    with pytest.raises(Q.QuantError, match="need 36 bytes"):
        Q.get("Q4_0").dequantize(np.zeros(20, np.uint8), 64)
    with pytest.raises(Q.QuantError, match="not a multiple"):
        Q.get("Q4_K").dequantize(np.zeros(144, np.uint8), 100)


@pytest.mark.parametrize("name", [t for t in ALL if GGML_BLOCK_SIZES[GGMLType[t]][0] > 1])
def test_bytes_short_of_the_block_count_raise_quant_error(name):
    fmt = Q.get(name)
    n, need = 3 * fmt.block_size, 3 * fmt.type_size
    short = np.zeros(need - 1, np.uint8)
    msg = rf"{name}: {n} elements need {need} bytes, got {need - 1}"
    for dequantize in (fmt.dequantize, fmt.dequantize_numpy):
        with pytest.raises(Q.QuantError, match=msg):
            dequantize(short, n)
    with pytest.raises(Q.QuantError, match=msg):
        Q.dequantize(short, name, (3, fmt.block_size))


def test_convenience_functions_shapes_and_inputs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 2, 512)).astype(np.float32)
    q = Q.quantize(x, "Q4_K")
    assert q.dtype == np.uint8 and q.shape == (3, 2, 2 * 144)
    y = Q.dequantize(q, "Q4_K", x.shape)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert_same_bits(y, Q.dequantize(q.tobytes(), GGMLType.Q4_K).reshape(x.shape))
    assert_same_bits(y, Q.dequantize(memoryview(q.tobytes()), 12, x.shape))
    assert Q.dequantize(q, "Q4_K").shape == (x.size,)
    # float64 input and non-contiguous input give the same bytes
    assert np.array_equal(Q.quantize(x.astype(np.float64), "Q4_K"), q)
    xt = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)
    assert np.array_equal(Q.quantize(xt, "Q4_K"), q)


# ----------------------------------------------------------------------------- dequantize


@pytest.mark.parametrize("name", ALL)
def test_dequantize_random_blocks_numba_equals_numpy_twin(name):
    fmt = Q.get(name)
    for seed, sane in [(1, True), (2, True), (3, False)]:
        raw = random_blocks(name, 97, seed, sane)
        n = 97 * fmt.block_size
        y = fmt.dequantize(raw, n)
        assert y.dtype == np.float32 and y.shape == (n,)
        if sane:
            assert np.isfinite(y).all()
        assert_same_bits(y, fmt.dequantize_numpy(raw, n))


@pytest.mark.parametrize("name", GGUF_DEQUANT)
def test_dequantize_random_blocks_equals_gguf_py(name):
    fmt = Q.get(name)
    for seed, sane in [(4, True), (5, False)]:
        raw = random_blocks(name, 64, seed, sane).reshape(8, -1)
        with np.errstate(all="ignore"):
            expected = gq.dequantize(raw, gguf_type(name))
        assert_same_bits(fmt.dequantize(raw, 64 * fmt.block_size), expected)


def test_dequantize_accepts_extra_bytes_and_readonly_buffers():
    raw = random_blocks("Q6_K", 4, 7)
    fmt = Q.get("Q6_K")
    full = fmt.dequantize(raw, 4 * 256)
    ro = np.frombuffer(raw.tobytes(), np.uint8)
    assert not ro.flags.writeable
    assert_same_bits(fmt.dequantize(ro, 2 * 256), full[:512])


@pytest.mark.parametrize("name", ALL)
def test_dequantize_into_out_equals_new_array(name):
    fmt = Q.get(name)
    raw = random_blocks(name, 37, 8, sane=False)
    n = 37 * fmt.block_size
    out = np.full((1, n), 7.0, np.float32)
    assert fmt.dequantize(raw, n, out) is out
    assert_same_bits(out, fmt.dequantize(raw, n))
    shaped = np.empty((n // fmt.block_size, fmt.block_size), np.float32)
    assert Q.dequantize(raw, name, shaped.shape, out=shaped) is shaped
    assert_same_bits(shaped, out)
    for bad in (
        np.empty(n + 1, np.float32),
        np.empty(n, np.float64),
        np.empty(2 * n, np.float32)[::2],
    ):
        with pytest.raises(Q.QuantError, match="out must be"):
            fmt.dequantize(raw, n, bad)


@pytest.mark.parametrize("name", ALL)
def test_quantize_into_out_equals_new_array(name):
    fmt = Q.get(name)
    if fmt.quantize is None:
        pytest.skip("no quantizer")
    bs = 256 if fmt.block_size == 1 else fmt.block_size
    x = np.random.default_rng(3).standard_normal((5, 2 * bs)).astype(np.float32)
    if name not in ABORTS_ON_NAN and name not in ABORTING:
        x[1, 3] = np.nan  # ggml's arithmetic on NaN rows is part of the bytes
    imatrix = np.abs(np.random.default_rng(4).standard_normal(2 * bs)).astype(np.float32)
    for qw in (imatrix,) if name in NEEDS_IMATRIX else (None, imatrix):
        expected = fmt.quantize(x, qw)
        out = np.full(expected.size, 0xAB, np.uint8)
        assert fmt.quantize(x, qw, out) is out
        np.testing.assert_array_equal(out, expected.reshape(-1))
        odd = np.zeros(expected.size + 1, np.uint8)[1:]  # unaligned for 2-byte types
        assert Q.quantize(x, name, qw, out=odd) is odd
        np.testing.assert_array_equal(odd, expected.reshape(-1))
    for bad in (
        np.empty(expected.size + 1, np.uint8),
        np.empty(expected.size, np.int8),
        np.empty(2 * expected.size, np.uint8)[::2],
    ):
        with pytest.raises(Q.QuantError, match="out must be"):
            fmt.quantize(x, imatrix if name in NEEDS_IMATRIX else None, bad)


@pytest.mark.parametrize("name", sorted(NEEDS_IMATRIX))
def test_formats_needing_an_imatrix_refuse_to_quantize_without_one(name):
    x = np.ones((2, 256), np.float32)
    with pytest.raises(Q.QuantError, match=f"{name}: quantizing needs an importance matrix"):
        Q.quantize(x, name)
    with pytest.raises(Q.QuantError, match=f"{name}: quantizing needs an importance matrix"):
        Q.get(name).quantize(x, None, np.zeros(Q.get(name).row_nbytes(256) * 2, np.uint8))


@pytest.mark.parametrize("name", sorted(ABORTS_ON_NAN))
def test_grid_quantizers_raise_where_ggml_aborts(name):
    """ggml's IQ2_XS / IQ2_S searches assert on a group whose every candidate has a NaN
    distance: QuantError naming the super-block, never made-up bytes."""
    x = np.random.default_rng(6).standard_normal((3, 512)).astype(np.float32)
    im = np.ones(512, np.float32)
    Q.quantize(x, name, im)
    x[2, 300] = np.nan
    with pytest.raises(Q.QuantError, match=rf"{name}: .*aborts on row 2, values 256\.\.511"):
        Q.quantize(x, name, im)


# ----------------------------------------------------------------------------- quantize


def edge_cases() -> dict[str, np.ndarray]:
    """Named (rows, 256) float32 test arrays (no NaN/Inf, no -0.0)."""
    rng = np.random.default_rng(42)
    g = rng.standard_normal((4, 256)).astype(np.float32)
    cases = {f"normal*{s:g}": (g * np.float32(s)).astype(np.float32) for s in (1e-30, 1e-5, 1, 1e4)}
    cases["huge"] = (g * np.float32(1e30)).astype(np.float32)
    cases["zeros"] = np.zeros((2, 256), np.float32)
    cases["const"] = np.full((2, 256), 0.75, np.float32)
    cases["const_neg"] = np.full((2, 256), -3.5, np.float32)
    neg = np.abs(g)
    neg[:, ::17] *= -9  # the block maximum is negative
    cases["negative_max"] = neg
    tie = g.copy()
    tie[:, 3], tie[:, 4] = 7, -7  # |max| reached twice
    cases["ties"] = tie
    cases["positive"] = rng.uniform(0.5, 2, (2, 256)).astype(np.float32)
    cases["negative"] = -rng.uniform(0.5, 2, (2, 256)).astype(np.float32)
    sparse = np.where(rng.random((4, 256)) < 0.9, 0, g).astype(np.float32)
    cases["sparse"] = sparse
    cases["heavy_tail"] = (rng.standard_t(2, (4, 256))).astype(np.float32)
    cases["mixed_blocks"] = np.concatenate([g[:2, :128] * 1e-4, g[:2, 128:] * 100], axis=1)
    cases["fp16_limits"] = np.tile(np.float32([65504, -65504, 6e-8, 1e-4]), (2, 64))
    cases["integers"] = rng.integers(-8, 8, (2, 256)).astype(np.float32)
    return cases


CASES = edge_cases()


@pytest.mark.parametrize("name", GGUF_QUANT)
@pytest.mark.parametrize("case", sorted(CASES))
def test_quantize_equals_gguf_py(name, case):
    x = CASES[case]
    ours = Q.quantize(x, name)
    expected = gq.quantize(x, gguf_type(name)).view(np.uint8)
    assert ours.shape == expected.shape
    assert np.array_equal(ours, expected)


def test_quantize_large_random_equals_gguf_py():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 2048)) * rng.uniform(0.01, 10, (64, 1))).astype(np.float32)
    for name in GGUF_QUANT:
        assert np.array_equal(Q.quantize(x, name), gq.quantize(x, gguf_type(name)).view(np.uint8))


def test_f16_and_f32_quantize_equal_numpy_casts():
    for x in [*CASES.values(), np.float32([1e5, -1e5, 65519.9, 65520, 2**-25, 3e-8, np.inf])]:
        assert np.array_equal(Q.quantize(x, "F16"), x.astype(np.float16).view(np.uint8))
        assert np.array_equal(Q.quantize(x, "F32"), x.view(np.uint8))


def test_nan_handling_matches_ggml():
    x = np.float32([np.nan, -np.nan, 1.0, -0.0]).view(np.uint32)
    x[0] |= 0x1234  # a NaN payload
    x = x.view(np.float32)
    h = Q.quantize(x, "F16").view(np.uint16)
    assert h[0] == 0x7E00 and h[1] == 0xFE00 and h[3] == 0x8000  # ggml: every NaN -> 0x7e00
    b = Q.quantize(x, "BF16").view(np.uint16)
    assert np.array_equal(b, gq.quantize(x, gguf_type("BF16")).view(np.uint16))
    assert b[0] & 0x40  # forced quiet


def test_signed_zero_blocks_follow_llama_cpp_not_gguf_py():
    """llama.cpp starts its |max| search from +0.0, so an all-zero Q4_0 block gets d = -0.0
    (0x8000) whatever the zeros' signs; gguf-py's argmax picks a -0.0 and stores +0.0."""
    for x in (np.zeros(32, np.float32), np.full(32, -0.0, np.float32)):
        for name in ("Q4_0", "Q5_0"):
            q = Q.quantize(x, name)
            assert q[0] == 0x00 and q[1] == 0x80, name
            assert np.array_equal(q, Q.get(name).quantize_numpy(x))


def outcome(quantize, x, imatrix):
    """The bytes, or the QuantError's message."""
    try:
        return quantize(x, imatrix)
    except Q.QuantError as err:
        return str(err)


@pytest.mark.parametrize("name", [t for t in QUANT if t != "F32"])
def test_quantize_numba_equals_numpy_twin(name):
    fmt = Q.get(name)
    rng = np.random.default_rng(11)
    im = (rng.uniform(0, 3, 256) ** 2).astype(np.float32)
    if name in GRID_QUANT:  # case by case: an aborting case (QuantError) fails the whole call
        for case in sorted(CASES):
            for qw in (im,) if name in NEEDS_IMATRIX else (None, im):
                a, b = (
                    outcome(fmt.quantize, CASES[case], qw),
                    outcome(fmt.quantize_numpy, CASES[case], qw),
                )
                assert a == b if isinstance(a, str) else np.array_equal(a, b), case
        return
    x = np.concatenate([CASES[c] for c in sorted(CASES)], axis=0)
    if name in ABORTING:  # both raise on the 1e30 rows
        x = x[np.abs(x).max(axis=1) < 1e12]
    assert np.array_equal(fmt.quantize(x), fmt.quantize_numpy(x))
    assert np.array_equal(fmt.quantize(x, im), fmt.quantize_numpy(x, im))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K",
                                  "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S",
                                  *GRID_QUANT])  # fmt: skip
def test_imatrix_path_twins_and_per_matrix_vectors(name):
    fmt = Q.get(name)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 512)).astype(np.float32)
    im = rng.uniform(0.1, 5, (2, 512)).astype(np.float32)
    q = fmt.quantize(x, im)
    assert np.array_equal(q, fmt.quantize_numpy(x, im))
    # one vector per matrix of a stacked tensor == each matrix with its own vector
    assert np.array_equal(q[0], fmt.quantize(x[0], im[0]))
    assert np.array_equal(q[1], fmt.quantize(x[1], im[1]))
    # the weights do change the result
    assert not np.array_equal(
        q, fmt.quantize(x, np.ones(512, np.float32) if name in NEEDS_IMATRIX else None)
    )


IQ2_IQ1 = Path(__file__).parent / "fixtures" / "quants" / "iq2_iq1_quant.npz"


@pytest.mark.parametrize("name", GRID_QUANT)
def test_iq2_iq1_quantize_equals_ggml_fixture(name):
    """ggml's bytes (scripts/make_iq2_iq1_fixtures.py), with importance weights and, where
    ggml quantizes without, without; a row with a NaN: ggml's bytes, or QuantError where
    ggml aborts."""
    with np.load(IQ2_IQ1) as z:
        f = {k: z[k] for k in z.files}
    fmt = Q.get(name)
    for quantize in (fmt.quantize, fmt.quantize_numpy):
        assert np.array_equal(quantize(f["x"], f["im"]).reshape(-1), f[f"{name}/im"])
        if name not in NEEDS_IMATRIX:
            assert np.array_equal(quantize(f["x"], None).reshape(-1), f[name])
        im = f["im"][:256]
        if f[f"{name}/nan"].size:
            assert np.array_equal(quantize(f["x_nan"], im).reshape(-1), f[f"{name}/nan"])
        else:
            with pytest.raises(Q.QuantError, match=rf"{name}: .*aborts on row 0, values 0\.\.255"):
                quantize(f["x_nan"], im)


TQ_IQ3 = Path(__file__).parent / "fixtures" / "quants" / "tq_iq3_quant.npz"


@pytest.mark.parametrize("name", ["TQ1_0", "TQ2_0", "IQ3_XXS", "IQ3_S"])
def test_tq_iq3_quantize_equals_ggml_fixture(name):
    """ggml's bytes (scripts/make_tq_iq3_fixtures.py), with and without importance weights;
    on a row with a NaN, ggml's bytes where it has them, else (the IQ3 types abort there)
    QuantError from both of ours."""
    f = np.load(TQ_IQ3)
    fmt = Q.get(name)
    for x, im, key in ((f["x"], None, name), (f["x"], f["im"], f"{name}/im")):
        expected = f[key].reshape(x.shape[0], -1)
        assert np.array_equal(fmt.quantize(x, im), expected), key
        assert np.array_equal(fmt.quantize_numpy(x, im), expected), key
    expected = f[f"{name}/nan"]
    if expected.size:
        assert np.array_equal(fmt.quantize(f["x_nan"]).reshape(-1), expected)
    else:
        for quantize in (fmt.quantize, fmt.quantize_numpy):
            with pytest.raises(Q.QuantError, match=rf"{name}: .*aborts on row 0, values 0\.\.255"):
                quantize(f["x_nan"])


Q1_Q2_NVFP4 = Path(__file__).parent / "fixtures" / "quants" / "q1_q2_nvfp4.npz"


@pytest.mark.parametrize("name", ["Q1_0", "Q2_0", "NVFP4"])
def test_q1_q2_nvfp4_equal_ggml_fixture(name):
    """ggml's bytes (scripts/make_q1_q2_nvfp4_fixtures.py) of hostile rows (NaN, infinities,
    huge, denormal, all-equal and all-zero blocks, random bit patterns, UE4M3 scale sweeps),
    with and without importance weights (which ggml ignores for these types), and ggml's
    floats for random blocks with non-finite, signed-zero and denormal scales (NVFP4: every
    scale byte)."""
    with np.load(Q1_Q2_NVFP4) as z:
        f = {k: z[k] for k in z.files}
    fmt = Q.get(name)
    x = f["x"]
    for im, key in ((None, name), (f["im"], f"{name}/im")):
        expected = f[key].reshape(x.shape[0], -1)
        assert np.array_equal(fmt.quantize(x, im), expected), key
        assert np.array_equal(fmt.quantize_numpy(x, im), expected), key
    raw, deq = f[f"{name}/raw"], f[f"{name}/deq"]
    assert_same_bits(fmt.dequantize(raw, deq.size), deq)
    assert_same_bits(fmt.dequantize_numpy(raw, deq.size), deq)
