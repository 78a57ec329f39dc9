"""Chat templates: every template of llama.cpp's ``models/templates/`` renders a fixed set
of conversations to exactly the prompt llama-server (``--jinja``, ``POST /apply-template``)
returned (tests/fixtures/templates/llama_server.json.gz, recorded with
scripts/make_chat_template_fixtures.py), with the same detected capabilities."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import pytest

from llama_cpp_testdata import llama_cpp_testdata  # noqa: F401  (fixture)
from llamacpy.tokenizer import ChatTemplateError, Tokenizer
from llamacpy.tokenizer.chat import ChatTemplate

with gzip.open(Path(__file__).parent / "fixtures/templates/llama_server.json.gz", "rt") as _f:
    _FIXTURE = json.load(_f)
NOW = dt.datetime.strptime(_FIXTURE["date"], "%Y-%m-%d")
CONVERSATIONS = {c["name"]: c for c in _FIXTURE["conversations"]}
# the BOS/EOS texts and add_bos flag of the model llama-server ran with
MODELS = {"smollm2": ("<|im_start|>", "<|im_end|>", False), "gemma3": ("<bos>", "<eos>", True)}
TEMPLATES = sorted(t for t in _FIXTURE["models"]["smollm2"] if t != "__model__")


def _check(ct: ChatTemplate, rec: dict) -> list:
    bad = []
    for r in rec["results"]:
        conv = CONVERSATIONS[r["conversation"]]
        try:
            got = ct.apply(
                conv["messages"],
                tools=conv.get("tools"),
                add_generation_prompt=conv.get("add_generation_prompt", True),
                enable_thinking=r["enable_thinking"],
                now=NOW,
            )
        except ChatTemplateError as e:
            if r["status"] == 200:
                bad.append((r["conversation"], "error", str(e)[:200]))
            continue
        if r["status"] != 200:
            # llama.cpp failed while building its output parser, not while rendering
            assert "Unable to generate parser" in r["error"]
            continue
        if got != r["prompt"]:
            bad.append((r["conversation"], r["enable_thinking"], r["prompt"][-120:], got[-120:]))
    return bad


def test_template_count(llama_cpp_testdata: Path) -> None:  # noqa: F811
    on_disk = sorted(p.name for p in (llama_cpp_testdata / "models/templates").glob("*.jinja"))
    assert on_disk == TEMPLATES
    assert len(TEMPLATES) == 70


@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("name", TEMPLATES)
def test_same_prompt_as_llama_server(name: str, model: str, llama_cpp_testdata: Path) -> None:  # noqa: F811
    bos, eos, add_bos = MODELS[model]
    src = (llama_cpp_testdata / "models/templates" / name).read_text()
    ct = ChatTemplate(src, bos, eos, add_bos=add_bos)
    rec = _FIXTURE["models"][model][name]
    assert ct.caps.__dict__ == rec["caps"]
    bad = _check(ct, rec)
    assert not bad, bad


@pytest.mark.real_model
@pytest.mark.parametrize("model", sorted(MODELS))
def test_model_templates(model: str, request) -> None:
    """The model's own template (SmolLM2's; Gemma 3 has none: llama.cpp falls back to ChatML)."""
    tok = Tokenizer.from_gguf(request.getfixturevalue(f"{model}_path"))
    ct = tok.chat_template()
    assert (ct.bos_token, ct.eos_token, ct.add_bos) == MODELS[model]
    rec = _FIXTURE["models"][model]["__model__"]
    assert ct.caps.__dict__ == rec["caps"]
    assert not _check(ct, rec)


def test_raw_render_and_globals() -> None:
    ct = ChatTemplate("{{ strftime_now('%Y') }}|{{ x | tojson }}|{{ [1, 2] | tojson(indent=1) }}")
    year = str(dt.datetime.now().year)
    assert ct.render(x={"a": "é"}) == f'{year}|{{"a": "é"}}|[\n 1,\n 2\n]'
    with pytest.raises(ChatTemplateError, match="Jinja Exception: nope"):
        ChatTemplate("{{ raise_exception('nope') }}").render()
    loops = "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}"
    assert ChatTemplate(loops).render() == "012"
    with pytest.raises(ChatTemplateError, match="syntax error"):
        ChatTemplate("{% for %}")
