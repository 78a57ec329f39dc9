"""Serving a model to many clients at once: the per-request side of the engine scheduler.

:class:`ServingModel` loads a model with ``n_parallel`` KV sequences, runs the
continuous-batching :class:`~llamacpy.engine.scheduler.Scheduler` on its engine thread and
turns a request (prompt tokens, :class:`~llamacpy.sampling.SamplingParams`,
:class:`CompletionOptions`) into a :class:`CompletionHandler`: the scheduler hands it one
logits row per step; it samples (llama.cpp's chain), detokenizes, holds back text that may
start a stop string (the same :class:`~.generation.StopMatcher` as the ``Llama`` facade),
computes log-probabilities, and reports :class:`Chunk` events and exactly one final
:class:`Final` or :class:`Failure` through the ``emit`` callback it was given (called on
the engine thread: it must not block).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..engine import ContextParams
from ..engine.scheduler import QueueFullError, Request, Scheduler, SchedulerClosedError
from ..errors import UsageError
from ..sampling import (
    CommonSampler,
    SamplingParams,
    apply_model_defaults,
    build_sampler_chain,
    dry_sequence_breakers,
    token_probabilities,
)
from . import openai
from .generation import StopMatcher, Utf8Text
from .model import LoadedModel, load_model

__all__ = [
    "Chunk",
    "CompletionHandler",
    "CompletionOptions",
    "Failure",
    "Final",
    "QueueFullError",
    "SchedulerClosedError",
    "ServingModel",
]


@dataclass(frozen=True)
class CompletionOptions:
    """Per-request settings besides sampling.

    ``n_predict < 0``: until an end-of-generation token or a full slot. ``logprobs``:
    ``"native"`` (llama-server's ``completion_probabilities``, ``n_probs`` alternatives,
    post-sampling probabilities with ``post_sampling_probs``) or ``"openai"`` (OpenAI's
    ``logprobs`` block; ``echo_logprobs`` adds the prompt tokens). ``timeout``: seconds
    after which the generation stops with ``length``. ``grammar``: output constrained as
    llama-server's common sampler does it (check the chosen token, mask only on a rejection).
    """

    n_predict: int = -1
    stop: tuple[str, ...] = ()
    n_probs: int = 0
    logprobs: str | None = None
    post_sampling_probs: bool = False
    echo_logprobs: bool = False
    text_offset: int = 0  # characters before the completion (OpenAI text_offset)
    cache_prompt: bool = True
    n_cache_reuse: int = 0  # see engine.scheduler.Request
    id_slot: int = -1
    timeout: float | None = None
    grammar: Any = None  # a fresh GrammarMatcher (see ServingModel.grammar_matcher)
    preserved: frozenset[int] = frozenset()  # special tokens whose text the reply keeps
    # a reasoning block (think_tags; open from the start with think_open) gets at most
    # reasoning_budget tokens (-1: no limit); then budget_message and the end tag are forced
    reasoning_budget: int = -1
    think_open: bool = False
    think_tags: tuple[str, str] = ("<think>", "</think>")
    budget_message: str = ""


@dataclass
class Chunk:
    """Text released by the latest token(s); ``probs`` is one logprob record per token."""

    text: str
    tokens: list[int]
    probs: list[Any] = field(default_factory=list)
    id_slot: int = -1
    n_prompt: int = 0  # the prompt's tokens (llama-server's tokens_evaluated)
    index: int = 0  # which completion of the request (n > 1, several prompts)


@dataclass
class Final:
    """The end of a completion."""

    finish_reason: str  # "stop" | "length"
    stop_type: str  # llama-server: "eos" | "word" | "limit"
    stopping_word: str
    text: str
    tokens: list[int]
    n_prompt: int
    n_cached: int
    n_predicted: int
    timings: dict[str, float]
    id_slot: int
    probs: list[Any] = field(default_factory=list)
    prompt_logprobs: dict[str, Any] | None = None  # OpenAI block of the echoed prompt
    index: int = 0  # which completion of the request (n > 1, several prompts)


@dataclass
class Failure:
    """A request ended without a result: ``kind`` is ``aborted``, ``shutdown`` or ``error``."""

    kind: str
    message: str
    index: int = 0  # which completion of the request (n > 1, several prompts)


def _piece_text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


class CompletionHandler:
    """One request's sampling, text and stop logic (a ``SeqHandler`` of the scheduler)."""

    def __init__(
        self,
        model: ServingModel,
        prompt: list[int],
        sampling: SamplingParams,
        opts: CompletionOptions,
        emit: Callable[[Any], None],
    ) -> None:
        self.model = model
        self.tok = model.tokenizer
        self.prompt = prompt
        self.opts = opts
        self.emit = emit
        self.chain = model.sampler_chain(sampling)
        if opts.grammar is not None:
            self.chain = CommonSampler(self.chain, opts.grammar)
        for t in prompt:  # llama-server feeds the prompt to the penalties (and DRY)
            self.chain.accept(t)
        self.ignore_eos = sampling.ignore_eos
        self.utf8 = Utf8Text()
        self.stops = StopMatcher(opts.stop)
        self.tokens: list[int] = []
        self.text = ""
        self.probs: list[Any] = []
        self.prompt_rows: list[np.ndarray] = []
        self.done = False
        self.request: Request | None = None
        # reasoning budget: "idle" (no block yet), "open" (counting), "done"
        self.think = "open" if opts.think_open else "idle"
        self.n_think = 0
        self.forced: list[int] = []

    # ------------------------------------------------------------------ SeqHandler
    def on_prompt_logits(self, pos0: int, rows: np.ndarray) -> None:
        if self.opts.echo_logprobs:
            self.prompt_rows.append(np.array(rows, np.float32))

    def on_logits(self, row: np.ndarray) -> int | None:
        opts = self.opts
        if self.tokens and 0 <= opts.n_predict <= len(self.tokens):
            return self._final("length", "limit")  # n_predict 0 gives one token (llama-server)
        token = self._forced() if self.forced else None
        if token is None:
            token = self.chain.sample(row)
        if not self.ignore_eos and self.tok.is_eog(token):
            return self._final("stop", "eos")
        self.tokens.append(token)
        piece = self.tok.token_to_piece(token, token in opts.preserved)
        record = self._logprobs(token, piece, row) if opts.logprobs else None
        if record is not None:
            self.probs.append(record)
        text = self.stops.feed(self.utf8.feed(piece))
        self.text += text
        if text or record is not None:
            self._chunk(text, [token], [record] if record is not None else [])
        if self.stops.matched is not None:
            return self._final("stop", "word")
        if 0 <= opts.n_predict <= len(self.tokens):
            return self._final("length", "limit")
        if opts.reasoning_budget >= 0 and self.think != "done":
            self._budget()
        return token

    def _budget(self) -> None:
        """Count the tokens of the reply's reasoning block; at the budget, queue the forced
        end (the budget message, then a new line and the end tag)."""
        start, end = self.opts.think_tags
        if self.think == "idle":
            head = self.text.lstrip()
            if head.startswith(start):
                self.think = "open"
            elif head and not start.startswith(head):
                self.think = "done"
                return
            else:
                return
        if end in self.text:
            self.think = "done"
            return
        self.n_think += 1
        if self.utf8.pending:
            return  # never cut a character in two: wait for its last byte
        if self.n_think >= self.opts.reasoning_budget and not self.forced:
            forced = self.opts.budget_message + "\n" + end
            self.forced = self.tok.encode(forced, add_special=False, parse_special=True)
            self.think = "done"

    def _forced(self) -> int | None:
        """The next token of a forced reasoning end, through the grammar and penalties
        (None: the request's grammar does not allow it, so the forcing stops)."""
        token = self.forced.pop(0)
        grammar = getattr(self.chain, "grammar", None)
        if grammar is not None and not grammar.allows(token):
            self.forced.clear()
            return None
        getattr(self.chain, "accept_generated", self.chain.accept)(token)
        return token

    def on_end(self, reason: str, message: str = "") -> None:
        if self.done:
            return
        if reason in ("context", "timeout"):
            self._final("length", "limit")
        else:
            self.done = True
            text = {"aborted": "the request was cancelled",
                    "shutdown": "the server is shutting down"}.get(reason, message)  # fmt: skip
            self.emit(Failure(reason, text))
            self.request = None

    # ------------------------------------------------------------------ results
    def _chunk(self, text: str, tokens: list[int], probs: list[Any]) -> None:
        slot = self.request.slot if self.request is not None else -1
        self.emit(Chunk(text, tokens, probs, slot, len(self.prompt)))

    def _final(self, finish_reason: str, stop_type: str) -> None:
        if stop_type != "word":
            tail = self.stops.feed(self.utf8.flush()) + self.stops.flush()
            if tail:
                self.text += tail
                self._chunk(tail, [], [])
        self.done = True
        r = self.request
        now = time.monotonic()
        n_cached = r.n_cached if r else 0
        t_start = r.t_start if r else now
        t_prompt = r.t_prompt if r and r.t_prompt else now
        n_pred = len(self.tokens) + (stop_type == "eos")
        prompt_n = len(self.prompt) - n_cached
        prompt_ms = 1e3 * (t_prompt - t_start)
        predicted_ms = 1e3 * (now - t_prompt)
        timings = {
            "cache_n": n_cached,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": n_pred,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_pred if n_pred else 0.0,
            "predicted_per_second": 1e3 * n_pred / predicted_ms if predicted_ms > 0 else 0.0,
        }
        if r is not None and r.n_drafted:  # speculative decoding (llama-server's names)
            timings["draft_n"] = r.n_drafted
            timings["draft_n_accepted"] = r.n_accepted
        self.emit(
            Final(
                finish_reason=finish_reason,
                stop_type=stop_type,
                stopping_word=self.stops.matched or "",
                text=self.text,
                tokens=list(self.tokens),
                n_prompt=len(self.prompt),
                n_cached=n_cached,
                n_predicted=n_pred,
                timings=timings,
                id_slot=r.slot if r else -1,
                probs=self.probs,
                prompt_logprobs=self._prompt_logprobs(),
            )
        )
        self.request = None  # break the request <-> handler cycle: freed without the gc
        return None

    def _logprobs(self, token: int, piece: bytes, row: np.ndarray) -> Any:
        opts, tok = self.opts, self.tok
        if opts.logprobs == "openai":
            offset = opts.text_offset + len(self.text)
            return openai.completion_logprobs([token], row[None], opts.n_probs,
                                              self._piece, text_offset=offset)  # fmt: skip

        def entry(tid: int, key: str, value: float) -> dict[str, Any]:
            b = tok.token_to_piece(tid, False)
            return {"id": tid, "token": _piece_text(b), "bytes": list(b), key: value}

        if opts.post_sampling_probs:
            top = self.chain.probs(opts.n_probs)
            cur = self.chain.cur
            p = 0.0
            if cur is not None:
                hit = np.nonzero(cur.id[: cur.size] == token)[0]
                p = float(cur.p[hit[0]]) if hit.size else 0.0
            out = entry(token, "prob", p)
            out["top_probs"] = [entry(t.token, "prob", t.p) for t in top]
            return out
        m = float(np.max(row))
        lse = m + math.log(float(np.sum(np.exp(row - m, dtype=np.float64))))
        out = entry(token, "logprob", float(row[token]) - lse)
        out["top_logprobs"] = [
            entry(t.token, "logprob", t.logprob) for t in token_probabilities(row, opts.n_probs)
        ]
        return out

    def _piece(self, tid: int) -> bytes:
        return self.tok.token_to_piece(int(tid), False)

    def _prompt_logprobs(self) -> dict[str, Any] | None:
        """OpenAI logprobs of the echoed prompt (row i predicts token i + 1; the first echoed
        token has none, and a BOS token is not echoed), as ``Llama`` reports them."""
        if not self.opts.echo_logprobs or not self.prompt_rows:
            return None
        rows = np.concatenate(self.prompt_rows)
        bos = self.tok.bos
        start = 1 if self.prompt[0] == bos else 0
        tokens = self.prompt[start:]
        pred = rows[max(start - 1, 0) : len(self.prompt) - 1]
        if start == 0:
            pred = np.concatenate([rows[:1], pred])
        return openai.completion_logprobs(tokens, pred, self.opts.n_probs, self._piece,
                                          skip_token=bos, first_is_none=True)  # fmt: skip


