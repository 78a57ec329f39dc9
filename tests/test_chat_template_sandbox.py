"""Hostile chat templates: no code execution, no escape from the sandbox, and every
resource bomb is stopped by a limit with a clear error (never a hang or a crash)."""

from __future__ import annotations

import time

import pytest

from llamacpy.tokenizer import ChatTemplateError, ChatTemplateLimitError
from llamacpy.tokenizer.chat import ChatTemplate, Limits

FAST = Limits(time_s=0.5, max_output=100_000, max_range=10_000, max_depth=32)

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ raise_exception.__globals__ }}",
    "{{ range.__self__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ (messages|attr('__class__')) }}",
    "{{ ''.format.__self__ }}",
    "{{ '{0.__class__}'.format(messages) }}",
    "{{ tojson.__globals__ }}",
    "{{ strftime_now.__func__ }}",
    "{% set x = messages.append(1) %}",
    "{% set x = messages[0].update({'role': 'x'}) %}",
    "{% set x = messages.pop() %}",
    "{{ lipsum(n=100000) }}",
]


@pytest.mark.parametrize("src", ESCAPES)
def test_no_escape(src: str) -> None:
    messages = [{"role": "user", "content": "hi"}]
    ct = ChatTemplate(src, limits=FAST)
    try:
        out = ct.render(messages=messages)
    except ChatTemplateError:
        out = ""
    assert "class" not in out and "module" not in out and "function" not in out
    assert messages == [{"role": "user", "content": "hi"}]  # the caller's data is unchanged


BOMBS = [
    ("{{ 'a' * 1000000000 }}", "repeated"),
    ("{{ ['a'] * 1000000000 }}", "repeated"),
    ("{% for i in range(1000000000) %}{% endfor %}", "range|too large"),
    ("{% for i in range(20000) %}{% endfor %}", "range"),
    ("{% for i in range(9000) %}{% for j in range(9000) %}{% endfor %}{% endfor %}", "time"),
    (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "longer",
    ),
    (
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "too large",
    ),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "depth"),
    ("{% for i in [1] recursive %}{{ loop([i]) }}{% endfor %}", "depth"),
    ("{{ '%0999999999d' % 1 }}", "format"),
    ("{{ '{:>999999999}'.format(1) }}", "format"),
    ("{{ 'x'.ljust(999999999) }}", "too large"),
    ("{{ 'x' | center(999999999) }}", "too large"),
    ("{{ 2 ** 100000000 }}", "exponent"),
    (
        "{% set ns = namespace(x=3) %}{% for i in range(60) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
        "number",
    ),
    ("{% for i in range(10000) %}{{ 'y' * 50 }}{% endfor %}", "output"),
    (
        "{% set l = [] %}{% for i in range(9000) %}{% for j in range(9000) %}{% set _ = l.append(j) %}{% endfor %}{% endfor %}",
        "time",
    ),
    ("{{ ('a' * 90000) | replace('a', 'aaaaaaaaaa') }}", "larger"),
]


@pytest.mark.parametrize(("src", "what"), BOMBS)
def test_bombs_are_stopped(src: str, what: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateLimitError, match=what):
        ChatTemplate(src, limits=FAST).render(messages=[])
    assert time.monotonic() - t0 < 5


def test_default_limits_allow_real_templates() -> None:
    ct = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    msgs = [{"role": "user", "content": "x" * 1000}] * 500
    assert len(ct.render(messages=msgs)) == 500_000


def test_template_lists_may_change() -> None:
    src = "{% set q = namespace(ids=[]) %}{% set _ = q.ids.append(1) %}{% set _ = q.ids.append(2) %}{{ q.ids.pop(0) }}{{ q.ids | tojson }}"
    assert ChatTemplate(src).render() == "1[2]"


def test_undefined_and_printing_follow_llama_cpp() -> None:
    # verified against llama-server: undefined is lenient, none/objects print as ""
    src = "[{{ 'a' + u }}][{{ u.x.y }}][{{ u | length }}][{{ none }}][{{ [1, 2] }}][{{ {'a': 1.0} | tojson }}]"
    assert ChatTemplate(src).render() == '[a][][0][][12][{"a": 1}]'
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ u | tojson }}").render()


def test_hostile_template_fails_fast_in_apply() -> None:
    # capability probing stops at the first limit instead of running every probe
    ct = ChatTemplate(
        "{% for i in range(9000) %}{% for j in range(9000) %}{% endfor %}{% endfor %}", limits=FAST
    )
    t0 = time.monotonic()
    with pytest.raises(ChatTemplateLimitError):
        ct.apply([{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 2
