"""The HTTP routes (llama-server's paths). Handlers parse, template, tokenize and stream;
the engine thread does all decoding."""

from __future__ import annotations

import asyncio
import base64
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .. import __version__
from ..api import anthropic, infill, openai
from ..api.rerank import parse_rerank_request, rerank_response
from ..api.serving import (
    CompletionOptions,
    Failure,
    Final,
    QueueFullError,
    SchedulerClosedError,
    ServingModel,
)
from ..api.tool_calls import (
    ChatPlan,
    Generic,
    generic_messages,
    parse_tool_choice,
    parse_tools,
    plan_chat,
)
from ..engine.embeddings import POOLING_TYPES
from ..errors import LlamacpyError
from . import accesslog, metrics, slot_files, webui
from .app import ServerState
from .errors import APIError, bad_request
from .responses import MessagesShaper, Shaper, messages_error
from .schemas import CompletionRequest, Fields, check_tokens, parse_completion, parse_json
from .streaming import Channel, ClientGone, EventStream, result_or_disconnect


def _state(request: Request) -> ServerState:
    return request.app.state.server


async def read_body(request: Request) -> bytes:
    limit = _state(request).config.max_body
    chunks, n = [], 0
    try:
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise APIError(413, f"the request body is larger than {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone from None  # gone (or timed out) before its body was read
    return b"".join(chunks)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and
                                           media.endswith("+json"))  # fmt: skip


async def read_json(request: Request) -> dict[str, Any]:
    """The JSON object of the body; 415 unless ``Content-Type`` says JSON (a web page can
    POST text/plain or forms to any address without asking the server first)."""
    if not _is_json(request.headers.get("content-type", "")):
        raise APIError(415, "the request body must be JSON: send 'Content-Type: "
                       "application/json'")  # fmt: skip
    return parse_json(await read_body(request))


# ---------------------------------------------------------------------- simple routes
async def index(request: Request) -> Response:
    return HTMLResponse(webui.PAGE)


async def health(request: Request) -> Response:
    _state(request).ready()
    return JSONResponse({"status": "ok"})


def _model_card(st: ServerState) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    m = st.model
    if m is not None:
        md = m.info.metadata
        arch = m.info.arch
        meta = {"vocab_type": 2 if m.tokenizer.vocab.type == "bpe" else 1,
                "n_vocab": m.n_vocab, "n_ctx_train": int(md.get(f"{arch}.context_length", 0)),
                "n_embd": int(md.get(f"{arch}.embedding_length", 0)),
                "n_params": m.info.n_params, "size": m.info.size}  # fmt: skip
    return {"id": st.model_name, "object": "model", "created": st.t_start,
            "owned_by": "llamacpp", "meta": meta}  # fmt: skip


async def models(request: Request) -> Response:
    st = _state(request)
    st.ready()
    card = _model_card(st)
    caps = ["completion"] if st.model is not None else ["embedding"]
    return JSONResponse({
        "models": [{"name": st.model_name, "model": st.model_name, "type": "model",
                    "capabilities": caps}],
        "object": "list",
        "data": [card],
    })  # fmt: skip


async def model(request: Request) -> Response:
    st = _state(request)
    st.ready()
    if request.path_params["model_id"] != st.model_name:
        raise APIError(404, f"model {request.path_params['model_id']!r} not found")
    return JSONResponse(_model_card(st))


def _settings(m: ServingModel, sp: Any, n_predict: int, stop: list[str], stream: bool) -> dict:
    return {
        "n_predict": n_predict, "seed": sp.seed, "temperature": sp.temp,
        "dynatemp_range": sp.dynatemp_range, "dynatemp_exponent": sp.dynatemp_exponent,
        "top_k": sp.top_k, "top_p": sp.top_p, "min_p": sp.min_p, "top_n_sigma": sp.top_n_sigma,
        "xtc_probability": sp.xtc_probability, "xtc_threshold": sp.xtc_threshold,
        "typical_p": sp.typ_p, "repeat_last_n": sp.penalty_last_n,
        "repeat_penalty": sp.penalty_repeat, "presence_penalty": sp.penalty_present,
        "frequency_penalty": sp.penalty_freq, "dry_multiplier": sp.dry_multiplier,
        "dry_base": sp.dry_base, "dry_allowed_length": sp.dry_allowed_length,
        "dry_penalty_last_n": sp.dry_penalty_last_n, "mirostat": sp.mirostat,
        "mirostat_tau": sp.mirostat_tau, "mirostat_eta": sp.mirostat_eta, "stop": stop,
        "ignore_eos": sp.ignore_eos, "stream": stream, "n_probs": sp.n_probs,
        "min_keep": sp.min_keep, "samplers": list(sp.samplers),
        # a banned token (bias -inf, given as false) is echoed as false: JSON has no -inf
        "logit_bias": [[t, b if math.isfinite(b) else False] for t, b in sp.logit_bias],
    }  # fmt: skip


