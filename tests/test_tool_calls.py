"""Tool calls and reasoning in chat replies (llamacpy.api.tool_calls) and lazy grammars
(llamacpy.grammar.lazy): the format each of llama.cpp's templates gets, the grammar of
each format accepting its calls and refusing wrong ones, replies parsed into content,
reasoning and calls, the streamed deltas adding up to the parsed reply however the text is
cut, and a lazy grammar that constrains only after its trigger."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from llama_cpp_testdata import llama_cpp_testdata  # noqa: F401  (fixture)
from llamacpy.api.tool_calls import (
    Generic,
    ReplyStream,
    detect_format,
    generic_messages,
    parse_reply,
    parse_tool_choice,
    parse_tools,
    plan_chat,
)
from llamacpy.errors import UsageError
from llamacpy.grammar import GrammarError, GrammarMatcher, GrammarVocab
from llamacpy.grammar.lazy import LazyGrammar
from llamacpy.tokenizer.chat import ChatTemplate

TOOLS = parse_tools([
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
])  # fmt: skip

# the format llama.cpp's handler for each template writes calls in
EXPECTED = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes",
    "Qwen-Qwen3-0.6B.jinja": "hermes",
    "Qwen-QwQ-32B.jinja": "hermes",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "Qwen3-Coder.jinja": "qwen3-coder",
    "Qwen3.5-4B.jinja": "qwen3-coder",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3-coder",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "openai-gpt-oss-120b.jinja": "harmony",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek-r1",
    "llama-cpp-deepseek-r1.jinja": "deepseek-r1",
    "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek-v3.1",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "ibm-granite-granite-4.0.jinja": "hermes",
    "GLM-4.6.jinja": "glm",
    "inclusionai-ling-3.0-flash.jinja": "glm",
    "Spark2.5.jinja": "glm",
    "meetkai-functionary-medium-v3.1.jinja": "functionary-v3.1",
    "meetkai-functionary-medium-v3.2.jinja": "functionary-v3.2",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command-r7b",
    "Cohere2MoE.jinja": "cohere2moe",
    "Kimi-K2-Instruct.jinja": "kimi-k2",
    "MiniMax-M2.jinja": "minimax-m2",
    "Kimi-K2-Thinking.jinja": "kimi-k2",
    "moonshotai-Kimi-K2.jinja": "kimi-k2",
    "ByteDance-Seed-OSS.jinja": "generic",
    "MiniMax-M3.jinja": "generic",
    "google-gemma-2-2b-it.jinja": "generic",
    "microsoft-Phi-3.5-mini-instruct.jinja": "generic",
}

# a canonical reply of each format calling get_weather(city=Paris) and add(a=2, b=3)
CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
              "</tool_call>",
    "qwen3-coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                   "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
                   "<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
                   "</function>\n</tool_call>",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, '
               '"id": "abcDEF123"}, {"name": "add", "arguments": {"a": 2, "b": 3}, '
               '"id": "xyz789XYZ"}]',
    "generic": '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
               '{"name": "add", "arguments": {"a": 2, "b": 3}}]}',
    "deepseek-r1": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                   '```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function'
                   '<｜tool▁sep｜>add\n```json\n{"a": 2, "b": 3}\n```<｜tool▁call▁end｜>'
                   "<｜tool▁calls▁end｜>",
    "deepseek-v3.1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": '
                     '"Paris"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 2, "b": 3}'
                     "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "granite": '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
               '{"name": "add", "arguments": {"a": 2, "b": 3}}]',
    "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
           "</tool_call>\n<tool_call>add<arg_key>a</arg_key><arg_value>2</arg_value>"
           "<arg_key>b</arg_key><arg_value>3</arg_value></tool_call>",
    "functionary-v3.1": '<function=get_weather>{"city": "Paris"}</function>'
                        '<function=add>{"a": 2, "b": 3}</function>',
    "functionary-v3.2": 'get_weather\n{"city": "Paris"}>>>add\n{"a": 2, "b": 3}',
    "command-r7b": '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
                   '"parameters": {"city": "Paris"}},\n    {"tool_call_id": "1", "tool_name": '
                   '"add", "parameters": {"a": 2, "b": 3}}\n]<|END_ACTION|>',
    "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>'
               'functions.add:1<|tool_call_argument_begin|>{"a": 2, "b": 3}<|tool_call_end|>'
               "<|tool_calls_section_end|>",
    "minimax-m2": '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris'
                  '</parameter>\n</invoke>\n<invoke name="add">\n<parameter name="a">2</parameter>'
                  '\n<parameter name="b">3</parameter>\n</invoke>\n</minimax:tool_call>',
}  # fmt: skip
WANT = [("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3})]
SOURCES = {"hermes": "<tool_call>", "qwen3-coder": "<tool_call><function=<parameter=",
           "mistral": "[TOOL_CALLS]", "llama3": "<|start_header_id|>ipython",
           "generic": "", "harmony": "<|channel|>",
           "deepseek-r1": "<｜tool▁calls▁begin｜>```json", "deepseek-v3.1": "<｜tool▁calls▁begin｜>",
           "granite": "<|tool_call|>", "glm": "<tool_call><arg_key>",
           "functionary-v3.1": "<function=</function>",
           "functionary-v3.2": ">>>all >>>${recipient}",
           "command-r7b": "<|START_ACTION|> <|START_THINKING|>",
           "kimi-k2": "<|tool_calls_section_begin|><|tool_call_begin|>",
           "minimax-m2": '<minimax:tool_call><invoke name="'}  # fmt: skip
PROMPT_END = {"functionary-v3.2": "<|start_header_id|>assistant<|end_header_id|>\n\n>>>"}


def byte_vocab() -> GrammarVocab:
    """Single-character tokens (printable ASCII, newline, tab) and an end token."""
    pieces = [chr(c).encode() for c in range(32, 127)] + [b"\n", b"\t", b"</s>"]
    return GrammarVocab(pieces, eog=[len(pieces) - 1])


VOCAB = byte_vocab()


def plan_for(fmt: str, mode: str = "required", parallel: bool = True, think: bool = False):
    plan = plan_chat(SOURCES[fmt], TOOLS, mode, parallel=parallel)
    plan.read_prompt(PROMPT_END.get(fmt, "") + (plan.think[0] if think else ""))
    plan.build_grammar()
    return plan


def accepts(grammar: str, text: str) -> bool:
    m = GrammarMatcher(grammar, VOCAB)
    return m.accept_piece(text.encode()) and m.can_end


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_format_of_llama_cpp_templates(llama_cpp_testdata: Path, name: str) -> None:  # noqa: F811
    src = (llama_cpp_testdata / "models/templates" / name).read_text()
    assert detect_format(src).name == EXPECTED[name]


def test_every_template_renders_a_tool_request(llama_cpp_testdata: Path) -> None:  # noqa: F811
    """With each template, a request with tools (native, or the generic system message)
    renders and its grammar builds."""
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    raw = [t.as_json() for t in TOOLS]
    bad = []
    for p in sorted((llama_cpp_testdata / "models/templates").glob("*.jinja")):
        ct = ChatTemplate(p.read_text(), "<s>", "</s>")
        plan = plan_chat(ct.source, TOOLS, "auto", parallel=False)
        try:
            if isinstance(plan.fmt, Generic):
                ct.apply(generic_messages(msgs, plan.tools))
            else:
                ct.apply(msgs, tools=raw)
            plan.build_grammar()
        except Exception as e:  # collected and reported
            bad.append((p.name, repr(e)[:200]))
    assert not bad


@pytest.mark.parametrize("fmt", sorted(CALLS))
def test_grammar_accepts_the_format_and_parser_reads_it(fmt: str) -> None:
    plan = plan_for(fmt)
    text = CALLS[fmt]
    assert accepts(plan.grammar, text), plan.grammar
    reply = parse_reply(text, plan)
    got = [(c.name, json.loads(c.arguments)) for c in reply.tool_calls]
    assert got == WANT and reply.content == ""
    if fmt == "command-r7b":  # the model's own ids, as llama.cpp keeps them
        assert [c.id for c in reply.tool_calls] == ["0", "1"]
    elif fmt == "kimi-k2":
        assert [c.id for c in reply.tool_calls] == ["functions.get_weather:0", "functions.add:1"]
    else:
        assert all(len(c.id) >= 9 for c in reply.tool_calls)


def test_llama3_grammar_and_parse() -> None:
    plan = plan_for("llama3", parallel=False)
    text = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    assert accepts(plan.grammar, text) and accepts(plan.grammar, "<|python_tag|>" + text)
    reply = parse_reply(text, plan)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [WANT[1]]
    assert parse_reply("Hello there", plan).content == "Hello there"


@pytest.mark.parametrize(
    "fmt,bad",
    [
        ("hermes", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": "2", "b": 3}}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'),
        ("qwen3-coder", "<tool_call>\n<function=add>\n<parameter=a>\ntwo\n</parameter>\n"
                        "<parameter=b>\n3\n</parameter>\n</function>\n</tool_call>"),
        ("qwen3-coder", "<tool_call>\n<function=nope>\n</function>\n</tool_call>"),
        ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "short"}]'),
        ("kimi-k2", "<|tool_call_begin|>functions.rm:0<|tool_call_argument_begin|>{}"),
        ("minimax-m2", '<minimax:tool_call><invoke name="add"><parameter name="a">two'
                       '</parameter><parameter name="b">3</parameter></invoke></minimax:tool_call>'),
        ("functionary-v3.2", 'add\n{"a": 2}'),
        ("generic", '{"response": "hi"}'),  # required: a call, not a response
        ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"town": "x"}}}'),
    ],
)  # fmt: skip
def test_grammar_refuses_wrong_calls(fmt: str, bad: str) -> None:
    assert not accepts(plan_for(fmt).grammar, bad)


def test_single_call_unless_parallel() -> None:
    plan = plan_for("hermes", parallel=False)
    one = CALLS["hermes"].split("\n<tool_call>")[0]
    assert accepts(plan.grammar, one) and not accepts(plan.grammar, CALLS["hermes"])


def test_generic_auto_allows_a_response_and_required_with_reasoning() -> None:
    auto = plan_for("generic", mode="auto")
    assert not auto.lazy and accepts(auto.grammar, '{"response": "It is sunny."}')
    assert parse_reply('{"response": "It is sunny."}', auto).content == "It is sunny."
    think = plan_for("hermes", think=True, parallel=False)
    text = "I should call it.\n</think>\n\n" + CALLS["hermes"].split("\n<tool_call>")[0]
    assert accepts(think.grammar, text)
    reply = parse_reply(text, think)
    assert reply.reasoning == "I should call it." and reply.tool_calls[0].name == "get_weather"


def test_content_before_calls_and_unparsable_calls_stay_content() -> None:
    plan = plan_for("hermes", mode="auto")
    assert plan.lazy and plan.trigger_words == ("<tool_call>",)
    reply = parse_reply("Let me check.\n" + CALLS["hermes"], plan)
    assert reply.content == "Let me check." and len(reply.tool_calls) == 2
    broken = "Sure <tool_call>{not json</tool_call>"
    assert parse_reply(broken, plan).content == broken
    assert parse_reply(broken, plan).tool_calls == []


@pytest.mark.parametrize(
    "text,think_open,reasoning,content",
    [
        ("<think>\nHmm.\n</think>\n\nHello", False, "Hmm.", "Hello"),
        ("  <think>a</think>b", False, "a", "b"),
        ("Hmm, so.\n</think>\n\nHello", True, "Hmm, so.", "Hello"),
        ("still thinking", True, "still thinking", ""),
        ("No think here", False, "", "No think here"),
        ("<thinking is a word", False, "", "<thinking is a word"),
    ],
)
def test_reasoning_split(text: str, think_open: bool, reasoning: str, content: str) -> None:
    plan = plan_chat("", [], "none", parallel=False)
    plan.think_open = think_open
    reply = parse_reply(text, plan)
    assert (reply.reasoning, reply.content) == (reasoning, content)
    off = plan_chat("", [], "none", parallel=False, reasoning_format="none")
    assert parse_reply(text, off).content == text
    legacy = plan_chat("", [], "none", parallel=False, reasoning_format="deepseek-legacy")
    legacy.think_open = think_open
    assert parse_reply(text, legacy).content == text
    assert parse_reply(text, legacy).reasoning == reasoning


def _stream(plan, text: str, rng: random.Random):
    """Deltas fed (text cut at random), the deltas of finish() and the reply."""
    s = ReplyStream(plan)
    deltas, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        deltas += s.feed(text[i : i + n])
        i += n
    tail, reply = s.finish()
    return deltas, tail, reply


def assemble(deltas):
    """The message a client builds from streamed deltas (content, reasoning, calls), with
    the checks that a call's first delta has its id, type and name and the later ones
    only add arguments."""
    calls: dict[int, dict] = {}
    for d in deltas:
        assert len(d) == 1, d
        for tc in d.get("tool_calls", []):
            i = tc["index"]
            if i not in calls:
                assert i == len(calls) and tc["type"] == "function" and tc["id"]
                calls[i] = {"id": tc["id"], "name": tc["function"]["name"], "arguments": ""}
            else:
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
            calls[i]["arguments"] += tc["function"]["arguments"]
    content = "".join(d.get("content", "") for d in deltas)
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    return content, reasoning.strip(), [calls[i] for i in range(len(calls))]


def as_assembled(reply):
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in reply.tool_calls]
    return reply.content, reply.reasoning, calls


# formats whose calls' arguments stream as the model writes them
INCREMENTAL = set(CALLS) | {"llama3"}


def stream_case(fmt: str | None, think: bool):
    """A plan (tools auto, parallel) and a reply: reasoning, content, then the calls."""
    if fmt is None:
        plan = plan_chat("", [], "none", parallel=True)
        calls = ""
    else:
        plan = plan_chat(SOURCES[fmt], TOOLS, "auto", parallel=True)
        calls = CALLS.get(fmt, '{"name": "add", "parameters": {"a": 2, "b": 3}}')
    plan.read_prompt(PROMPT_END.get(fmt, ""))
    before = "" if fmt in ("generic", "llama3") else "Checking <now> the weather.\n"
    if fmt == "functionary-v3.2":
        before = "all\n" + before + ">>>"
    start, end = plan.think
    head = f"{start}\nLet me think: {end[:5]} no.\n{end}\n\n" if think else ""
    return plan, head + before + calls


@pytest.mark.parametrize("fmt", [*sorted(CALLS), "llama3", None])
@pytest.mark.parametrize("think", [False, True])
def test_streamed_deltas_add_up_to_the_reply(fmt: str | None, think: bool) -> None:
    if think and fmt == "functionary-v3.2":
        pytest.skip("the format has no reasoning block")
    rng = random.Random(7)
    plan, text = stream_case(fmt, think)
    pieces = []  # how many deltas the first call's arguments came in while streaming
    for _ in range(20):
        fed, tail, reply = _stream(plan, text, rng)
        assert assemble(fed + tail) == as_assembled(reply)
        if think:
            assert reply.reasoning == f"Let me think: {plan.think[1][:5]} no."
        if fmt is not None:
            assert len(reply.tool_calls) == (1 if fmt == "llama3" else 2)
            assert reply.content == ("" if fmt in ("generic", "llama3")
                                     else "Checking <now> the weather.")  # fmt: skip
            args = [tc["function"]["arguments"] for d in fed for tc in d.get("tool_calls", [])
                    if tc["index"] == 0 and tc["function"]["arguments"]]  # fmt: skip
            pieces.append(len(args))
    if fmt in INCREMENTAL:
        assert max(pieces) >= 3, pieces  # streamed in pieces, not whole at the end
    elif fmt is not None:
        assert max(pieces) == 0


@pytest.mark.parametrize("fmt", [*sorted(CALLS), "llama3"])
def test_streamed_deltas_add_up_when_cut_short(fmt: str) -> None:
    """However the reply ends (max_tokens inside a call, a marker, a value), the streamed
    deltas add up to the reply that finish() returns."""
    plan, text = stream_case(fmt, think=False)
    rng = random.Random(11)
    for n in range(len(text) + 1):
        fed, tail, reply = _stream(plan, text[:n], rng)
        assert assemble(fed + tail) == as_assembled(reply), text[:n]


def test_openai_client_assembles_the_streamed_calls() -> None:
    """The server's chunks for a streamed reply, read by the official client's stream
    state: the assembled message has the calls, ids and arguments of the parsed reply."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    from llamacpy.api.serving import Chunk, Final
    from llamacpy.server.responses import Shaper

    for fmt in sorted(INCREMENTAL):
        plan, text = stream_case(fmt, think=fmt != "functionary-v3.2")
        plan.build_grammar()
        shaper = Shaper("chat", "m", plan=plan)
        events = shaper.first()
        pieces = re.findall(r".{1,3}", text, re.DOTALL)
        for p in pieces:
            events += shaper.chunk(Chunk(p, [0]))
        events += shaper.done(Final("stop", "eos", "", text, [], 1, 0, len(pieces), {}, 0))
        state = ChatCompletionStreamState()
        for ev in events:
            data = ev.decode().removeprefix("data: ").strip()
            state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(data)))
        choice = state.get_final_completion().choices[0]
        want = parse_reply(text, plan)
        assert choice.finish_reason == "tool_calls"
        got = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert got == [(c.name, c.arguments) for c in want.tool_calls], fmt
        assert all(len(c.id) >= 1 for c in choice.message.tool_calls)
        assert (choice.message.content or "") == want.content


