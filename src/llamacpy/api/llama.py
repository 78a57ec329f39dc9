"""``Llama``: llama-cpp-python's high-level API over the llamacpy engine.

A thin facade: the constructor loads the model (:mod:`.model`), completion arguments become
a sampler chain (:func:`llama_cpp_sampler`) and a :class:`~.generation.GenerationConfig`,
the shared loop (:class:`~.generation.Session`) does the work, and :mod:`.openai` shapes the
results. The KV cache is reused for the common prefix of consecutive calls.
"""

from __future__ import annotations

import os
import random
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..engine import ContextParams
from ..engine.embeddings import POOLING_TYPES, per_token_note, pooling_name
from ..engine.embeddings import normalize as normalize_embd
from ..errors import UsageError
from ..grammar.lazy import LazyGrammar
from ..models import RopeOverrides
from ..sampling import (
    LLAMA_DEFAULT_SEED,
    Dist,
    GrammarSampler,
    Greedy,
    MinP,
    Mirostat,
    MirostatV2,
    Penalties,
    Sampler,
    SamplerChain,
    Temp,
    TopK,
    TopP,
    Typical,
)
from . import openai
from .chat_formats import default_format, format_chat
from .generation import (
    ContextOverflowError,
    Generation,
    GenerationConfig,
    NotSupportedError,
    Session,
)
from .grammar import LlamaGrammar, grammar_matcher, grammar_sampler, response_format_schema
from .model import LoadedModel, ModelInfo, load_model, metadata_strings
from .rerank import RERANK_TEMPLATE_KEY, rerank_tokens
from .state import LlamaState, load_session, save_session
from .tool_calls import (
    Generic,
    ReplyStream,
    generic_messages,
    parse_reply,
    parse_tool_choice,
    parse_tools,
    plan_chat,
)

# ggml type ids llama-cpp-python passes (GGML_TYPE_*)
_CACHE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0",
                20: "iq4_nl", 30: "bf16"}  # fmt: skip
_ROPE_SCALING = {-1: None, 0: "none", 1: "linear", 2: "yarn", 3: "longrope"}
# constructor arguments that only matter for GPUs, LoRA-free CPU runs or llama.cpp internals
_IGNORED = {"n_gpu_layers", "split_mode", "main_gpu", "tensor_split", "offload_kqv",
            "flash_attn", "op_offload", "no_perf", "numa",
            "attention_type", "spm_infill"}  # fmt: skip
_REFUSED = {"lora_base", "lora_path", "tokenizer"}