async def props(request: Request) -> Response:
    st = _state(request)
    m = st.generator()
    tpl = m.template
    return JSONResponse({
        "default_generation_settings": {
            "id": 0, "id_task": -1, "n_ctx": m.n_ctx_slot,
            "speculative": m.scheduler.spec_cost is not None,
            "is_processing": False,
            "params": _settings(m, m.sampling_defaults, st.config.n_predict, [], False),
        },
        "total_slots": m.n_parallel,
        "model_path": str(m.info.path),
        "model_alias": st.model_name,
        "modalities": {"vision": False, "audio": False},
        "chat_template": tpl.source,
        "bos_token": tpl.bos_token,
        "eos_token": tpl.eos_token,
        "build_info": f"llamacpy {__version__}",
    })  # fmt: skip


async def slots(request: Request) -> Response:
    m = _state(request).generator()
    return JSONResponse(m.scheduler.info())


async def slot_action(request: Request) -> Response:
    """``POST /slots/{id}?action=erase|save|restore`` as llama-server: ``erase`` forgets
    the slot's cached prompt once it is idle (``{"id_slot", "n_erased"}``); with
    ``--slot-save-path``, ``save`` writes it to ``{"filename"}`` in that directory and
    ``restore`` reads it back (see :mod:`.slot_files`; 501 without the flag)."""
    st = _state(request)
    m = st.generator()
    try:
        sid = int(request.path_params["id_slot"])
    except ValueError:
        raise bad_request("Invalid slot ID") from None
    action = request.query_params.get("action", "")
    if action not in ("erase", "save", "restore"):
        raise bad_request("Invalid action: 'action' must be erase, save or restore")
    if not 0 <= sid < len(m.scheduler.slots):
        raise bad_request(f"Invalid slot ID {sid} (the server has {len(m.scheduler.slots)} slots)")
    if action == "erase":
        n = await _slot_task(m, sid, m.scheduler.erase_slot)
        return JSONResponse({"id_slot": sid, "n_erased": n})
    if not st.config.slot_save_path:
        raise APIError(501, "This server does not support slots action. Start it with "
                            "`--slot-save-path`")  # fmt: skip
    f = Fields(await read_json(request))
    try:
        filename = slot_files.check_filename(f.raw("filename", None))
    except LlamacpyError as e:
        raise bad_request(str(e)) from None
    path = Path(st.config.slot_save_path) / filename
    fp = await run_in_threadpool(slot_files.fingerprint, m)
    t0 = time.perf_counter()
    if action == "save":
        tokens, state = await _slot_task(m, sid, m.scheduler.save_slot)
        try:
            n_bytes = await run_in_threadpool(slot_files.write, path, fp, tokens, state)
        except OSError as e:
            raise APIError(500, f"could not write slot file {filename!r}: {e.strerror}") from None
        ms = 1000 * (time.perf_counter() - t0)
        return JSONResponse({"id_slot": sid, "filename": filename, "n_saved": len(tokens),
                             "n_written": n_bytes, "timings": {"save_ms": ms}})  # fmt: skip
    try:
        tokens, state, n_bytes = await run_in_threadpool(
            slot_files.read, path, fp, m.ctx.kv.nbytes, m.n_ctx_slot
        )
    except LlamacpyError as e:
        raise bad_request(str(e)) from None
    n = await _slot_task(m, sid, m.scheduler.restore_slot(tokens, state))
    ms = 1000 * (time.perf_counter() - t0)
    return JSONResponse({"id_slot": sid, "filename": filename, "n_restored": n,
                         "n_read": n_bytes, "timings": {"restore_ms": ms}})  # fmt: skip