def test_parse_tools_and_choice_errors() -> None:
    with pytest.raises(UsageError, match=r"tools\[0\]\.function\.name"):
        parse_tools([{"type": "function", "function": {"name": "bad name!"}}])
    with pytest.raises(UsageError, match=r"tools\[1\].*twice"):
        parse_tools([{"function": {"name": "a"}}, {"function": {"name": "a"}}])
    with pytest.raises(UsageError, match=r"parameters"):
        parse_tools([{"function": {"name": "a", "parameters": [1]}}])
    with pytest.raises(UsageError, match="not one of the 'tools'"):
        parse_tool_choice({"type": "function", "function": {"name": "zzz"}}, TOOLS)
    with pytest.raises(UsageError, match="'tool_choice'"):
        parse_tool_choice("sometimes", TOOLS)
    assert parse_tool_choice({"type": "function", "function": {"name": "add"}}, TOOLS) == (
        "required", [TOOLS[1]])  # fmt: skip
    assert parse_tool_choice(None, []) == ("none", [])


def test_lazy_grammar_waits_for_its_trigger() -> None:
    v = GrammarVocab([b"Hi ", b"there", b"<tool", b"_call>", b"{}", b"x", b"</s>"], eog=[6])
    inner = GrammarMatcher('root ::= "<tool_call>" "{}"', v)
    g = LazyGrammar(inner, words=["<tool_call>"])
    for t in (0, 1, 5):  # free text: anything goes
        assert g.allows(t) and g.mask().all()
        g.accept(t)
    g2 = g.clone()
    g.accept(2)
    assert not g.triggered and g.can_end
    g.accept(3)  # "<tool" + "_call>": the trigger, replayed into the grammar
    assert g.triggered and not g.can_end
    assert g.allows(4) and not g.allows(5) and not g.allows(6)
    assert list(g.mask()) == [False, False, False, False, True, False, False]
    g.accept(4)
    assert g.can_end and g.allows(6)
    assert not g2.triggered  # a clone keeps its own state
    g.reset()
    assert not g.triggered and g.allows(5)


