"""``llamacpy chat``: an interactive conversation with the model's chat template.

Each turn renders the whole conversation with the template; the KV cache keeps the common
prefix, so only the new turn is decoded. Replies stream to stdout. Input: a line; end a
line with ``\\`` to continue on the next one. ``/exit`` (or end of input) quits, ``/clear``
starts over. Ctrl-C during a reply stops the reply, not the program; Ctrl-C at the prompt
quits. Works on a terminal or a pty driven by another program (the prompt is ``"> "``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ..errors import LlamacpyError
from . import add_compat_args, add_warmup_arg
from .run import (
    add_model_args,
    add_sampling_args,
    load,
    output_begins,
    sampler_chain,
    sampling_params,
)

PROMPT = "> "


def read_message(inp: TextIO, out: TextIO) -> str | None:
    """One user message (``\\``-continued lines joined with newlines); None at end of input."""
    out.write(PROMPT)
    out.flush()
    lines: list[str] = []
    while True:
        line = inp.readline()
        if not line:
            return "\n".join(lines) if lines else None
        line = line.rstrip("\r\n")
        if line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


class Chat:
    """The conversation state: messages, a session over the model's context, sampling."""

    def __init__(
        self,
        model: Any,
        params: Any,
        system: str | None = None,
        n_predict: int = -1,
        speculator: Any = None,
    ) -> None:
        from ..api.generation import Session

        self.model = model
        self.tok = model.tokenizer
        self.template = self.tok.chat_template()
        self.params = params
        self.session = Session(model.ctx, self.tok)
        self.session.timings.t_load = model.load_time
        self.system = system
        self.n_predict = n_predict
        self.speculator = speculator
        self.messages: list[dict[str, str]] = []
        self.clear()

    def clear(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []

    def reply(self, user: str, out: TextIO) -> str:
        """Stream the assistant's answer to ``user``; Ctrl-C ends it early."""
        from ..api.generation import GenerationConfig

        self.messages.append({"role": "user", "content": user})
        text = self.template.apply(self.messages)
        tokens = self.tok.encode(text, add_special=True, parse_special=True)
        chain = sampler_chain(self.params, self.tok, self.session.n_ctx)
        config = GenerationConfig(
            max_tokens=self.n_predict,
            stop_at_eog=not self.params.ignore_eos,
            speculator=self.speculator,
        )
        try:
            gen = self.session.generate(tokens, chain, config)
            answer = []
            try:
                for step in gen:
                    if step.text:
                        answer.append(step.text)
                        out.write(step.text)
                        out.flush()
            except KeyboardInterrupt:
                gen.close()
                out.write(" [interrupted]")
        except LlamacpyError:
            self.messages.pop()
            raise
        out.write("\n")
        out.flush()
        reply = "".join(answer)
        self.messages.append({"role": "assistant", "content": reply})
        if gen.stop_cause == "context":
            print("llamacpy: the context is full; /clear to start over", file=sys.stderr)
        return reply


def template_note(tok: Any) -> str | None:
    """What ``chat`` says when the model has no chat template of its own."""
    templates = getattr(tok, "chat_templates", {}) or {}
    if templates.get("", "") not in ("", "chatml"):
        return None
    if templates.get("tool_use"):
        return (
            "llamacpy chat: note: the model has no default chat template; using its 'tool_use' one"
        )
    return ("llamacpy chat: note: the model has no chat template (a base model?); falling back "
            "to ChatML (<|im_start|>role ... <|im_end|>), which it may not know")  # fmt: skip


def _chat(args: argparse.Namespace) -> int:
    from .spec import check_spec_args

    check_spec_args(args)
    model = load(args)
    params = sampling_params(args, model.info.metadata)
    note = template_note(model.tokenizer)
    if note:
        print(note, file=sys.stderr)
    from .spec import speculator

    chat = Chat(model, params, args.system_prompt, args.n_predict, speculator(args, model))
    inp, out = sys.stdin, sys.stdout
    output_begins()
    if inp.isatty():
        print("llamacpy chat: /exit to quit, /clear to start over, end a line with \\ to "
              "continue it, Ctrl-C stops a reply", file=sys.stderr)  # fmt: skip
    while True:
        try:
            msg = read_message(inp, out)
        except KeyboardInterrupt:
            out.write("\n")
            break
        if msg is None or msg.strip() == "/exit":
            break
        if msg.strip() == "/clear":
            chat.clear()
            continue
        if not msg.strip():
            continue
        try:
            chat.reply(msg, out)
        except LlamacpyError as e:
            print(f"\nllamacpy: error: {e}", file=sys.stderr)
    if args.verbose:
        print(chat.session.timings.report(), file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat",
        help="chat with a model (like llama-cli)",
        description="Interactive conversation using the model's chat template.",
    )
    add_model_args(p)
    from .spec import add_spec_args

    add_spec_args(p)
    p.add_argument("-sys", "--system-prompt", default=None, help="system message")
    p.add_argument("-n", "--predict", "--n-predict", dest="n_predict", type=int, default=-1,
                   help="most tokens per reply (default: -1 = until end of turn)")  # fmt: skip
    add_sampling_args(p)
    add_warmup_arg(p)
    add_compat_args(p, warmup=False)
    p.set_defaults(func=_chat)
