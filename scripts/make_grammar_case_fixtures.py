"""Turn llama.cpp's grammar unit tests into data fixtures.

Reads ``tests/test-grammar-parser.cpp`` and ``tests/test-grammar-integration.cpp`` of a
llama.cpp checkout and writes ``tests/fixtures/grammar/parser_cases.json`` (grammar text,
expected symbol ids and rule elements, or expected failure) and
``tests/fixtures/grammar/integration_cases.json`` (grammar or JSON schema, strings that must
match and strings that must not). A test string is a list of pieces: text, or an integer
token id (the tests' ``token(N)``).

    python scripts/make_grammar_case_fixtures.py /path/to/llama.cpp
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "grammar"

_SIMPLE_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def _string_body(src: str, i: int, quote: str) -> tuple[str, int]:
    """A C++ string or char literal body starting after the opening quote."""
    out = []
    while src[i] != quote:
        c = src[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = src[i + 1]
        if e == "x":
            m = re.match(r"[0-9a-fA-F]+", src[i + 2 :])
            assert m, src[i : i + 10]
            out.append(chr(int(m.group(), 16)))
            i += 2 + len(m.group())
        elif e in "uU":
            n = 4 if e == "u" else 8
            out.append(chr(int(src[i + 2 : i + 2 + n], 16)))
            i += 2 + n
        else:
            out.append(_SIMPLE_ESC[e])
            i += 2
    return "".join(out), i + 1


def tokenize(src: str) -> list[tuple[str, object]]:
    toks: list[tuple[str, object]] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            i = src.index("\n", i)
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif src.startswith('R"', i):
            delim = src[i + 2 : src.index("(", i)]
            start = src.index("(", i) + 1
            end = src.index(")" + delim + '"', start)
            toks.append(("str", src[start:end]))
            i = end + len(delim) + 2
        elif c == '"':
            s, i = _string_body(src, i + 1, '"')
            toks.append(("str", s))
        elif c == "'":
            s, i = _string_body(src, i + 1, "'")
            toks.append(("num", ord(s)))
        elif c.isdigit():
            m = re.match(r"\d+", src[i:])
            assert m
            toks.append(("num", int(m.group())))
            i += len(m.group())
        elif c.isalpha() or c == "_":
            m = re.match(r"\w+", src[i:])
            assert m
            toks.append(("id", m.group()))
            i += len(m.group())
        else:
            toks.append(("p", c))
            i += 1
    return toks


class _Parser:
    def __init__(self, toks: list[tuple[str, object]], i: int) -> None:
        self.toks, self.i = toks, i

    def peek(self) -> tuple[str, object]:
        return self.toks[self.i]

    def expect(self, p: str) -> None:
        assert self.toks[self.i] == ("p", p), (self.toks[self.i], p)
        self.i += 1

    def atom(self) -> object:
        kind, v = self.toks[self.i]
        self.i += 1
        if kind == "p" and v == "{":
            items = []
            while self.peek() != ("p", "}"):
                items.append(self.expr())
                if self.peek() == ("p", ","):
                    self.i += 1
            self.i += 1
            return items
        if kind == "str":
            pieces: list[object] = [v]
            while self.peek()[0] == "str":  # adjacent literals concatenate
                pieces.append(self.toks[self.i][1])
                self.i += 1
            return pieces
        if kind == "id" and v == "token":
            self.expect("(")
            tid = self.toks[self.i][1]
            self.i += 1
            self.expect(")")
            return [tid]
        return v

    def expr(self) -> object:
        v = self.atom()
        while self.peek() == ("p", "+"):
            self.i += 1
            v = list(v) + list(self.atom())  # type: ignore[arg-type]
        return v

    def call_args(self) -> list[object]:
        self.expect("(")
        args = []
        while self.peek() != ("p", ")"):
            args.append(self.expr())
            if self.peek() == ("p", ","):
                self.i += 1
        self.i += 1
        return args


def _pieces(v: object) -> list[object]:
    """Merge adjacent text pieces; token ids stay integers."""
    out: list[object] = []
    for p in v:  # type: ignore[attr-defined]
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        else:
            out.append(p)
    return out


def _text(v: object) -> str:
    pieces = _pieces(v)
    assert all(isinstance(p, str) for p in pieces), v
    return "".join(pieces)  # type: ignore[arg-type]


def _calls(src: str, name: str) -> list[list[object]]:
    toks = tokenize(src)
    out = []
    for i, t in enumerate(toks):
        if t == ("id", name) and toks[i + 1] == ("p", "(") and (i == 0 or toks[i - 1][0] != "id"):
            out.append(_Parser(toks, i + 1).call_args())
    return out


def parser_cases(src: str) -> list[dict]:
    cases: list[dict] = []
    for args in _calls(src, "verify_failure"):
        cases.append({"grammar": _text(args[0]), "ok": False})
    for args in _calls(src, "verify_parsing"):
        symbols = {_text(name): sid for name, sid in args[1]}  # type: ignore[misc]
        elements = [[t.removeprefix("LLAMA_GRETYPE_"), v] for t, v in args[2]]  # type: ignore[misc]
        cases.append({"grammar": _text(args[0]), "ok": True, "symbols": symbols,
                      "elements": elements})  # fmt: skip
    return cases


def integration_cases(src: str) -> list[dict]:
    cases: list[dict] = []
    for kind in ("test_grammar", "test_schema"):
        for args in _calls(src, kind):
            if len(args) != 4:
                continue  # the helper's own definition
            key = "grammar" if kind == "test_grammar" else "schema"
            cases.append({
                "name": _text(args[0]),
                key: _text(args[1]),
                "pass": [_pieces(s) for s in args[2]],  # type: ignore[attr-defined]
                "fail": [_pieces(s) for s in args[3]],  # type: ignore[attr-defined]
            })  # fmt: skip
    return cases


def main(root: str) -> None:
    tests = Path(root) / "tests"
    OUT.mkdir(parents=True, exist_ok=True)
    parsed = parser_cases((tests / "test-grammar-parser.cpp").read_text())
    integ = integration_cases((tests / "test-grammar-integration.cpp").read_text())
    for name, data in (("parser_cases.json", parsed), ("integration_cases.json", integ)):
        (OUT / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {len(data)} cases")


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp"
    )