def test_lazy_grammar_full_pattern_and_bad_trigger() -> None:
    v = GrammarVocab([b" ", b'{"name": "', b"add", b'"}', b"x"])
    inner = GrammarMatcher('root ::= "{\\"name\\": \\"" "add" "\\"}"', v)
    g = LazyGrammar(inner, patterns=[r'^\s*(\{\s*"name"\s*:\s*")[\s\S]*$'])
    g.accept(0)
    g.accept(1)
    assert g.triggered and g.allows(2) and not g.allows(4)
    g2 = LazyGrammar(GrammarMatcher('root ::= "{\\"name\\": \\"" "add" "\\"}"', v),
                     patterns=[r'^\s*(\{\s*"name"\s*:\s*")[\s\S]*$'])  # fmt: skip
    g2.accept(4)
    g2.accept(1)  # not at the start of the reply: no trigger
    assert not g2.triggered
    with pytest.raises(GrammarError):
        LazyGrammar(inner)
    with pytest.raises(GrammarError, match="pattern"):
        LazyGrammar(inner, patterns=["("])


HARMONY_CALL = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
                '{"city": "Paris"}')  # fmt: skip


def test_harmony_grammar_parse_and_stream() -> None:
    plan = plan_for("harmony", parallel=False)
    role_form = ' to=functions.add<|channel|>commentary json<|message|>{"a": 2, "b": 3}'
    for text in (HARMONY_CALL, role_form):
        assert accepts(plan.grammar, text)
    assert not accepts(plan.grammar, HARMONY_CALL.replace("get_weather", "rm"))
    assert not accepts(plan.grammar, "<|channel|>final<|message|>Hi")  # required: a call
    reply = parse_reply(HARMONY_CALL, plan)
    assert reply.reasoning == "Need the weather." and reply.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [WANT[0]]
    assert parse_reply(role_form, plan).tool_calls[0].name == "add"
    # a plain answer: analysis to reasoning, final (and preambles) to content
    chat = plan_chat("<|channel|>", [], "none", parallel=False)
    answer = ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>"
              "commentary<|message|>Note. <|end|><|start|>assistant<|channel|>final<|message|>Done.")  # fmt: skip
    reply = parse_reply(answer, chat)
    assert (reply.reasoning, reply.content) == ("Think.", "Note. Done.")
    raw = plan_chat("<|channel|>", [], "none", parallel=False, reasoning_format="none")
    assert parse_reply(answer, raw).content.startswith("<|channel|>analysis<|message|>Think.")
    # streamed: markers are whole tokens, so cut the text at them and inside bodies
    pieces = re.split(r"(<\|[a-z]+\|>)", answer)
    for p in (chat, plan_for("harmony", mode="auto", parallel=False)):
        s = ReplyStream(p)
        deltas = [d for piece in pieces for d in s.feed(piece)]
        tail, final = s.finish()
        deltas += tail
        assert "".join(d.get("reasoning_content", "") for d in deltas) == final.reasoning
        assert "".join(d.get("content", "") for d in deltas) == final.content == "Note. Done."