async def _slot_task(m: Any, sid: int, task: Any) -> Any:
    """Run a slot task on the engine thread once the slot is idle; its error is a 400."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def done(result: Any) -> None:
        loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(result))

    try:
        m.scheduler.slot_task(sid, task, done)
    except LlamacpyError as e:
        raise bad_request(str(e)) from None
    result = await fut
    if isinstance(result, LlamacpyError):
        raise bad_request(str(result))
    if isinstance(result, BaseException):
        raise result
    if isinstance(result, int) and result < 0:
        raise APIError(503, "the server is shutting down")
    return result


async def metrics_route(request: Request) -> Response:
    st = _state(request)
    if not st.config.metrics:
        raise APIError(501, "This server does not support metrics endpoint. Start it with "
                       "`--metrics`")  # fmt: skip
    m = st.generator()
    return PlainTextResponse(metrics.render(m.scheduler, m.ctx, st.model_name),
                             media_type="text/plain; version=0.0.4")  # fmt: skip


async def tokenize(request: Request) -> Response:
    st = _state(request)
    tok = st.tokenizer()
    f = Fields(await read_json(request))
    content = f.raw("content", "")
    add_special = f.bool("add_special", False)
    parse_special = f.bool("parse_special", True)
    with_pieces = f.bool("with_pieces", False)
    if not isinstance(content, str):
        raise bad_request("'content' must be a string")
    ids = await run_in_threadpool(tok.encode, content, add_special, parse_special)
    if not with_pieces:
        return JSONResponse({"tokens": ids})
    out = []
    for t in ids:
        b = tok.token_to_piece(t, True)
        try:
            piece: Any = b.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(b)
        out.append({"id": t, "piece": piece})
    return JSONResponse({"tokens": out})


async def detokenize(request: Request) -> Response:
    tok = _state(request).tokenizer()
    f = Fields(await read_json(request))
    ids = check_tokens(f.list("tokens") or [], tok.n_vocab, "tokens")
    return JSONResponse({"content": tok.decode(ids)})


async def apply_template(request: Request) -> Response:
    m = _state(request).generator()
    data = await read_json(request)
    creq = parse_completion({**data, "max_tokens": None}, "chat", m.n_vocab)
    prompt = await run_in_threadpool(_render, m, creq)
    return JSONResponse({"prompt": prompt})


# ---------------------------------------------------------------------- completions
def _render(m: ServingModel, creq: CompletionRequest, plan: ChatPlan | None = None) -> str:
    messages, tools = creq.messages or [], creq.tools
    if plan is not None and isinstance(plan.fmt, Generic):
        messages, tools = generic_messages(messages, plan.tools), None
    try:
        return m.apply_template(messages, tools, **creq.template_kwargs)
    except (LlamacpyError, ValueError, TypeError, KeyError) as e:
        raise bad_request(f"cannot apply the chat template: {e}") from None


def _chat_plan(m: ServingModel, creq: CompletionRequest, reasoning_format: str) -> ChatPlan:
    """What the request's tools, tool_choice and reasoning_format ask for (400 if wrong)."""
    try:
        tools = parse_tools(creq.tools)
        mode, tools = parse_tool_choice(creq.tool_choice, tools)
    except LlamacpyError as e:
        raise bad_request(str(e)) from None
    tpl = m.template
    parallel = creq.parallel_tool_calls
    if parallel is None:
        parallel = tpl.caps.supports_parallel_tool_calls
    plan = plan_chat(tpl.source, tools, mode, parallel=parallel,
                     reasoning_format=creq.reasoning_format or reasoning_format)  # fmt: skip
    if plan.active and creq.grammar:
        raise bad_request("Cannot use custom grammar constraints with tools.")
    return plan


def _text_bias(m: ServingModel, creq: CompletionRequest) -> None:
    """``logit_bias`` keys given as text: the bias goes to each of their tokens."""
    pairs = creq.sampling.get("logit_bias")
    if pairs and any(isinstance(t, str) for t, _ in pairs):
        creq.sampling["logit_bias"] = tuple(
            (tid, b) for t, b in pairs
            for tid in (m.tokenize(t, add_special=False, parse_special=False)
                        if isinstance(t, str) else [t])
        )  # fmt: skip


