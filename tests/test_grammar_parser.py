"""GBNF parsing against llama.cpp's test-grammar-parser cases and error reporting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llamacpy.errors import LlamacpyError
from llamacpy.grammar import GrammarError, parse_grammar, parse_rules
from llamacpy.grammar.parser import TYPE_NAMES

CASES = json.loads((Path(__file__).parent / "fixtures/grammar/parser_cases.json").read_text())
GRAMMARS = Path(__file__).parent / "fixtures/grammar/gbnf"


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_llama_cpp_parser_cases(case):
    if not case["ok"]:
        with pytest.raises(GrammarError):
            parse_rules(case["grammar"])
        return
    rules, symbols = parse_rules(case["grammar"])
    assert symbols == case["symbols"]
    flat = [[TYPE_NAMES[t], v] for rule in rules for t, v in rule]
    assert flat == case["elements"]


def test_parser_case_count():
    assert len(CASES) == 23 and sum(c["ok"] for c in CASES) == 17


@pytest.mark.parametrize(
    "text, message, line, column",
    [
        ('root ::= "a"\nfoo ::= [a-', "unexpected end of input", 2, 12),
        ('root ::= "a" x\n', "undefined rule 'x'", 1, 14),
        ('root ::= ("a"\n  | "b"', "expecting ')'", 2, 8),
        ('root ::= "\\q"', "unknown escape", 1, 11),
        ('root ::= "\\x4"', "expecting 2 hex chars", 1, 13),
        ('root = "a"', "expecting ::=", 1, 6),
        ('root ::= "a"{3', "expecting ','", 1, 15),
        ("root ::= *", "expecting preceding item", 1, 10),
        ("root ::= <hello>", "no vocabulary", 1, 10),
        ('root ::= "a"{2001}', "number of repetitions exceeds 2000", 1, 19),
    ],
)
def test_errors_name_line_and_column(text, message, line, column):
    with pytest.raises(GrammarError) as e:
        parse_grammar(text)
    assert isinstance(e.value, LlamacpyError)
    assert message in str(e.value)
    assert (e.value.line, e.value.column) == (line, column)


@pytest.mark.parametrize(
    "text",
    [
        'root ::= "a" | root "a"',
        'root ::= asdf\nasdf ::= "a" | asdf "a"',
        'root ::= asdf\nasdf ::= "a" | foo "b"\nfoo ::= "c" | asdf "d" | "e"',
        'root ::= asdf\nasdf ::= "a" | foo "b"\nfoo ::= "c" | empty asdf "d" | "e"\nempty ::= "blah" | ',
    ],
)
def test_left_recursion_refused(text):
    with pytest.raises(GrammarError, match="left recursion"):
        parse_grammar(text)


def test_not_left_recursive_when_the_prefix_cannot_be_empty():
    parse_grammar(
        'root ::= asdf\nasdf ::= "a" | foo "b"\nfoo ::= "c" | empty asdf "d"\nempty ::= "x"'
    )


def test_missing_root_and_custom_root():
    with pytest.raises(GrammarError, match="start rule 'root'"):
        parse_grammar('rot ::= "a"')
    with pytest.raises(GrammarError, match="start rule 'nonexistent'"):
        parse_grammar('root ::= "foobar"', root="nonexistent")
    g = parse_grammar('foobar ::= "foobar"', root="foobar")
    assert g.root == 0


def test_hostile_grammars_are_refused_quickly():
    deep = "root ::= " + "(" * 5000 + '"a"' + ")" * 5000
    with pytest.raises(GrammarError, match="nested deeper"):
        parse_grammar(deep)
    nested = "root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}"
    with pytest.raises(GrammarError, match="exceeds 2000"):
        parse_grammar(nested)
    big = 'root ::= "' + "a" * 1500 + '"{1500}'
    with pytest.raises(GrammarError, match="too large"):
        parse_grammar(big)
    with pytest.raises(GrammarError, match="must be text"):
        parse_grammar(b"root ::= x")  # type: ignore[arg-type]


def test_token_constraints():
    g = parse_grammar(
        "root ::= <[1000]> !<[1001]> <think>", tokenize=lambda s: [7] if s == "<think>" else [1, 2]
    )
    assert g.rules[0] == [(8, 1000), (9, 1001), (8, 7), (0, 0)]
    with pytest.raises(GrammarError, match="not exactly one token"):
        parse_grammar("root ::= <a b>", tokenize=lambda s: [1, 2])


def test_llama_cpp_grammar_files_parse():
    names = sorted(p.name for p in GRAMMARS.glob("*.gbnf"))
    assert names == [
        "arithmetic.gbnf",
        "c.gbnf",
        "chess.gbnf",
        "english.gbnf",
        "japanese.gbnf",
        "json.gbnf",
        "json_arr.gbnf",
        "list.gbnf",
    ]
    for p in GRAMMARS.glob("*.gbnf"):
        g = parse_grammar(p.read_text())
        assert g.rules and g.symbols["root"] == g.root