def _harmony_pieces(text: str, rng: random.Random) -> list[str]:
    """``text`` cut as a gpt-oss stream comes: markers whole, other text at random."""
    out = []
    for part in re.split(r"(<\|[a-z]+\|>)", text):
        if part.startswith("<|"):
            out.append(part)
            continue
        i = 0
        while i < len(part):
            n = rng.randint(1, 4)
            out.append(part[i : i + n])
            i += n
    return out


def test_harmony_calls_stream_as_written() -> None:
    """A gpt-oss call's name comes first, its arguments as the model writes them (kept as
    written: the deltas add up to the parsed call), however the reply is cut."""
    plan = plan_for("harmony", parallel=True)
    second = ('<|start|>assistant<|channel|>commentary to=functions.add <|constrain|>json'
              '<|message|>{"a": 2,  "b": 3}<|end|>')  # fmt: skip
    text = HARMONY_CALL + "<|end|>" + second
    rng = random.Random(5)
    for _ in range(10):
        s = ReplyStream(plan)
        fed = [d for piece in _harmony_pieces(text, rng) for d in s.feed(piece)]
        tail, reply = s.finish()
        assert assemble(fed + tail) == as_assembled(reply)
        assert [(c.name, c.arguments) for c in reply.tool_calls] == [
            ("get_weather", '{"city": "Paris"}'), ("add", '{"a": 2,  "b": 3}')]  # fmt: skip
        args = [tc["function"]["arguments"] for d in fed for tc in d.get("tool_calls", [])
                if tc["index"] == 0 and tc["function"]["arguments"]]  # fmt: skip
        assert len(args) >= 3, args  # in pieces, not whole at the end
    pieces = _harmony_pieces(text, random.Random(6))
    for n in range(len(pieces) + 1):  # cut short anywhere
        s = ReplyStream(plan)
        fed = [d for piece in pieces[:n] for d in s.feed(piece)]
        tail, reply = s.finish()
        assert assemble(fed + tail) == as_assembled(reply), "".join(pieces[:n])