def _prepare(
    m: ServingModel, creq: CompletionRequest, plan: ChatPlan | None, prompt: Any = None
) -> tuple[list[int], str]:
    """Prompt tokens (checked) and the prompt text (echo and the native ``prompt`` field)
    of a chat request or of one ``prompt``; for a chat request the plan learns whether the
    prompt opened a reasoning block, and gets its grammar."""
    _text_bias(m, creq)
    if creq.kind == "chat":
        text = _render(m, creq, plan)
        tokens = m.tokenize(text)
        if plan is not None:
            plan.read_prompt(text)
            try:
                plan.build_grammar()
            except LlamacpyError as e:
                raise bad_request(f"cannot build the tools' grammar: {e}") from None
    elif isinstance(prompt, str):
        text = prompt
        tokens = m.tokenize(text)
    else:  # llama-server's mixed prompt: strings are tokenized, ids taken as they are
        tokens = []
        for i, part in enumerate(prompt):
            if isinstance(part, str):
                tokens += m.tokenize(part, add_special=i == 0)
            else:
                tokens.append(part)
        tokens = check_tokens(tokens, m.n_vocab)
        text = m.detokenize(tokens)
    if not tokens:
        raise bad_request("the prompt is empty")
    if len(tokens) >= m.n_ctx_slot:
        raise APIError(
            400, f"the request exceeds the available context size ({len(tokens)} prompt tokens, "
            f"{m.n_ctx_slot} per slot), try increasing it", "exceed_context_size_error",
            n_prompt_tokens=len(tokens), n_ctx=m.n_ctx_slot,
        )  # fmt: skip
    return tokens, text