class LogitsProcessorList(list):
    """Processors ``(input_ids, scores) -> scores`` applied in order."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores


class StoppingCriteriaList(list):
    """Criteria ``(input_ids, logits) -> bool``; any True stops the generation."""

    def __call__(self, input_ids: np.ndarray, logits: np.ndarray) -> bool:
        return any([c(input_ids, logits) for c in self])


def llama_cpp_sampler(
    n_vocab: int,
    seed: int,
    *,
    temp: float = 0.8,
    top_k: int = 40,
    top_p: float = 0.95,
    min_p: float = 0.05,
    typical_p: float = 1.0,
    repeat_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
    penalty_last_n: int = 64,
    mirostat_mode: int = 0,
    mirostat_tau: float = 5.0,
    mirostat_eta: float = 0.1,
    grammar: Sampler | None = None,
) -> SamplerChain:
    """The chain llama-cpp-python's ``Llama._init_sampler`` builds: penalties, (grammar),
    then greedy (temp 0), dist (temp < 0), mirostat, or top-k -> typical -> top-p -> min-p
    -> temp -> dist, with ``min_keep = 1``."""
    chain = SamplerChain()
    chain.add(Penalties(penalty_last_n, repeat_penalty, frequency_penalty, presence_penalty))
    if grammar is not None:
        if not isinstance(grammar, Sampler):
            raise UsageError(
                f"grammar must be a LlamaGrammar or a Sampler, not {type(grammar).__name__}"
            )
        chain.add(grammar)
    if temp < 0.0:
        return chain.add(Dist(seed))
    if temp == 0.0:
        return chain.add(Greedy())
    if mirostat_mode == 1:
        return chain.add(Mirostat(n_vocab, seed, mirostat_tau, mirostat_eta, 100))
    if mirostat_mode == 2:
        return chain.add(MirostatV2(seed, mirostat_tau, mirostat_eta))
    for s in (TopK(top_k), Typical(typical_p, 1), TopP(top_p, 1), MinP(min_p, 1), Temp(temp)):
        chain.add(s)
    return chain.add(Dist(seed))


def _logit_bias_processor(bias: Mapping[Any, float], n_vocab: int) -> Callable[..., np.ndarray]:
    """``scores[token] += bias`` for each pair, checked first (a bad key is a ValueError that
    names it, before any compute)."""
    pairs = {}
    for k, v in bias.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias: {k!r} is not a token id") from None
        if not 0 <= tid < n_vocab:
            raise ValueError(f"logit_bias: token id {tid} is out of range (0..{n_vocab - 1})")
        try:
            pairs[tid] = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias[{k!r}]: {v!r} is not a number") from None

    def apply(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.copy(scores)
        for tid, b in pairs.items():
            out[tid] = b + scores[tid]
        return out

    return apply


class Llama:
    """Load a GGUF model (a path or a registry name such as ``smollm2-135m``) for text
    completion and chat, with llama-cpp-python's constructor arguments and return shapes.

    GPU, LoRA and llama.cpp-internal arguments are accepted and ignored where harmless
    (``n_gpu_layers``, ``flash_attn`` ...) and refused where they would change results.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        vocab_only: bool = False,
        use_mmap: bool = True,
        use_mlock: bool = False,
        kv_overrides: dict[str, bool | int | float | str] | None = None,
        seed: int = LLAMA_DEFAULT_SEED,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_ubatch: int = 512,
        n_threads: int | None = None,
        n_threads_batch: int | None = None,
        rope_scaling_type: int | None = -1,
        rope_freq_base: float = 0.0,
        rope_freq_scale: float = 0.0,
        yarn_ext_factor: float = -1.0,
        yarn_attn_factor: float = 1.0,
        yarn_beta_fast: float = 32.0,
        yarn_beta_slow: float = 1.0,
        yarn_orig_ctx: int = 0,
        logits_all: bool = False,
        embedding: bool = False,
        pooling_type: int = -1,
        last_n_tokens_size: int = 64,
        chat_format: str | None = None,
        chat_handler: Callable[..., Any] | None = None,
        type_k: int | str | None = None,
        type_v: int | str | None = None,
        swa_full: bool | None = None,
        deterministic: bool = False,
        draft_model: Any = None,
        verbose: bool = True,
        **kwargs: Any,
    ) -> None:
        refused = sorted(k for k, v in kwargs.items() if k in _REFUSED and v is not None)
        unknown = sorted(set(kwargs) - _IGNORED - _REFUSED)
        if refused or unknown:
            what = refused or unknown
            raise UsageError(f"Llama: unsupported argument(s): {', '.join(what)}")
        proposer = None
        if draft_model is not None:  # (checked before the model loads)
            from .speculative import as_proposer

            proposer = as_proposer(draft_model)
        self.model_path = os.fspath(model_path)
        self.verbose = verbose
        self._seed = seed or LLAMA_DEFAULT_SEED
        self._logits_all = logits_all
        self._embedding = embedding
        self.last_n_tokens_size = last_n_tokens_size
        self.chat_handler = chat_handler
        self.kv_overrides = kv_overrides
        self._loaded: LoadedModel | None = None
        if vocab_only:
            self._info, self._tokenizer = ModelInfo.read(model_path, kv_overrides)
        else:
            rope = RopeOverrides(
                scaling_type=_ROPE_SCALING.get(rope_scaling_type if rope_scaling_type is not None
                                               else -1),
                freq_base=rope_freq_base or None,
                freq_scale=rope_freq_scale or None,
                yarn_ext_factor=None if yarn_ext_factor < 0 else yarn_ext_factor,
                yarn_attn_factor=yarn_attn_factor if yarn_attn_factor != 1.0 else None,
                yarn_beta_fast=yarn_beta_fast if yarn_beta_fast != 32.0 else None,
                yarn_beta_slow=yarn_beta_slow if yarn_beta_slow != 1.0 else None,
                yarn_orig_ctx=yarn_orig_ctx or None,
            )  # fmt: skip
            n_batch = min(n_ctx, n_batch) if n_ctx else n_batch
            params = ContextParams(
                n_ctx=n_ctx,
                n_batch=n_batch,
                n_ubatch=min(n_batch, n_ubatch),
                n_threads=n_threads or 0,
                n_threads_batch=n_threads_batch or 0,
                type_k=_cache_type(type_k),
                type_v=_cache_type(type_v),
                # llama-cpp-python's default (None): the context default of llama.h, full
                swa_full=True if swa_full is None else bool(swa_full),
                deterministic=bool(deterministic),
                use_mmap=use_mmap,
                use_mlock=use_mlock,
                rope=rope,
                embeddings=embedding,
                pooling_type=pooling_name(pooling_type),
            )
            self._loaded = load_model(model_path, params, kv_overrides)
            self._info, self._tokenizer = self._loaded.info, self._loaded.tokenizer
            self._session = Session(self._loaded.ctx, self._tokenizer, keep_logits=logits_all)
            self._session.timings.t_load = self._loaded.load_time
            self.n_batch = self._loaded.ctx.n_batch
        self._speculator = None
        if proposer is not None and self._loaded is not None and self._loaded.ctx.can_rewind:
            from .speculative import Speculator

            self._speculator = Speculator(proposer)  # (a recurrent model decodes plainly)
        self.metadata: dict[str, str] = metadata_strings(self._info.metadata)
        self.chat_format = chat_format or default_format(self._tokenizer)
        if verbose:
            print(f"llamacpy: loaded {self._info.desc} from {self._info.path}", file=sys.stderr)

    # ------------------------------------------------------------------ model info
    def _ctx(self) -> Any:
        if self._loaded is None:
            raise UsageError(
                "this Llama has no context (vocab_only=True, or closed): it cannot evaluate"
            )
        return self._loaded.ctx

    def n_ctx(self) -> int:
        """Context size (tokens)."""
        return int(self._ctx().n_ctx)

    def n_vocab(self) -> int:
        return self._tokenizer.n_vocab

    def n_embd(self) -> int:
        return int(self._info.metadata.get(f"{self._info.arch}.embedding_length", 0))

    def token_bos(self) -> int:
        return self._tokenizer.bos

    def token_eos(self) -> int:
        return self._tokenizer.eos

    def token_nl(self) -> int:
        return self._tokenizer.nl

    def tokenizer(self) -> Any:
        """The llamacpy :class:`~llamacpy.tokenizer.Tokenizer` of the model."""
        return self._tokenizer

    @property
    def session(self) -> Session:
        """The generation session (KV cache state) behind this object."""
        self._ctx()
        return self._session

    # ------------------------------------------------------------------ tokens
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of UTF-8 ``text`` (BOS only when the vocabulary adds one)."""
        return self._tokenizer.encode(text, add_special=add_bos, parse_special=special)

    def detokenize(
        self, tokens: Sequence[int], prev_tokens: Sequence[int] | None = None, special: bool = False
    ) -> bytes:
        """Concatenated token pieces; a leading space after a BOS token is dropped."""
        out = b"".join(self._tokenizer.token_to_piece(int(t), special) for t in tokens)
        if tokens and int(tokens[0]) == self.token_bos() and out[:1] == b" ":
            return out[1:]
        return out

    def reset(self) -> None:
        """Forget the cached tokens (the next call decodes its whole prompt)."""
        self.session.reset()

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    # ------------------------------------------------------------------ completion
    def _sampler(self, seed: int | None, grammar: Any, **kw: Any) -> SamplerChain:
        if isinstance(grammar, (LlamaGrammar, str)):  # a fresh grammar state for each call
            grammar = grammar_sampler(grammar, self._tokenizer)
        # llama-cpp-python: an explicit seed, else one drawn from the previous seed
        self._seed = seed if seed is not None else random.Random(self._seed).randint(0, 2**32)
        return llama_cpp_sampler(
            self.n_vocab(), self._seed & 0xFFFFFFFF if self._seed >= 0 else -1,
            penalty_last_n=self.last_n_tokens_size, grammar=grammar, **kw,
        )  # fmt: skip

    def _prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self._tokenizer.encode(prompt, add_special=True, parse_special=True)
        return [int(t) for t in prompt]

    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: Sequence[Callable[..., bool]] | None = None,
        logits_processor: Sequence[Callable[..., np.ndarray]] | None = None,
        grammar: Any = None,
        logit_bias: Mapping[Any, float] | None = None,
        ignore_eos: bool = False,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Complete ``prompt`` (text, or token ids used as they are).

        Returns a ``text_completion`` dict, or with ``stream=True`` an iterator of chunks.
        ``logprobs=N`` reports each token's log-probability and the N most likely tokens
        (with ``echo=True`` also for the prompt tokens); ``ignore_eos`` keeps generating
        past end-of-generation tokens (a llamacpy extension).
        """
        if suffix is not None:
            raise NotSupportedError("suffix (fill-in-the-middle) is not supported yet")
        session = self.session
        tokens = self._prompt_tokens(prompt)
        n_ctx = session.n_ctx
        if len(tokens) >= n_ctx:
            raise ContextOverflowError(
                f"Requested tokens ({len(tokens)}) exceed context window of {n_ctx}"
            )
        limit = n_ctx - len(tokens)
        max_tokens = limit if max_tokens is None or max_tokens <= 0 else min(max_tokens, limit)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        processors = list(logits_processor or [])
        if logit_bias:
            processors.append(_logit_bias_processor(logit_bias, self._tokenizer.n_vocab))
        if ignore_eos:
            eog = dict.fromkeys(self._tokenizer.eog, -np.inf)
            processors.append(_logit_bias_processor(eog, self._tokenizer.n_vocab))
        sampler = self._sampler(
            seed, grammar, temp=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
            typical_p=typical_p, repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
        )  # fmt: skip
        config = GenerationConfig(
            max_tokens=max_tokens,
            stop=stops,
            stop_at_eog=not ignore_eos,
            logits_processors=processors,
            stopping_criteria=list(stopping_criteria or []),
            keep_logits=logprobs is not None,
            prompt_logits=echo and logprobs is not None,
            speculator=self._speculator,
        )
        if self.verbose:
            session.timings.reset()  # per-call timings, as llama-cpp-python prints them
        gen = session.generate(tokens, sampler, config)
        cid, created = openai.new_completion_id()
        name = model if model is not None else self.model_path
        if stream:
            offset = len(prompt) if isinstance(prompt, str) else len(self._text(tokens))
            return self._stream(gen, cid, created, name, logprobs, offset)
        gen.run()
        self._print_timings()
        text = gen.text
        lp = None
        if logprobs is not None:
            lp = self._logprobs(gen, logprobs, echo, prompt)
        if echo:
            text = (prompt if isinstance(prompt, str) else self._text(tokens)) + text
        return openai.completion(cid, created, name, text, gen.finish_reason, lp,
                                 len(tokens), len(gen.tokens))  # fmt: skip

    def _text(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", "ignore")

    def _logprobs(
        self, gen: Generation, n: int, echo: bool, prompt: str | Sequence[int]
    ) -> dict[str, Any]:
        rows = gen.step_logits
        piece = self._piece
        if not echo:
            offset = len(prompt) if isinstance(prompt, str) else len(self._text(gen.prompt))
            return openai.completion_logprobs(
                gen.tokens,
                np.array(rows),
                n,
                piece,
                text_offset=offset,
                skip_token=self.token_bos(),
            )
        assert gen.prompt_logits is not None
        start = 1 if gen.prompt[0] == self.token_bos() else 0
        tokens = gen.prompt[start:] + gen.tokens
        # row i predicts token i + 1; the first echoed token has no prediction
        prompt_rows = gen.prompt_logits[max(start - 1, 0) : len(gen.prompt) - 1]
        if start == 0:
            prompt_rows = np.concatenate([gen.prompt_logits[:1], prompt_rows])
        all_rows = np.concatenate([prompt_rows, np.array(rows).reshape(-1, self.n_vocab())])
        return openai.completion_logprobs(
            tokens, all_rows, n, piece, skip_token=self.token_bos(), first_is_none=True
        )

    def _piece(self, tid: int) -> bytes:
        return self._tokenizer.token_to_piece(int(tid), False)

    def _stream(
        self,
        gen: Generation,
        cid: str,
        created: int,
        name: str,
        logprobs: int | None,
        offset: int,
    ) -> Iterator[dict[str, Any]]:
        for step in gen:
            lp = None
            if logprobs is not None and step.token is not None and step.logits is not None:
                lp = openai.completion_logprobs(
                    [step.token], step.logits[None], logprobs, self._piece, text_offset=offset
                )
            offset += len(step.text)
            if step.text or lp is not None:
                yield openai.completion_chunk(cid, created, name, step.text, None, lp)
        self._print_timings()
        yield openai.completion_chunk(cid, created, name, "", gen.finish_reason)

    def __call__(self, prompt: str | list[int], *args: Any, **kwargs: Any) -> Any:
        """Same as :meth:`create_completion`."""
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(
        self,
        messages: list[dict[str, Any]],
        functions: list[dict[str, Any]] | None = None,
        function_call: Any = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        temperature: float = 0.2,
        top_p: float = 0.95,
        top_k: int = 40,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        stream: bool = False,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        response_format: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        logits_processor: Sequence[Callable[..., np.ndarray]] | None = None,
        grammar: Any = None,
        logit_bias: Mapping[Any, float] | None = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
    ) -> dict[str, Any] | Iterator[dict[str, Any]]:
        """Answer a conversation with the chat format (the GGUF template by default)."""
        kw = dict(
            temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
            typical_p=typical_p, stream=stream, seed=seed, max_tokens=max_tokens,
            presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
            repeat_penalty=repeat_penalty, mirostat_mode=mirostat_mode,
            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, model=model,
            logits_processor=logits_processor, grammar=grammar, logit_bias=logit_bias,
        )  # fmt: skip
        if self.chat_handler is not None:
            return self.chat_handler(llama=self, messages=messages, functions=functions,
                                     function_call=function_call, tools=tools,
                                     tool_choice=tool_choice, stop=stop,
                                     response_format=response_format, logprobs=logprobs,
                                     top_logprobs=top_logprobs, **kw)  # fmt: skip
        if functions is not None and tools is None:
            tools = [{"type": "function", "function": f} for f in functions]
        if tools and self.chat_format.startswith("chat_template."):
            plan = self._tool_plan(tools, tool_choice)
            if plan.active:
                return self._chat_with_tools(plan, messages, tools, stop, stream, logprobs,
                                             top_logprobs, kw)  # fmt: skip
        elif tool_choice not in (None, "auto", "none"):
            raise NotSupportedError(f"tool_choice needs a GGUF chat template (the chat format "
                                    f"is {self.chat_format!r})")  # fmt: skip
        schema = response_format_schema(response_format)
        if schema is not None:  # as llama-cpp-python: the response format wins over grammar
            kw["grammar"] = LlamaGrammar.from_json_schema(schema, verbose=self.verbose)
        chat = format_chat(self.chat_format, self._tokenizer, messages, tools)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        out = self.create_completion(
            chat.tokens, stop=stops + chat.stop, logprobs=top_logprobs if logprobs else None, **kw
        )
        if stream:
            return openai.chat_chunks(out)  # type: ignore[arg-type]
        return openai.chat_completion(out)  # type: ignore[arg-type]

    def _tool_plan(self, tools: Any, tool_choice: Any) -> Any:
        """The tools' plan for the GGUF template of this chat format."""
        key = self.chat_format.removeprefix("chat_template.")
        template = self._tokenizer.chat_template("" if key == "default" else key)
        parsed = parse_tools(tools)
        mode, chosen = parse_tool_choice(tool_choice, parsed)
        plan = plan_chat(template.source, chosen, mode,
                         parallel=template.caps.supports_parallel_tool_calls,
                         reasoning_format="none")  # fmt: skip
        return plan

    def _chat_with_tools(self, plan: Any, messages: Any, tools: Any, stop: Any, stream: bool,
                         logprobs: Any, top_logprobs: Any, kw: dict[str, Any]) -> Any:  # fmt: skip
        """A chat completion whose reply may call the tools: the format's grammar (lazy
        with ``auto``), the reply parsed into ``tool_calls`` (``finish_reason``
        ``tool_calls``), as llama-server answers."""
        if isinstance(plan.fmt, Generic):
            messages, tools = generic_messages(list(messages), plan.tools), None
        chat = format_chat(self.chat_format, self._tokenizer, messages, tools)
        plan.read_prompt(self._tokenizer.decode(chat.tokens))
        plan.build_grammar()
        matcher = grammar_matcher(plan.grammar, self._tokenizer)
        if plan.lazy:
            matcher = LazyGrammar(matcher, words=plan.trigger_words,
                                  patterns=plan.trigger_patterns)  # fmt: skip
        kw["grammar"] = GrammarSampler(matcher)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        out = self.create_completion(chat.tokens, stop=stops + chat.stop,
                                     logprobs=top_logprobs if logprobs else None, **kw)  # fmt: skip
        if stream:
            return _tool_chunks(out, plan)  # type: ignore[arg-type]
        comp = openai.chat_completion(out)  # type: ignore[arg-type]
        reply = parse_reply(out["choices"][0]["text"], plan)  # type: ignore[index]
        choice = comp["choices"][0]
        choice["message"] = reply.message()
        if reply.tool_calls:
            choice["finish_reason"] = "tool_calls"
        return comp

    # ------------------------------------------------------------------ embeddings
    def pooling_type(self) -> int:
        """The context's ``llama_pooling_type`` (0 none, 1 mean, 2 cls, 3 last)."""
        return POOLING_TYPES[self._ctx().pooling_type]

    def embed(
        self,
        input: str | list[str],
        normalize: bool | int = False,
        truncate: bool = True,
        return_count: bool = False,
    ) -> Any:
        """Embeddings of a text or a list of texts (the model needs ``embedding=True``).

        Each text is tokenized with the model's special tokens (BOS/CLS, EOS/SEP as its
        vocabulary adds them), cut to ``n_batch`` tokens with ``truncate``, and run alone.
        Pooled models give one vector per text, pooling ``none`` a vector per token.
        ``normalize``: ``False`` none, ``True`` euclidean (llama-cpp-python), or an
        ``--embd-normalize`` integer (-1 none, 0 max-abs int16, 1 taxicab, 2 euclidean,
        p > 2 p-norm). Returns lists of floats, and the token count with ``return_count``.
        """
        if not self._embedding:
            raise UsageError("Llama model must be created with embedding=True to call this method")
        ctx = self._ctx()
        if not getattr(self, "_pooling_noted", False):
            self._pooling_noted = True
            note = per_token_note(ctx.params.pooling_type, getattr(ctx.model, "pooling_type", None))
            if note:
                warnings.warn(note, stacklevel=2)
        n_batch = self.n_batch
        inputs = [input] if isinstance(input, str) else list(input)
        norm = (2 if normalize else -1) if isinstance(normalize, bool) else normalize
        data: list[Any] = []
        total = 0
        try:
            for text in inputs:
                if not isinstance(text, str):
                    raise UsageError(f"embed: inputs must be strings, not {type(text).__name__}")
                tokens = self.tokenize(text.encode("utf-8"))
                if truncate:
                    tokens = tokens[:n_batch]
                if len(tokens) > n_batch:
                    raise ContextOverflowError(
                        f"Requested tokens ({len(tokens)}) exceed batch size of {n_batch}"
                    )
                total += len(tokens)
                e = ctx.embed(tokens)
                if normalize is True:
                    # llama-cpp-python's normalize_embedding: v / ||v|| in double
                    rows = np.atleast_2d(e).astype(np.float64)
                    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
                    rows = np.where(norms > 0, rows / np.where(norms > 0, norms, 1.0), rows)
                    data.append(rows.reshape(e.shape).tolist())
                else:
                    data.append(normalize_embd(e, norm).tolist())
        finally:
            self.session.reset()  # the context's cache was used (and cleared) for embedding
        output = data[0] if isinstance(input, str) else data
        return (output, total) if return_count else output

    def create_embedding(self, input: str | list[str], model: str | None = None) -> Any:
        """An OpenAI ``list`` of ``embedding`` objects with token usage (unnormalized, as
        llama-cpp-python returns them)."""
        name = model if model is not None else self.model_path
        inputs = input if isinstance(input, list) else [input]
        embeds, total = self.embed(inputs, return_count=True)
        return openai.embedding_response(embeds, name, total)

    def rerank(self, query: str, documents: Sequence[str], return_count: bool = False) -> Any:
        """Relevance scores of ``documents`` for ``query`` with a reranker (a model with a
        classifier head, created with ``embedding=True``): each pair's prompt as
        llama-server builds it (:mod:`.rerank`), scored alone; the first output of the
        head. Returns the scores (and the total token count with ``return_count``)."""
        if not self._embedding:
            raise UsageError("Llama model must be created with embedding=True to call this method")
        if not isinstance(query, str):
            raise UsageError(f"rerank: the query must be a string, not {type(query).__name__}")
        docs = list(documents)
        if not all(isinstance(d, str) for d in docs):
            raise UsageError("rerank: documents must be strings")
        ctx = self._ctx()
        ctx.rank_head()  # a clear error for a model that cannot rank, before any work
        template = self._info.metadata.get(RERANK_TEMPLATE_KEY)
        pairs = [rerank_tokens(self._tokenizer, template, query, d) for d in docs]
        for ids in pairs:
            if len(ids) > self.n_batch:
                raise ContextOverflowError(
                    f"a query and document of {len(ids)} tokens exceed the batch size of "
                    f"{self.n_batch}: raise n_batch"
                )
        try:
            scores = [float(ctx.embed(ids, "rank")[0]) for ids in pairs]
        finally:
            self.session.reset()
        return (scores, sum(map(len, pairs))) if return_count else scores

    # ------------------------------------------------------------------ state
    def save_state(self) -> LlamaState:
        """Snapshot of the KV cache, tokens and seed (restore with :meth:`load_state`)."""
        return save_session(self.session, self._seed)

    def load_state(self, state: LlamaState) -> None:
        load_session(self.session, state)
        self._seed = state.seed

    # ------------------------------------------------------------------ misc
    def _print_timings(self) -> None:
        if self.verbose and self._loaded is not None:
            print(self._session.timings.report("llama_perf_context_print"), file=sys.stderr)

    def close(self) -> None:
        """Release the model and context."""
        self._loaded = None

    def __enter__(self) -> Llama:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def logits_to_logprobs(logits: np.ndarray, axis: int = -1) -> np.ndarray:
        return openai.logits_to_logprobs(logits, axis)

    @staticmethod
    def longest_token_prefix(a: Sequence[int], b: Sequence[int]) -> int:
        from .generation import common_prefix

        return common_prefix(a, b)


def _cache_type(t: int | str | None) -> str:
    if t is None:
        return "f16"
    if isinstance(t, str):
        return t
    if t not in _CACHE_TYPES:
        raise UsageError(f"unsupported KV cache type id {t}; supported: {_CACHE_TYPES}")
    return _CACHE_TYPES[t]


def _tool_chunks(chunks: Iterator[dict[str, Any]], plan: Any) -> Iterator[dict[str, Any]]:
    """Chat chunks of a reply that may call tools: content deltas as they are certain,
    then the calls, then the finish reason (``tool_calls`` when there are calls)."""
    stream = ReplyStream(plan)
    for chunk in openai.chat_chunks(chunks):
        choice = chunk["choices"][0]
        delta = choice["delta"]
        if "content" in delta:
            for d in stream.feed(delta["content"]):
                yield {**chunk, "choices": [{**choice, "delta": d}]}
            continue
        if choice["finish_reason"] is not None:
            tail, reply = stream.finish()
            for d in tail:
                yield {**chunk, "choices": [{**choice, "delta": d, "finish_reason": None}]}
            if reply.tool_calls:
                chunk = {**chunk, "choices": [{**choice, "finish_reason": "tool_calls"}]}
        yield chunk