def test_generic_response_streams_as_it_grows() -> None:
    """The generic format's reply is one JSON object; a ``response`` is sent as its string
    grows (escapes and surrogate pairs never split), a cut-short one is what it said."""
    plan = plan_chat(SOURCES["generic"], TOOLS, "auto", parallel=True)
    want = 'Hello "there"\\ ok \u00e9\U0001f600 \n end'
    text = '{"response": ' + json.dumps(want) + "}"  # escapes, a surrogate pair
    rng = random.Random(3)
    for _ in range(20):
        fed, tail, reply = _stream(plan, text, rng)
        assert reply.content == want and not reply.tool_calls
        assert assemble(fed + tail) == as_assembled(reply)
        assert len([d for d in fed if "content" in d]) >= 3  # in pieces
    for n in range(len(text) + 1):
        fed, tail, reply = _stream(plan, text[:n], random.Random(n))
        assert assemble(fed + tail) == as_assembled(reply), text[:n]
        if n >= len('{"response": "'):  # (before, the reply is the text as it is)
            assert want.startswith(reply.content), text[:n]
        if n < len(text):  # the reply (whole, not streamed) of the cut text: the same
            assert parse_reply(text[:n], plan).content == reply.content


def test_glm_values_are_kept_as_written() -> None:
    """GLM's text values keep their new lines (as llama.cpp reads them); others are JSON."""
    plan = plan_chat(SOURCES["glm"], TOOLS, "auto", parallel=True)
    text = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>\nParis\n</arg_value>"
            "\n</tool_call><tool_call>add <arg_key>a</arg_key><arg_value>2</arg_value>"
            "<arg_key>b</arg_key><arg_value> 3 </arg_value></tool_call>")  # fmt: skip
    reply = parse_reply(text, plan)
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("get_weather", {"city": "\nParis\n"}), ("add", {"a": 2, "b": 3})]  # fmt: skip
    for bad in ("<tool_call>get_weather<arg_key>city</arg_key>x<arg_value>P</arg_value>"
                "</tool_call>", "<tool_call>add</tool_call> trailing"):  # fmt: skip
        assert not parse_reply(bad, plan).tool_calls