async def _completion(
    request: Request,
    kind: str,
    data: dict | None = None,
    make_shaper: Any = None,
    stream_cls: type[EventStream] = EventStream,
) -> Response:
    """A completion route's work: parse, template, tokenize, submit, then stream or wait.
    ``make_shaper(kind, model name, chat plan)`` gives another API's response shapes
    (Anthropic, Ollama); ``stream_cls`` its stream framing."""
    st = _state(request)
    m = st.generator()
    if data is None:
        data = await read_json(request)
    creq = parse_completion(data, kind, m.n_vocab)
    if creq.id_slot >= m.n_parallel:
        raise bad_request(f"'id_slot' must be below the number of slots ({m.n_parallel})")
    if creq.n > m.n_parallel:
        raise bad_request(f"'n' ({creq.n}) must be at most the number of slots "
                          f"({m.n_parallel}, the server's -np)")  # fmt: skip
    plan = _chat_plan(m, creq, st.config.reasoning_format) if kind == "chat" else None
    jobs = [await run_in_threadpool(_prepare, m, creq, plan, p)
            for p in (creq.prompts if kind != "chat" else [None])]  # fmt: skip
    try:
        sampling = m.sampling_params({**creq.sampling, "n_probs": creq.n_probs})
        if plan is not None and plan.grammar:
            grammar = await run_in_threadpool(m.tool_grammar, plan)
        else:
            grammar = (
                await run_in_threadpool(m.grammar_matcher, creq.grammar) if creq.grammar else None
            )
    except LlamacpyError as e:
        raise bad_request(str(e)) from None
    n_want = creq.n_predict if creq.n_predict >= 0 else st.config.n_predict
    timeout = min(creq.timeout or st.config.timeout, st.config.timeout)
    preserved = m.preserved_tokens(plan.preserved) if plan is not None else frozenset()
    budget = -1
    if plan is not None and not plan.harmony and plan.think[0] in m.template.source:
        budget = (
            st.config.reasoning_budget if creq.reasoning_budget is None else creq.reasoning_budget
        )
    message = creq.budget_message
    message = st.config.reasoning_budget_message if message is None else message
    options = []
    for k, (tokens, text) in enumerate(jobs):
        room = m.n_ctx_slot - len(tokens)
        n_predict = room if n_want < 0 or n_want > room else n_want  # capped by the context
        options.append(CompletionOptions(
            n_predict=n_predict, stop=tuple(creq.stop), n_probs=creq.n_probs,
            logprobs=creq.logprobs, post_sampling_probs=creq.post_sampling_probs,
            echo_logprobs=creq.echo and creq.logprobs is not None,
            text_offset=len(text) if kind == "completion" else 0,
            cache_prompt=creq.cache_prompt, id_slot=creq.id_slot if k == 0 else -1,
            n_cache_reuse=(st.config.cache_reuse if creq.n_cache_reuse is None
                           else creq.n_cache_reuse),
            timeout=timeout, grammar=grammar if k == 0 or grammar is None else grammar.clone(),
            preserved=preserved, reasoning_budget=budget, budget_message=message,
            think_open=plan is not None and plan.think_open,
            think_tags=plan.think if plan is not None else CompletionOptions.think_tags,
        ))  # fmt: skip
    if make_shaper is not None:
        shaper: Shaper = make_shaper(kind, creq.model or st.model_name, plan)
    else:
        shaper = Shaper(
            kind, creq.model or st.model_name, prompt_texts=[t for _, t in jobs], n=creq.n,
            echo=creq.echo, return_tokens=creq.return_tokens, include_usage=creq.include_usage,
            settings=_settings(m, sampling, options[0].n_predict, creq.stop, creq.stream),
            plan=plan,
        )  # fmt: skip
    shaper.prompt_tokens = jobs[0][0]
    channel = Channel(chunks=creq.stream)
    reqs: list[Any] = []

    def abort() -> None:
        for r in reqs:
            m.abort(r)

    try:
        for k, ((tokens, _), opts) in enumerate(zip(jobs, options)):
            reqs.append(m.submit(tokens, sampling, opts, channel.emit, n=creq.n, index=k * creq.n))
    except QueueFullError as e:
        abort()
        raise APIError(429, f"the server is busy: {e}; retry later",
                       headers={"Retry-After": "1"}) from None  # fmt: skip
    except SchedulerClosedError as e:
        abort()
        raise APIError(503, str(e)) from None
    except LlamacpyError as e:
        abort()
        raise bad_request(str(e)) from None

    total = shaper.count
    if creq.stream:
        return stream_cls(_stream(channel, shaper, abort, request.scope, total),
                          on_disconnect=abort)  # fmt: skip
    finals = await result_or_disconnect(channel, request.receive, abort, total)  # or ClientGone
    failed = next((ev for ev in finals if isinstance(ev, Failure)), None)
    if failed is not None:
        abort()
        raise _failure(failed)
    accesslog.note(request.scope, prompt_tokens=sum(f.n_prompt for f in finals),
                   predicted_tokens=sum(f.n_predicted for f in finals))  # fmt: skip
    return JSONResponse(shaper.result(finals))


def _failure(ev: Failure) -> APIError:
    status = {"shutdown": 503, "aborted": 503}.get(ev.kind, 500)
    return APIError(status, ev.message)


async def _stream(
    channel: Channel, shaper: Shaper, abort: Any, scope: Any, total: int = 1
) -> AsyncIterator[bytes]:
    finished = False
    finals: list[Final] = []
    try:
        for b in shaper.first():
            yield b
        while True:
            ev = await channel.get()
            if isinstance(ev, Final):
                finals.append(ev)
                for b in shaper.done(ev):
                    yield b
                if len(finals) < total:
                    continue
                finished = True
                accesslog.note(scope, prompt_tokens=sum(f.n_prompt for f in finals),
                               predicted_tokens=sum(f.n_predicted for f in finals))  # fmt: skip
                for b in shaper.end(finals):
                    yield b
                return
            if isinstance(ev, Failure):
                yield shaper.error(_failure(ev))
                return  # the others are aborted below
            for b in shaper.chunk(ev):
                yield b
    finally:
        if not finished:
            abort()


async def completion(request: Request) -> Response:
    return await _completion(request, "native")