class ServingModel:
    """A model served to parallel requests (see the module docstring).

    ``sampling_defaults`` are the server's defaults (command-line flags); the model's
    ``general.sampling.*`` metadata fill the fields they leave unset, as in llama.cpp.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        n_parallel: int = 1,
        max_queue: int = 64,
        chat_template: str | None = None,
        sampling_defaults: SamplingParams | None = None,
        speculator: Any = None,
    ) -> None:
        self.loaded = loaded
        self.info = loaded.info
        self.tokenizer = loaded.tokenizer
        self.ctx = loaded.ctx
        self.n_parallel = n_parallel
        self.scheduler = Scheduler(self.ctx, n_parallel, max_queue=max_queue, speculator=speculator)
        self.n_ctx_slot = self.scheduler.n_ctx_slot
        self.sampling_defaults = apply_model_defaults(
            sampling_defaults or SamplingParams(), self.info.metadata
        )
        self.template = self._template(chat_template)
        self._breakers: dict[tuple[str, ...], Any] = {}

    @classmethod
    def load(
        cls,
        model_path: str,
        params: ContextParams,
        *,
        n_parallel: int = 1,
        **kwargs: Any,
    ) -> ServingModel:
        """Load ``model_path`` with a context of ``params`` (``n_seq_max`` = ``n_parallel``)."""
        if n_parallel < 1:
            raise UsageError(f"the number of parallel slots must be >= 1, not {n_parallel}")
        if params.n_seq_max < n_parallel:
            params = dataclasses.replace(params, n_seq_max=n_parallel)
        return cls(load_model(model_path, params), n_parallel=n_parallel, **kwargs)

    # ------------------------------------------------------------------ model facts
    @property
    def n_vocab(self) -> int:
        return int(self.tokenizer.n_vocab)

    @property
    def n_ctx(self) -> int:
        return int(self.ctx.n_ctx)

    def _template(self, spec: str | None) -> Any:
        tok = self.tokenizer
        default = tok.chat_template()
        if not spec:
            return default
        if spec in tok.chat_templates and spec:
            return tok.chat_template(spec)
        from ..tokenizer import ChatTemplate

        if spec == "chatml" or "{{" in spec or "{%" in spec:
            return ChatTemplate(spec, default.bos_token, default.eos_token,
                                add_bos=default.add_bos, add_eos=default.add_eos)  # fmt: skip
        raise UsageError(
            f"unknown chat template {spec!r}: give 'chatml', the name of a template stored in "
            "the model, or a Jinja template"
        )

    def apply_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt llama-server builds for a chat request (``--jinja``)."""
        return self.template.apply(list(messages), tools=tools, **kwargs)

    def tokenize(self, text: str | bytes, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:  # fmt: skip
        return self.tokenizer.encode(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode([int(t) for t in tokens])

    # ------------------------------------------------------------------ sampling
    def sampling_params(self, overrides: Mapping[str, Any]) -> SamplingParams:
        """The server defaults with a request's fields (``SamplingParams`` names)."""
        return self.sampling_defaults.replace(**dict(overrides))

    def sampler_chain(self, params: SamplingParams) -> Any:
        tok = self.tokenizer
        breakers = None
        if params.dry_multiplier != 0.0 and params.dry_sequence_breakers:
            key = params.dry_sequence_breakers
            if key not in self._breakers:
                self._breakers[key] = dry_sequence_breakers(
                    key, tok.n_vocab, lambda t: tok.token_to_piece(t, special=True),
                    lambda b: tok.encode(b, add_special=False, parse_special=False),
                )  # fmt: skip
            breakers = self._breakers[key]
        return build_sampler_chain(params, tok.n_vocab, n_ctx=self.n_ctx_slot,
                                   dry_seq_breakers=breakers, eog_tokens=tok.eog)  # fmt: skip

    def tool_grammar(self, plan: Any) -> Any:
        """The matcher of a chat plan's tool-call grammar, behind its triggers when lazy."""
        matcher = self.grammar_matcher(plan.grammar)
        if not plan.lazy:
            return matcher
        from ..grammar.lazy import LazyGrammar

        return LazyGrammar(matcher, words=plan.trigger_words, patterns=plan.trigger_patterns)

    def preserved_tokens(self, texts: Sequence[str]) -> frozenset[int]:
        """Ids of the texts that are one special token each (their text stays in replies)."""
        out = set()
        for t in texts:
            ids = self.tokenizer.encode(t, add_special=False, parse_special=True)
            if len(ids) == 1:
                out.add(ids[0])
        return frozenset(out)

    def grammar_matcher(self, text: str) -> Any:
        """A matcher for a request's GBNF (:class:`~llamacpy.grammar.GrammarError` if it
        does not parse against this vocabulary); the first call builds the vocabulary's
        trie (0.3-2 s), so call it off the event loop."""
        from .grammar import grammar_matcher

        return grammar_matcher(text, self.tokenizer)

    # ------------------------------------------------------------------ requests
    def submit(
        self,
        prompt: list[int],
        sampling: SamplingParams,
        opts: CompletionOptions,
        emit: Callable[[Any], None],
        *,
        n: int = 1,
        index: int = 0,
    ) -> Request:
        """Queue ``n`` completions of ``prompt`` (numbered ``index..index+n-1`` in their
        events, which go to ``emit``); the prompt is decoded once and its cache copied to
        the others. Raises :class:`QueueFullError` when the queue is full,
        :class:`SchedulerClosedError` when shutting down."""
        reqs = []
        for i in range(n):
            o = opts
            if i and opts.grammar is not None:
                o = dataclasses.replace(opts, grammar=opts.grammar.clone())

            def tagged(ev: Any, k: int = index + i) -> None:
                ev.index = k
                emit(ev)

            handler = CompletionHandler(self, prompt, sampling, o, tagged)
            req = Request(
                prompt=prompt,
                handler=handler,
                cache_prompt=opts.cache_prompt,
                n_cache_reuse=opts.n_cache_reuse,
                prompt_logits=opts.echo_logprobs,
                id_slot=opts.id_slot if i == 0 else -1,
                deadline=None if opts.timeout is None else time.monotonic() + opts.timeout,
            )
            handler.request = req
            reqs.append(req)
        reqs[0].followers = reqs[1:]
        return self.scheduler.submit(reqs[0])

    def abort(self, req: Request) -> None:
        for r in (req, *req.followers):
            self.scheduler.abort(r)

    def start(self) -> ServingModel:
        self.scheduler.start()
        return self

    def stop(self, timeout: float = 0.0) -> None:
        self.scheduler.stop(timeout)