def test_harmony_lazy_triggers() -> None:
    plan = plan_for("harmony", mode="auto", parallel=False)
    assert plan.lazy and plan.preserved[:3] == ("<|channel|>", "<|constrain|>", "<|message|>")
    v = GrammarVocab([b"<|channel|>", b"analysis", b"<|message|>", b"x", b"<|end|>",
                      b"<|start|>", b"assistant", b"commentary", b" to", b"=functions",
                      b".add", b"<|constrain|>", b"json", b'{"a": 2, "b": 3}', b"final"])  # fmt: skip
    g = LazyGrammar(GrammarMatcher(plan.grammar, v), patterns=plan.trigger_patterns)
    for t in (0, 1, 2, 3, 4, 5, 6, 0, 7):  # analysis message, then a commentary header
        assert g.allows(t) and not g.triggered
        g.accept(t)
    g.accept(8)  # " to": the channel-header recipient begins
    assert g.triggered and g.allows(9) and not g.allows(3)
    for t in (9, 10, 2, 13):
        g.accept(t)
    assert g.can_end


def test_command_r7b_reasoning_response_and_calls() -> None:
    """Command R7B as llama.cpp reads it: <|START_THINKING|> blocks are the reasoning, the
    <|START_RESPONSE|> markers leave the content; the ids are the model's."""
    chat = plan_chat(SOURCES["command-r7b"], [], "none", parallel=False)
    assert "<|START_RESPONSE|>" in chat.preserved and chat.fmt is None
    answer = ("<|START_THINKING|>I'm\nthinking<|END_THINKING|>"
              "<|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>")  # fmt: skip
    reply = parse_reply(answer, chat)
    assert (reply.reasoning, reply.content) == ("I'm\nthinking", "Hello, world!\nWhat's up?")
    raw = plan_chat(SOURCES["command-r7b"], [], "none", parallel=False, reasoning_format="none")
    assert parse_reply(answer, raw).content == (
        "<|START_THINKING|>I'm\nthinking<|END_THINKING|>Hello, world!\nWhat's up?")  # fmt: skip
    plan = plan_for("command-r7b", mode="auto", parallel=False)
    assert plan.lazy and plan.trigger_words == ("<|START_ACTION|>",)
    call = ('<|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", '
            '"tool_name": "add", "parameters": {"a": 2, "b": 3}}\n]<|END_ACTION|>')  # fmt: skip
    reply = parse_reply(call, plan)
    assert reply.reasoning == "" and reply.content == ""
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("0", "add", '{"a": 2, "b": 3}')
    ]
    # required: the model may think first; the ids are digits
    req = plan_for("command-r7b", parallel=False)
    bare = call.removeprefix("<|START_THINKING|><|END_THINKING|>")
    assert accepts(req.grammar, call) and accepts(req.grammar, bare)
    assert not accepts(req.grammar, call.replace('"0"', '"x"'))
    assert not accepts(req.grammar, "<|START_RESPONSE|>Hi<|END_RESPONSE|>")
    opened = plan_for("command-r7b", parallel=False, think=True)
    assert opened.think_open and accepts(opened.grammar, "Plan.<|END_THINKING|>" + bare)