async def infill_route(request: Request) -> Response:
    """``POST /infill``: llama-server's fill-in-the-middle (``input_prefix``,
    ``input_suffix``, ``input_extra`` files, ``prompt``; see :mod:`llamacpy.api.infill`),
    then a native completion of that prompt."""
    st = _state(request)
    m = st.generator()
    missing = infill.missing_fim_tokens(m.tokenizer)
    if missing:
        raise bad_request("Infill is not supported by this model: its vocabulary has no FIM "
                          f"{', '.join(missing)} token")  # fmt: skip
    data = await read_json(request)
    for key in ("input_prefix", "input_suffix"):
        if key not in data:
            raise bad_request(f'"{key}" is required')
    prompt = data.get("prompt", "")
    if not isinstance(prompt, str):
        raise bad_request('"prompt" must be a string')

    def assemble() -> list[int]:
        tok = m.tokenizer
        extra = infill.check_extra(data.get("input_extra"))
        prefix = infill.mixed_tokens(tok, data["input_prefix"], "input_prefix", m.n_vocab)
        suffix = infill.mixed_tokens(tok, data["input_suffix"], "input_suffix", m.n_vocab)
        return infill.infill_tokens(
            tok, prefix, suffix, extra, m.tokenize(prompt, add_special=False),
            n_batch=m.ctx.params.n_batch, n_predict=st.config.n_predict, n_ctx=m.n_ctx_slot,
            spm=st.config.spm_infill,
        )  # fmt: skip

    try:
        tokens = await run_in_threadpool(assemble)
    except LlamacpyError as e:
        raise bad_request(str(e)) from None
    body = {k: v for k, v in data.items() if k not in ("input_prefix", "input_suffix",
                                                        "input_extra")}  # fmt: skip
    body["prompt"] = tokens
    return await _completion(request, "native", body)


# ---------------------------------------------------------------------- Anthropic Messages
_MESSAGES_ERRORS = {413: "request_too_large", 500: "api_error", 503: "overloaded_error"}


def _messages_error(e: APIError) -> Response:
    kind = _MESSAGES_ERRORS.get(e.status, e.type)
    return JSONResponse(messages_error(kind, e.message), status_code=e.status,
                        headers=e.headers)  # fmt: skip


async def _messages_body(request: Request, require_max_tokens: bool) -> dict[str, Any]:
    try:
        return anthropic.chat_request(await read_json(request),
                                      require_max_tokens=require_max_tokens)  # fmt: skip
    except LlamacpyError as e:
        raise bad_request(str(e)) from None


async def messages(request: Request) -> Response:
    """``POST /v1/messages``: Anthropic's Messages API on the chat engine (see
    :mod:`llamacpy.api.anthropic`); errors in Anthropic's shape."""
    try:
        return await _completion(request, "chat", await _messages_body(request, True),
                                 lambda kind, model, plan: MessagesShaper(model, plan=plan))  # fmt: skip
    except APIError as e:
        return _messages_error(e)


