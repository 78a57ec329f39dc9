"""The classification head of rerankers (llama.cpp's ``LLAMA_POOLING_TYPE_RANK``).

A reranker scores a (query, document) pair: the pooled hidden state of the pair (the CLS
token of an encoder) goes through ``cls`` (``dense``, then ``tanh``: RoBERTa-style heads,
when the file has it) and ``cls.output`` (a projection to ``n_cls_out`` scores, when the
file has it), as ``llm_graph_context::build_pooling``. ``n_cls_out`` is the length of
``{arch}.classifier.output_labels`` (1 without it); qwen3's scores then go through a softmax
(a causal reranker: ``cls.output`` holds the LM head's "yes" and "no" rows, so the score is
the probability of "yes"). The score of a pair is the first value.

The head is small (one or two matrices of ``n_embd`` rows), so it runs in numpy on
dequantized weights, summed in double.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelError
from ..gguf import GGUFModelFile
from ..quants import dequantize
from .weights import TensorSource

_F32 = np.float32


@dataclass(frozen=True)
class RankHead:
    dense: np.ndarray | None  # [n_embd, n_embd] (rows = outputs) or None
    dense_b: np.ndarray | None
    out: np.ndarray | None  # [n_cls_out, n_embd] or None
    out_b: np.ndarray | None
    labels: tuple[str, ...]
    softmax: bool = False

    @property
    def n_cls_out(self) -> int:
        """Scores per pair (llama.cpp's ``n_cls_out``: the labels, else 1)."""
        return max(1, len(self.labels))

    def __call__(self, pooled: np.ndarray) -> np.ndarray:
        """Scores ``[n_cls_out]`` of one pooled vector ``[n_embd]``."""
        x = np.asarray(pooled, np.float64)
        if self.dense is not None:
            x = self.dense.astype(np.float64) @ x
            if self.dense_b is not None:
                x = x + self.dense_b
            x = np.tanh(x.astype(_F32)).astype(np.float64)
        if self.out is not None:
            x = self.out.astype(np.float64) @ x
            if self.out_b is not None:
                x = x + self.out_b
        x = x[: self.n_cls_out].astype(_F32)
        if self.softmax:  # ggml_soft_max, in f32
            e = np.exp(x - x.max())
            x = e / e.sum(dtype=_F32)
        return x


def load_rank_head(
    mf: GGUFModelFile, source: TensorSource, arch: str, n_embd: int, softmax: bool = False
):
    """The file's classification head, or None when it has neither ``cls`` nor
    ``cls.output`` (the model cannot rank). Shapes are checked against ``n_embd`` and the
    labels."""
    labels = mf.metadata.get(f"{arch}.classifier.output_labels")
    if labels is None:
        labels = ()
    elif not isinstance(labels, list | tuple) or not all(isinstance(s, str) for s in labels):
        raise ModelError(f"metadata key '{arch}.classifier.output_labels' must be strings")
    n_out = max(1, len(labels))

    def tensor(name: str, shape: tuple[int, ...]) -> np.ndarray | None:
        if not mf.has_tensor(name):
            return None
        info = mf.tensor(name)
        if tuple(info.shape) != shape:
            raise ModelError(f"tensor {name!r} has shape {tuple(info.shape)}, expected {shape}")
        return np.ascontiguousarray(dequantize(source.raw(info), info.type, info.np_shape), _F32)

    dense = tensor("cls.weight", (n_embd, n_embd))
    dense_b = tensor("cls.bias", (n_embd,))
    out = tensor("cls.output.weight", (n_embd, n_out))
    out_b = tensor("cls.output.bias", (n_out,))
    if dense is None and out is None:
        if dense_b is not None or out_b is not None:
            raise ModelError("the classifier head has biases but no 'cls' / 'cls.output' weight")
        return None
    return RankHead(dense, dense_b, out, out_b, tuple(labels), softmax)
