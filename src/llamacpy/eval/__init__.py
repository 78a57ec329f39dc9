"""L5: model evaluation tools with llama.cpp's semantics: perplexity (``llama-perplexity``)
and throughput benchmarks (``llama-bench``)."""

from .bench import Bench, BenchResult, BenchTest, expand_tests
from .perplexity import PerplexityResult, perplexity

__all__ = ["Bench", "BenchResult", "BenchTest", "PerplexityResult", "expand_tests", "perplexity"]
