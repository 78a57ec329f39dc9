"""The Gated DeltaNet kernels (ops/delta_net.py) against their numpy twins
(models/delta_net_ref.py), sequences interleaved in one ubatch."""

from __future__ import annotations

import numpy as np
import pytest

from llamacpy.models.delta_net_ref import conv1d_step, delta_rule_step
from llamacpy.ops.delta_net import delta_rule_tokens
from llamacpy.ops.ssm import conv_bias_tokens

_F32 = np.float32


def test_conv_tokens_equals_the_twin_token_by_token() -> None:
    rng = np.random.default_rng(0)
    n, ch, taps, seqs = 7, 24, 4, 2
    x = rng.standard_normal((n, ch)).astype(_F32)
    w = rng.standard_normal((ch, taps)).astype(_F32)
    rows = np.array([0, 1, 1, 0, 0, 1, 0], np.int32)
    state = rng.standard_normal((seqs, ch, taps - 1)).astype(_F32)
    want_state, want = state.copy(), np.zeros((n, ch), _F32)
    for t, r in enumerate(rows):
        want[t] = conv1d_step(want_state[r], x[t], w)
    out = np.zeros((n, ch), _F32)
    conv_bias_tokens(x, 0, n, rows, state, w, np.zeros(0, _F32), out, 0, ch)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(state, want_state)
    # in place and by channel ranges, as the threads of the compiled stage run it
    state2 = rng.standard_normal((seqs, ch, taps - 1)).astype(_F32)
    want_state = state2.copy()
    for t, r in enumerate(rows):
        want[t] = conv1d_step(want_state[r], x[t], w)
    for c0, c1 in ((0, 16), (16, ch)):
        conv_bias_tokens(x, 0, n, rows, state2, w, np.zeros(0, _F32), x, c0, c1)
    np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(state2, want_state)


@pytest.mark.parametrize("s", [16, 128, 80])  # scalar; ggml's 4 x 16-lane path; both
def test_delta_rule_tokens_equals_the_twin_token_by_token(s) -> None:
    rng = np.random.default_rng(1)
    n, h_k, h_v, seqs = 6, 2, 4, 2
    q = rng.standard_normal((n, h_k, s)).astype(_F32) / 4
    k = rng.standard_normal((n, h_k, s)).astype(_F32) / 4
    v = rng.standard_normal((n, h_v, s)).astype(_F32)
    g = -rng.random((n, h_v)).astype(_F32)
    beta = rng.random((n, h_v)).astype(_F32)
    rows = np.array([1, 0, 1, 1, 0, 1], np.int32)
    state = rng.standard_normal((seqs, h_v, s, s)).astype(_F32) / 8
    want_state, want = state.copy(), np.zeros((n, h_v, s), _F32)
    for t, r in enumerate(rows):
        want[t] = delta_rule_step(want_state[r], q[t], k[t], v[t], g[t], beta[t])
    out = np.zeros((n, h_v, s), _F32)
    delta_rule_tokens(q, k, v, g, beta, rows, state, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state, want_state, rtol=1e-5, atol=1e-6)
