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
}  # fmt: skip
WANT = [("get_weather", {"city": "Paris"}), ("add", {"a": 2, "b": 3})]
SOURCES = {"hermes": "<tool_call>", "qwen3-coder": "<tool_call><function=<parameter=",
           "mistral": "[TOOL_CALLS]", "llama3": "<|start_header_id|>ipython",
           "generic": "", "harmony": "<|channel|>",
           "deepseek-r1": "<｜tool▁calls▁begin｜>```json", "deepseek-v3.1": "<｜tool▁calls▁begin｜>",
           "granite": "<|tool_call|>", "glm": "<tool_call><arg_key>",
           "functionary-v3.1": "<function=</function>"}  # fmt: skip


def byte_vocab() -> GrammarVocab:
    """Single-character tokens (printable ASCII, newline, tab) and an end token."""
    pieces = [chr(c).encode() for c in range(32, 127)] + [b"\n", b"\t", b"</s>"]
    return GrammarVocab(pieces, eog=[len(pieces) - 1])


VOCAB = byte_vocab()


def plan_for(fmt: str, mode: str = "required", parallel: bool = True, think: bool = False):
    plan = plan_chat(SOURCES[fmt], TOOLS, mode, parallel=parallel)
    plan.think_open = think
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
    s = ReplyStream(plan)
    deltas, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        deltas += s.feed(text[i : i + n])
        i += n
    tail, reply = s.finish()
    return deltas + tail, reply


@pytest.mark.parametrize("fmt", [*sorted(CALLS), "llama3", None])
@pytest.mark.parametrize("think", [False, True])
def test_streamed_deltas_add_up_to_the_reply(fmt: str | None, think: bool) -> None:
    rng = random.Random(7)
    if fmt is None:
        plan = plan_chat("", [], "none", parallel=True)
        calls = ""
    else:
        plan = plan_chat(SOURCES[fmt], TOOLS, "auto", parallel=True)
        calls = CALLS.get(fmt, '{"name": "add", "parameters": {"a": 2, "b": 3}}')
    before = "" if fmt in ("generic", "llama3") else "Checking <now> the weather.\n"
    head = "<think>\nLet me think: </thi no.\n</think>\n\n" if think else ""
    text = head + before + calls
    for _ in range(20):
        deltas, reply = _stream(plan, text, rng)
        content = "".join(d.get("content", "") for d in deltas)
        reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
        calls_out = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
        assert content == reply.content
        assert reasoning.strip() == reply.reasoning
        assert [c["function"]["name"] for c in calls_out] == [c.name for c in reply.tool_calls]
        assert [c["index"] for c in calls_out] == list(range(len(calls_out)))
        if think:
            assert reply.reasoning == "Let me think: </thi no."
        if fmt is not None:
            assert len(reply.tool_calls) == (1 if fmt == "llama3" else 2)


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
    s = ReplyStream(plan)
    for piece in re.split(r"(<\|[a-z]+\|>)", HARMONY_CALL):
        s.feed(piece)
    tail, final = s.finish()
    assert [d["tool_calls"][0]["function"]["name"] for d in tail if "tool_calls" in d] == [
        "get_weather"]  # fmt: skip


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
