#!/usr/bin/env python
"""Produce the fixtures of the hybrid and recurrent architectures' tests (qwen35, qwen35moe,
qwen3next and its older ssm_in layout, lfm2, lfm2moe, mamba2, granitehybrid and its
variants) with llama.cpp (the oracle; dev-only).

Run from the repository root with the project's venv::

    .venv/bin/python scripts/make_qwen35_fixtures.py [--arch qwen35moe|qwen3next|qwen3next_ssm_in|lfm2|...] [--oracle-py PY]

Writes ``tests/fixtures/engine/{arch}_logits.npz``: for the tiny random ``qwen35`` of
``llamacpy.models.tiny.write_tiny_qwen35`` (``qwen35moe``: ``write_tiny_qwen35moe``, ``lfm2``:
``write_tiny_lfm2``, ``lfm2moe``: ``write_tiny_lfm2moe``, ``mamba2``: ``write_tiny_mamba2``,
``qwen3next``: ``write_tiny_qwen3next``, ``qwen3next_ssm_in``: the same with ``ssm_in=True``,
``granitehybrid*``: ``write_tiny_granitehybrid`` with
``tiny.GRANITEHYBRID_CASES``' options; seed 3,
F32 and Q8_0 weights, rebuilt by the tests) the file's sha256, llama.cpp's logits on ``tokens`` (one batch, every position), a
greedy continuation of ``prompt`` with the logits of each step (prompt in one batch, then one
token at a time), and what ``llama_memory_seq_rm`` answers after the prompt for a tail, a
range past the end and the whole sequence.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from llamacpy.gguf import GGMLType  # noqa: E402
from llamacpy.models.tiny import (  # noqa: E402
    GRANITEHYBRID_CASES,
    write_tiny_granitehybrid,
    write_tiny_lfm2,
    write_tiny_lfm2moe,
    write_tiny_mamba2,
    write_tiny_qwen3next,
    write_tiny_qwen35,
    write_tiny_qwen35moe,
)
from make_arch_fixtures import ORACLE_LOGITS, ORACLE_PY, PROMPT, TOKENS, oracle  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "engine"
SEED = 3
N_GREEDY = 8
N_CTX = 64
TYPES = (GGMLType.F32, GGMLType.Q8_0)
WRITERS = {"qwen35": write_tiny_qwen35, "qwen35moe": write_tiny_qwen35moe,
           "lfm2": write_tiny_lfm2, "lfm2moe": write_tiny_lfm2moe,
           "mamba2": write_tiny_mamba2, "qwen3next": write_tiny_qwen3next,
           "qwen3next_ssm_in": partial(write_tiny_qwen3next, ssm_in=True)}  # fmt: skip
for _case, _kw in GRANITEHYBRID_CASES.items():  # granitehybrid, _moe, _rope
    WRITERS[_case] = lambda path, t, seed, _kw=_kw: write_tiny_granitehybrid(path, t, seed, **_kw)
SEQ_RM = ((0, 3, -1), (0, len(PROMPT) + N_GREEDY, -1), (0, 0, -1))  # (seq, p0, p1)

_STEPS = """llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(m.ctx), True)
m.eval({prompt})
out, steps = [], [np.array(m.scores[m.n_tokens - 1], np.float32).tolist()]
for k in range({n_gen}):
    t = int(np.argmax(m.scores[m.n_tokens - 1]))
    out.append(t)
    m.eval([t])
    steps.append(np.array(m.scores[m.n_tokens - 1], np.float32).tolist())
mem = llama_cpp.llama_get_memory(m.ctx)
rm = [bool(llama_cpp.llama_memory_seq_rm(mem, s, p0, p1)) for s, p0, p1 in {seq_rm}]
print(json.dumps({{"logits": logits, "greedy": out, "steps": steps, "seq_rm": rm}}))
"""
_CODE = ORACLE_LOGITS + _STEPS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(WRITERS), default="qwen35")
    ap.add_argument("--oracle-py", default=ORACLE_PY)
    args = ap.parse_args()
    out: dict[str, np.ndarray] = {
        "tokens": np.array(TOKENS, np.int32),
        "prompt": np.array(PROMPT, np.int32),
        "seq_rm_args": np.array(SEQ_RM, np.int32),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for t in TYPES:
            path = Path(tmp) / f"{args.arch}_{t.name}.gguf"
            WRITERS[args.arch](path, t, seed=SEED)
            code = _CODE.format(
                path=str(path), n_ctx=N_CTX, tokens=TOKENS, n=len(TOKENS), prompt=PROMPT,
                n_gen=N_GREEDY, seq_rm=SEQ_RM,
            )  # fmt: skip
            res = oracle(args.oracle_py, code)
            for name, dt in (("logits", np.float32), ("greedy", np.int32),
                             ("steps", np.float32), ("seq_rm", bool)):  # fmt: skip
                out[f"{t.name}.{name}"] = np.array(res[name], dt)
            out[f"{t.name}.sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
            mx = np.abs(out[f"{t.name}.logits"]).max()
            print(
                f"{t.name}: |logits| max {mx:.3f}, greedy {res['greedy']}, seq_rm {res['seq_rm']}"
            )
    np.savez_compressed(FIX / f"{args.arch}_logits.npz", **out)


if __name__ == "__main__":
    main()