def test_functionary_v32_parts() -> None:
    """Functionary v3.2: the prompt ends with '>>>'; 'all' parts are content, the others
    are calls of the named function."""
    chat = plan_chat(SOURCES["functionary-v3.2"], [], "none", parallel=False)
    chat.read_prompt(PROMPT_END["functionary-v3.2"])
    assert chat.prefix == ">>>" and parse_reply("all\nHello there", chat).content == "Hello there"
    plan = plan_for("functionary-v3.2", mode="auto")
    reply = parse_reply('all\nLet me add.\n>>>add\n{"a": 2, "b": 3}', plan)
    assert reply.content == "Let me add." and reply.tool_calls[0].arguments == '{"a": 2, "b": 3}'
    assert parse_reply("all\nno >>>nope\n{}", plan).tool_calls == []  # not a tool: text
    no_prefix = plan_for("functionary-v3.2", mode="auto")
    no_prefix.read_prompt("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert no_prefix.prefix == "" and parse_reply("all\nHi", no_prefix).content == "all\nHi"
    req = plan_for("functionary-v3.2")
    assert accepts(req.grammar, 'all\nLet me add.\n>>>add\n{"a": 2, "b": 3}')
    assert accepts(req.grammar, CALLS["functionary-v3.2"])
    assert not accepts(req.grammar, "all\nJust text.")  # required: a call
    assert not accepts(req.grammar, 'all\nx>>>all\ny>>>add\n{"a": 2, "b": 3}')


def test_functionary_v32_lazy_triggers() -> None:
    """The lazy grammar waits through 'all' parts and starts at a tool's name, at the
    start of the reply or after '>>>'; a name that is no tool is left alone."""
    plan = plan_for("functionary-v3.2", mode="auto")
    assert plan.lazy

    def run(text: str) -> LazyGrammar:
        g = LazyGrammar(GrammarMatcher(plan.grammar, VOCAB), words=plan.trigger_words,
                        patterns=plan.trigger_patterns)  # fmt: skip
        for ch in text:
            g.accept(_tok(ch))
        return g

    g = run("all\nSure, adding.\n")
    assert not g.triggered
    g = run("all\nSure.\n>>>add\n")
    assert g.triggered and not g.allows(_tok("x")) and g.allows(_tok("{"))
    g = run("add\n")
    assert g.triggered and g.allows(_tok("{"))
    assert not run("python\n{").triggered


def _tok(ch: str) -> int:
    pieces = [chr(c).encode() for c in range(32, 127)] + [b"\n", b"\t", b"</s>"]
    return pieces.index(ch.encode())