async def count_tokens(request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: the prompt's tokens, template and tools included."""
    try:
        st = _state(request)
        m = st.generator()
        body = await _messages_body(request, False)
        creq = parse_completion(body, "chat", m.n_vocab)
        plan = _chat_plan(m, creq, st.config.reasoning_format)
        text = await run_in_threadpool(_render, m, creq, plan)
        n = len(await run_in_threadpool(m.tokenize, text))
    except APIError as e:
        return _messages_error(e)
    return JSONResponse({"input_tokens": n})


async def v1_completions(request: Request) -> Response:
    return await _completion(request, "completion")


async def chat_completions(request: Request) -> Response:
    return await _completion(request, "chat")


# ---------------------------------------------------------------------- embeddings
def _embed_input(data: dict[str, Any], key: str) -> list[str]:
    v = data.get(key)
    if v is None and key == "content":
        v = data.get("input")
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not items or not all(isinstance(s, str) for s in items):
        raise bad_request(f"'{key}' must be a non-empty string or array of strings")
    if len(items) > 256:
        raise bad_request("at most 256 inputs per request")
    return items


async def _embed(request: Request, oai: bool) -> Response:
    """``/v1/embeddings`` (OpenAI: pooled vectors, L2-normalized as llama-server, ``float``
    or ``base64``) and ``/embedding`` (native: ``embd_normalize``, per-token vectors when the
    pooling is ``none``), computed by :meth:`llamacpy.api.Llama.embed`."""
    st = _state(request)
    data = await read_json(request)
    f = Fields(data)
    items = _embed_input(data, "input" if oai else "content")
    fmt = f.str("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise bad_request("'encoding_format' must be 'float' or 'base64'")
    norm = 2 if oai else f.int("embd_normalize", 2, -1, 1000)
    embeds, n_tokens = await _embed_items(st, items, norm)
    per_token = bool(embeds) and bool(embeds[0]) and isinstance(embeds[0][0], list)
    if not oai:
        return JSONResponse([{"index": i, "embedding": e if per_token else [e]}
                             for i, e in enumerate(embeds)])  # fmt: skip
    if per_token:
        raise bad_request("Pooling type 'none' is not OAI compatible. Please use a different "
                          "pooling type")  # fmt: skip
    if fmt == "base64":
        embeds = [base64.b64encode(np.asarray(e, "<f4").tobytes()).decode() for e in embeds]
    return JSONResponse(openai.embedding_response(embeds, st.model_name, n_tokens))


async def _embed_items(st: ServerState, items: list[Any], normalize: int) -> tuple[list, int]:
    """Vectors of ``items`` (strings; or token ids) and their token count (501 without
    ``--embedding``, 400 for bad input)."""
    st.ready()
    if st.embedder is None:
        raise APIError(501, "This server does not support embeddings. Start it with "
                       "`--embedding`")  # fmt: skip

    def run() -> Any:
        with st.embed_lock:
            return st.embedder.embed(items, normalize=normalize, return_count=True)

    try:
        return await run_in_threadpool(run)
    except NotImplementedError as e:
        raise APIError(501, str(e)) from None
    except (LlamacpyError, ValueError) as e:
        raise bad_request(str(e)) from None


async def embedding(request: Request) -> Response:
    return await _embed(request, False)


async def v1_embeddings(request: Request) -> Response:
    return await _embed(request, True)


# ---------------------------------------------------------------------- reranking
async def rerank(request: Request) -> Response:
    """``/rerank`` (also ``/reranking``, ``/v1/rerank``, ``/v1/reranking``) as llama-server:
    scores of ``documents`` (or TEI's ``texts``) for ``query`` by :meth:`llamacpy.api.Llama.
    rerank`, in the response shapes of :mod:`llamacpy.api.rerank`."""
    st = _state(request)
    st.ready()
    if st.embedder is None or st.embedder.pooling_type() != POOLING_TYPES["rank"]:
        raise APIError(501, "This server does not support reranking. Start it with "
                       "`--reranking`")  # fmt: skip
    data = await read_json(request)
    try:
        query, docs, top_n, tei, ret = parse_rerank_request(data)
    except LlamacpyError as e:
        raise bad_request(str(e)) from None
    if len(docs) > 1024:
        raise bad_request("at most 1024 documents per request")

    def run() -> Any:
        with st.embed_lock:
            return st.embedder.rerank(query, docs, return_count=True)

    try:
        scores, n_tokens = await run_in_threadpool(run)
    except (LlamacpyError, ValueError) as e:
        raise bad_request(str(e)) from None
    name = data.get("model") if isinstance(data.get("model"), str) else st.model_name
    return JSONResponse(rerank_response(name, scores, [n_tokens], docs, top_n, tei, ret))


ROUTES = [
    Route("/", index, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/v1/health", health, methods=["GET"]),
    Route("/models", models, methods=["GET"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/models/{model_id:path}", model, methods=["GET"]),
    Route("/props", props, methods=["GET"]),
    Route("/slots", slots, methods=["GET"]),
    Route("/slots/{id_slot}", slot_action, methods=["POST"]),
    Route("/metrics", metrics_route, methods=["GET"]),
    Route("/completion", completion, methods=["POST"]),
    Route("/completions", completion, methods=["POST"]),
    Route("/infill", infill_route, methods=["POST"]),
    Route("/v1/completions", v1_completions, methods=["POST"]),
    Route("/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/apply-template", apply_template, methods=["POST"]),
    Route("/embedding", embedding, methods=["POST"]),
    Route("/embeddings", embedding, methods=["POST"]),
    Route("/v1/embeddings", v1_embeddings, methods=["POST"]),
    Route("/rerank", rerank, methods=["POST"]),
    Route("/reranking", rerank, methods=["POST"]),
    Route("/v1/rerank", rerank, methods=["POST"]),
    Route("/v1/reranking", rerank, methods=["POST"]),
]
