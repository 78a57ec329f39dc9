"""The Llama facade on SmolLM2: llama-cpp-python's return shapes, seed parity with
llama-cpp-python 0.3.36 (fixtures from scripts/make_generation_fixtures.py), streaming,
stop strings, echo + logprobs, hooks, prefix reuse, state, and context overflow.

One thread everywhere: the test machine is shared, and spinning thread pools crawl there.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from llamacpy.api import ContextOverflowError, Llama, NotSupportedError, StoppingCriteriaList
from llamacpy.errors import LlamacpyError, UsageError

FIXTURES = Path(__file__).parent / "fixtures" / "generation"
COMPLETIONS = json.loads((FIXTURES / "completions.json").read_text())
DEFAULT_SEED = 0xFFFFFFFF

COMPLETION_KEYS = {"id", "object", "created", "model", "choices", "usage"}
CHOICE_KEYS = {"text", "index", "logprobs", "finish_reason"}
USAGE_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens"}
LOGPROBS_KEYS = {"tokens", "text_offset", "token_logprobs", "top_logprobs"}


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return Llama(str(smollm2_path), n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)


@pytest.fixture
def fresh(llm):
    """The shared model, as a freshly constructed one would behave (cache and seed)."""
    llm.reset()
    llm.set_seed(DEFAULT_SEED)
    return llm


def check_completion(res: dict) -> None:
    assert set(res) == COMPLETION_KEYS
    assert res["object"] == "text_completion" and res["id"].startswith("cmpl-")
    assert isinstance(res["created"], int) and isinstance(res["model"], str)
    (choice,) = res["choices"]
    assert set(choice) == CHOICE_KEYS and choice["index"] == 0
    assert isinstance(choice["text"], str) and choice["finish_reason"] in ("stop", "length")
    assert set(res["usage"]) == USAGE_KEYS
    u = res["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


# --------------------------------------------------------------------------- seed parity
@pytest.mark.parametrize("case", COMPLETIONS["cases"], ids=lambda c: c["name"])
def test_seed_parity_with_llama_cpp_python(fresh, case):
    res = fresh(case["prompt"], max_tokens=COMPLETIONS["max_tokens"], **case["kwargs"])
    check_completion(res)
    assert fresh.tokenize(case["prompt"].encode(), special=True) == case["prompt_ids"]
    assert res["choices"][0]["text"] == case["text"]
    assert res["choices"][0]["finish_reason"] == case["finish_reason"]
    ids = case["prompt_ids"] + case["completion_ids"]
    # the cache holds the prompt and every generated token but the last one sampled
    n_cached = len(ids) - (case["finish_reason"] == "length")
    assert fresh.session.tokens == ids[:n_cached]
    assert res["usage"]["completion_tokens"] == len(case["completion_ids"])


def test_readme_completion_example(smollm2_path):
    # llama-cpp-python's README example with the import swapped; the constructor gets the
    # model's path and one thread (the shared test machine), nothing else
    llm = Llama(
        model_path=str(smollm2_path),
        n_threads=1,
        # n_gpu_layers=-1, # Uncomment to use GPU acceleration
        # seed=1337, # Uncomment to set a specific seed
        # n_ctx=2048, # Uncomment to increase the context window
    )
    output = llm(
        "Q: Name the planets in the solar system? A: ",  # Prompt
        max_tokens=32,  # Generate up to 32 tokens, set to None to generate up to the end of the context window
        stop=["Q:", "\n"],  # Stop generating just before the model would generate a new question
        echo=True,  # Echo the prompt back in the output
    )  # Generate a completion, can also call create_completion
    print(output)
    check_completion(output)
    # the same output as llama-cpp-python's (the default seed is reproducible there too)
    expected = COMPLETIONS["readme"]
    assert output["choices"] == expected["choices"] and output["usage"] == expected["usage"]


def test_readme_chat_example(smollm2_path):
    # the README's chat example, unchanged but for the path (and a small context/1 thread)
    llm = Llama(model_path=str(smollm2_path), chat_format="llama-2", n_ctx=96, n_threads=1,
                verbose=False)  # fmt: skip
    res = llm.create_chat_completion(
        messages=[
            {"role": "system", "content": "You are an assistant who perfectly describes images."},
            {"role": "user", "content": "Describe this image in detail please."},
        ]
    )
    assert set(res) == COMPLETION_KEYS and res["object"] == "chat.completion"
    (choice,) = res["choices"]
    assert set(choice) == {"index", "message", "logprobs", "finish_reason"}
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert res["id"].startswith("chatcmpl-")


def test_chat_completion_with_gguf_template_matches(fresh):
    res = fresh.create_chat_completion(
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0.0, max_tokens=24,
    )  # fmt: skip
    expected = COMPLETIONS["chat"]
    assert res["choices"] == expected["choices"] and res["usage"] == expected["usage"]
    assert fresh.chat_format == "chat_template.default"


def test_chat_streaming_chunks(fresh):
    chunks = list(fresh.create_chat_completion(
        messages=[{"role": "user", "content": "Say hi."}], max_tokens=6, stream=True,
        temperature=0.0,
    ))  # fmt: skip
    first, *middle, last = chunks
    for c in chunks:
        assert set(c) == {"id", "model", "created", "object", "choices"}
        assert c["object"] == "chat.completion.chunk"
        assert set(c["choices"][0]) == {"index", "delta", "logprobs", "finish_reason"}
    assert first["choices"][0]["delta"] == {"role": "assistant"}
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in middle)
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == "length"


# --------------------------------------------------------------------------- completion
def test_streaming_equals_non_streaming(fresh):
    full = fresh("The capital of France is", max_tokens=12, temperature=0.0)
    chunks = list(fresh("The capital of France is", max_tokens=12, temperature=0.0, stream=True))
    for c in chunks:
        assert set(c) == COMPLETION_KEYS - {"usage"}
        assert set(c["choices"][0]) == CHOICE_KEYS
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1


def test_stop_strings_across_tokens(fresh):
    # greedy: " Paris.\n\nThe United States ..." -- ".\n\nThe" spans several tokens
    res = fresh("The capital of France is", max_tokens=16, temperature=0.0, stop=".\n\nThe")
    assert res["choices"][0]["text"] == " Paris"
    assert res["choices"][0]["finish_reason"] == "stop"
    chunks = list(fresh("The capital of France is", max_tokens=16, temperature=0.0,
                        stop=[".\n\nThe"], stream=True))  # fmt: skip
    assert "".join(c["choices"][0]["text"] for c in chunks) == " Paris"
    res = fresh("The capital of France is", max_tokens=16, temperature=0.0, stop=["Paris.\n\nX"])
    assert res["choices"][0]["text"].startswith(" Paris.\n\nThe")  # a false start is released


def test_echo_and_logprobs(smollm2_path, fresh):
    expected = COMPLETIONS["echo_logprobs"]["choices"][0]
    res = fresh("The capital of France is", max_tokens=6, temperature=0.0, logprobs=3, echo=True)
    (choice,) = res["choices"]
    assert choice["text"] == expected["text"]
    lp = choice["logprobs"]
    assert set(lp) == LOGPROBS_KEYS
    # llama-cpp-python drops the last generated token (it has no logits row for it); we
    # report every token
    assert lp["tokens"][:-1] == expected["logprobs"]["tokens"]
    assert len(lp["tokens"]) == res["usage"]["total_tokens"]
    assert lp["text_offset"][:-1] == expected["logprobs"]["text_offset"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # llama-cpp-python pairs each echoed token of a BOS-less prompt with the logits of the
    # *next* position (its top lists are right): check our logprob of token i + 1 there
    checked = 0
    for i, top in enumerate(expected["logprobs"]["top_logprobs"]):
        nxt = lp["tokens"][i + 1]
        if top and nxt in top:
            assert lp["token_logprobs"][i + 1] == pytest.approx(top[nxt], abs=1e-4)
            checked += 1
    assert checked >= 8
    for top, tok, val in zip(lp["top_logprobs"][1:], lp["tokens"][1:], lp["token_logprobs"][1:]):
        assert len(top) in (3, 4) and top[tok] == val
        assert max(top.values()) <= 0.0


def test_logprobs_of_generated_tokens_match(fresh):
    expected = COMPLETIONS["echo_logprobs"]["choices"][0]["logprobs"]
    res = fresh("The capital of France is", max_tokens=6, temperature=0.0, logprobs=3)
    lp = res["choices"][0]["logprobs"]
    assert lp["tokens"] == [" Paris", ".", "\n", "\n", "The", " United"]
    assert lp["text_offset"] == [24, 30, 31, 32, 33, 36]  # after the 24-character prompt
    # the recorded top list of position i - 1 holds the logprob of token i
    for j, (tok, val) in enumerate(zip(lp["tokens"], lp["token_logprobs"])):
        top = expected["top_logprobs"][5 + j - 1]
        assert val == pytest.approx(top[tok], abs=1e-4)
        assert lp["top_logprobs"][j][tok] == val and len(lp["top_logprobs"][j]) in (3, 4)


def test_logits_processor_and_stopping_criteria(fresh):
    base = fresh("The capital of France is", max_tokens=4, temperature=0.0)
    paris = fresh.tokenize(b" Paris", add_bos=False)[0]
    seen = []

    def ban_paris(input_ids, scores):
        seen.append(len(input_ids))
        scores = scores.copy()
        scores[paris] = -np.inf
        return scores

    res = fresh("The capital of France is", max_tokens=4, temperature=0.0,
                logits_processor=[ban_paris])  # fmt: skip
    assert "Paris" not in res["choices"][0]["text"] != base["choices"][0]["text"]
    assert seen[:2] == [5, 6]  # the processor sees the decoded tokens
    stop_after_two = StoppingCriteriaList([lambda ids, logits: len(ids) >= 7])
    res = fresh("The capital of France is", max_tokens=10, temperature=0.0,
                stopping_criteria=stop_after_two)  # fmt: skip
    assert res["choices"][0]["finish_reason"] == "stop"
    assert res["usage"]["completion_tokens"] == 2


def test_logit_bias_and_ignore_eos(fresh):
    paris = fresh.tokenize(b" Paris", add_bos=False)[0]
    res = fresh("The capital of France is", max_tokens=2, temperature=0.0, logit_bias={paris: -100})
    assert "Paris" not in res["choices"][0]["text"]
    res = fresh("List of fruits: apple, banana,", max_tokens=24, temperature=0.7,
                repeat_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, seed=123,
                ignore_eos=True)  # fmt: skip
    assert res["usage"]["completion_tokens"] == 24  # the recorded run ended with EOS at 19


def test_prefix_reuse_decodes_only_the_suffix(fresh):
    s = fresh.session
    fresh("The capital of France is", max_tokens=4, temperature=0.0)
    cached = list(s.tokens)
    assert len(cached) == 5 + 3  # the prompt and 3 of the 4 generated tokens
    n0 = s.n_decoded
    extra = fresh.tokenize(b" It is", add_bos=False)
    fresh(cached + extra, max_tokens=1, temperature=0.0)
    assert s.n_decoded - n0 == len(extra)
    n1 = s.n_decoded
    fresh("The capital of Spain is", max_tokens=1, temperature=0.0)
    assert s.n_decoded - n1 == 2  # " Spain is"


def test_context_overflow_is_an_error_naming_both_lengths(fresh):
    with pytest.raises(
        ContextOverflowError, match=r"Requested tokens \(\d+\) exceed context window of 256"
    ):
        fresh("hello " * 300, max_tokens=4)
    with pytest.raises(ValueError):
        fresh("hello " * 300, max_tokens=4)
    # generation that fills the context ends with finish_reason "length"
    prompt = "word " * 250
    res = fresh(prompt, max_tokens=100, temperature=0.0)
    n = res["usage"]["prompt_tokens"] + res["usage"]["completion_tokens"]
    assert n == 256 and res["choices"][0]["finish_reason"] == "length"


def test_tokenize_detokenize_and_info(llm):
    ids = llm.tokenize(b"Hello world")
    assert llm.detokenize(ids) == b"Hello world"
    assert llm.tokenize(b"<|im_start|>", special=True) == [1]
    assert llm.n_ctx() == 256 and llm.n_vocab() == 49152 and llm.n_embd() == 576
    assert (llm.token_bos(), llm.token_eos()) == (1, 2)
    md = llm.metadata
    assert md["general.architecture"] == "llama"
    assert md["llama.attention.layer_norm_rms_epsilon"] == "0.000010"
    assert md["tokenizer.ggml.add_bos_token"] == "false"
    assert "tokenizer.ggml.tokens" not in md  # arrays are left out, as llama.cpp does


def test_save_and_load_state(fresh):
    fresh("The capital of France is", max_tokens=3, temperature=0.0)
    state = fresh.save_state()
    after = fresh(" and", max_tokens=5, temperature=0.0)["choices"][0]["text"]
    fresh("Something else entirely", max_tokens=3, temperature=0.0)
    fresh.load_state(state)
    assert fresh.session.tokens == list(state.input_ids)
    n = fresh.session.n_decoded
    again = fresh(" and", max_tokens=5, temperature=0.0)["choices"][0]["text"]
    assert again == after
    assert fresh.session.n_decoded - n <= 6
    import pickle

    assert pickle.loads(pickle.dumps(state)).n_tokens == state.n_tokens


def test_errors_are_clear(fresh, smollm2_path):
    with pytest.raises(UsageError, match="embedding=True"):
        fresh.create_embedding("hello")
    with pytest.raises(UsageError, match="unsupported argument"):
        Llama(str(smollm2_path), lora_path="x.gguf", verbose=False)
    with pytest.raises(NotSupportedError):
        fresh("hi", suffix="there")
    with pytest.raises(UsageError, match="no chat template|unknown chat format"):
        fresh.chat_format = "nope"
        try:
            fresh.create_chat_completion([{"role": "user", "content": "x"}])
        finally:
            fresh.chat_format = "chat_template.default"
    assert issubclass(NotSupportedError, LlamacpyError)


def test_vocab_only(smollm2_path):
    v = Llama(str(smollm2_path), vocab_only=True, verbose=False)
    assert v.tokenize(b"Hello") == [19556]
    with pytest.raises(UsageError, match="vocab_only=True"):
        v("Hello")


def test_streaming_logprobs(fresh):
    chunks = list(fresh("The capital of France is", max_tokens=3, temperature=0.0, logprobs=2,
                        stream=True))  # fmt: skip
    per_token = [c["choices"][0]["logprobs"] for c in chunks[:-1]]
    assert [lp["tokens"] for lp in per_token] == [[" Paris"], ["."], ["\n"]]
    assert [lp["text_offset"] for lp in per_token] == [[24], [30], [31]]
    assert all(set(lp) == LOGPROBS_KEYS for lp in per_token)
    assert chunks[-1]["choices"][0]["logprobs"] is None


def test_grammar_hook_takes_a_sampler(fresh):
    from llamacpy.sampling import Sampler

    allowed = fresh.tokenize(b" London", add_bos=False)

    class OnlyLondon(Sampler):
        name = "only-london"

        def apply(self, cur):
            keep = np.isin(cur.id[: cur.size], allowed)
            cur.logit[: cur.size][~keep] = -np.inf

    res = fresh("The capital of France is", max_tokens=1, temperature=0.0, grammar=OnlyLondon())
    assert res["choices"][0]["text"] == " London"
    with pytest.raises(UsageError, match="grammar must be a LlamaGrammar or a Sampler"):
        fresh("x", max_tokens=1, grammar=42)


def test_kv_overrides_reach_the_tokenizer(smollm2_path):
    v = Llama(str(smollm2_path), vocab_only=True, verbose=False,
              kv_overrides={"tokenizer.ggml.add_bos_token": True})  # fmt: skip
    assert v.tokenize(b"Hello") == [1, 19556]
    assert v.metadata["tokenizer.ggml.add_bos_token"] == "true"
    with pytest.raises(UsageError, match="hyper-parameters"):
        Llama(str(smollm2_path), verbose=False, kv_overrides={"llama.context_length": 4})


@pytest.mark.parametrize("bias", [{99999999: 5.0}, {-1: 1.0}, {"x": 1.0}, {5: "high"}])
def test_bad_logit_bias_is_a_value_error_naming_it(fresh, bias):
    with pytest.raises(ValueError, match="logit_bias"):
        fresh("Hello", max_tokens=2, logit_bias=bias)
