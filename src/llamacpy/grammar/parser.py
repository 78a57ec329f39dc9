"""GBNF text to rules, with llama.cpp's semantics (``llama_grammar_parser``).

A grammar is a list of rules; a rule is a list of elements ``(type, value)`` ending with
``END``, alternatives separated by ``ALT``. Symbol ids, the rules synthesized for groups
and repetitions (``name_N``) and their order are llama.cpp's, so rule ``i`` here is rule
``i`` there. Errors are :class:`GrammarError` with the line and column of the problem.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import UsageError

# element types (llama_gretype)
END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY, TOKEN, TOKEN_NOT = range(10)
TYPE_NAMES = ("END", "ALT", "RULE_REF", "CHAR", "CHAR_NOT", "CHAR_RNG_UPPER", "CHAR_ALT",
              "CHAR_ANY", "TOKEN", "TOKEN_NOT")  # fmt: skip

MAX_REPETITION_THRESHOLD = 2000  # llama.cpp's bound on {m,n} and on nested repetition
MAX_GRAMMAR_CHARS = 4 << 20  # refused beyond these (llama.cpp has no bound and may stall)
MAX_ELEMENTS = 2_000_000
MAX_NESTING = 256

Element = tuple[int, int]
Rule = list[Element]
Tokenize = Callable[[str], Sequence[int]]


class GrammarError(UsageError):
    """A grammar that cannot be parsed or used; ``line``/``column`` (1-based) locate the
    problem in the grammar text when it has a place."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        self.line, self.column = line, column
        where = f" at line {line}, column {column}" if line is not None else ""
        super().__init__(f"grammar: {message}{where}")


@dataclass
class Grammar:
    """Parsed rules, ``symbols`` (name -> rule id) and the start rule's id."""

    rules: list[Rule]
    symbols: dict[str, int]
    root: int

    def n_elements(self) -> int:
        return sum(len(r) for r in self.rules)


def _is_word(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "-" or ("0" <= c <= "9")


_WORD = re.compile(r"[a-zA-Z0-9-]*")  # _is_word, run by the regex engine
_PLAIN = re.compile(r'[^"\\\0]+')  # literal text without escapes or an end

_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}


class _Parser:
    def __init__(self, src: str, tokenize: Tokenize | None) -> None:
        self.src = src + "\0"  # a C string: parsing stops at the terminator
        self.tokenize = tokenize
        self.symbols: dict[str, int] = {}
        self.first_ref: dict[int, int] = {}  # rule id -> offset of its first reference
        self.rules: list[Rule | None] = []
        self.n_elements = 0
        self.depth = 0

    # -- errors and positions
    def fail(self, message: str, pos: int) -> GrammarError:
        line = self.src.count("\n", 0, pos) + 1
        col = pos - (self.src.rfind("\n", 0, pos) + 1) + 1
        return GrammarError(message, line, col)

    # -- lexical helpers (llama-grammar.cpp's parse_space / parse_name / parse_int / parse_char)
    def space(self, pos: int, newline_ok: bool) -> int:
        s = self.src
        while s[pos] in " \t#" or (newline_ok and s[pos] in "\r\n"):
            if s[pos] == "#":
                while s[pos] not in "\0\r\n":
                    pos += 1
            else:
                pos += 1
        return pos

    def name_end(self, pos: int) -> int:
        end = _WORD.match(self.src, pos).end()  # type: ignore[union-attr]
        if end == pos:
            raise self.fail("expecting name", pos)
        return end

    def int_end(self, pos: int) -> int:
        end = pos
        while "0" <= self.src[end] <= "9":
            end += 1
        if end == pos:
            raise self.fail("expecting integer", pos)
        return end

    def hex(self, pos: int, size: int) -> tuple[int, int]:
        value, end = 0, pos
        while end < pos + size and self.src[end] in "0123456789abcdefABCDEF":
            value = value * 16 + int(self.src[end], 16)
            end += 1
        if end != pos + size:
            raise self.fail(f"expecting {size} hex chars", pos)
        return value, end

    def char(self, pos: int) -> tuple[int, int]:
        s = self.src
        if s[pos] == "\\":
            e = s[pos + 1]
            if e in "xuU":
                return self.hex(pos + 2, {"x": 2, "u": 4, "U": 8}[e])
            if e in _ESCAPES:
                return ord(_ESCAPES[e]), pos + 2
            raise self.fail("unknown escape", pos)
        if s[pos] != "\0":
            return ord(s[pos]), pos + 1
        raise self.fail("unexpected end of input", pos)

    # -- symbols and rules
    def symbol_id(self, name: str) -> int:
        return self.symbols.setdefault(name, len(self.symbols))

    def new_symbol(self, base: str) -> int:
        sid = len(self.symbols)
        self.symbols[f"{base}_{sid}"] = sid
        return sid

    def add_rule(self, rule_id: int, rule: Rule, pos: int) -> None:
        self.n_elements += len(rule)
        if self.n_elements > MAX_ELEMENTS:
            raise self.fail(f"the grammar is too large (over {MAX_ELEMENTS} elements)", pos)
        while len(self.rules) <= rule_id:
            self.rules.append(None)
        self.rules[rule_id] = rule

    def alternates(self, pos: int, name: str, rule_id: int, nested: bool) -> int:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"groups nested deeper than {MAX_NESTING}", pos)
        rule: Rule = []
        pos = self.sequence(pos, name, rule, nested)
        while self.src[pos] == "|":
            rule.append((ALT, 0))
            pos = self.space(pos + 1, True)
            pos = self.sequence(pos, name, rule, nested)
        rule.append((END, 0))
        self.add_rule(rule_id, rule, pos)
        self.depth -= 1
        return pos

    def repeat(self, rule: Rule, seq: _Seq, lo: int, hi: int | None, name: str, pos: int) -> None:
        """``handle_repetitions``: S{m,n} -> S * m, then n - m optional copies as rules."""
        if seq.last_start == len(rule):
            raise self.fail("expecting preceding item to */+/?/{", pos)
        prev = rule[seq.last_start :]
        total = hi if hi is not None and hi > 0 else (lo if lo > 0 else 1)
        if seq.n_prev_rules * total > MAX_REPETITION_THRESHOLD:
            raise self.fail(
                "number of rules that are going to be repeated multiplied by the new repetition "
                f"exceeds {MAX_REPETITION_THRESHOLD}; reduce the repetitions or rule complexity",
                pos,
            )
        if self.n_elements + len(rule) + max(lo - 1, 0) * len(prev) > MAX_ELEMENTS:
            raise self.fail(f"the grammar is too large (over {MAX_ELEMENTS} elements)", pos)
        if lo == 0:
            del rule[seq.last_start :]
        else:
            for _ in range(1, lo):
                rule.extend(prev)
        n_opt = 1 if hi is None else hi - lo
        last_rec = 0
        for i in range(n_opt):
            rec_id = self.new_symbol(name)
            rec = list(prev)
            if i > 0 or hi is None:
                rec.append((RULE_REF, rec_id if hi is None else last_rec))
            rec += [(ALT, 0), (END, 0)]
            self.add_rule(rec_id, rec, pos)
            last_rec = rec_id
        if n_opt > 0:
            rule.append((RULE_REF, last_rec))
        seq.n_prev_rules *= total

    def braces(self, pos: int, nested: bool) -> tuple[int, int | None, int]:
        """``{m}``, ``{m,}``, ``{m,n}`` after the ``{``: (m, n or None, position after)."""
        s = self.src
        pos = self.space(pos, nested)
        if not "0" <= s[pos] <= "9":
            raise self.fail("expecting an int", pos)
        end = self.int_end(pos)
        lo, hi = int(s[pos:end]), None
        pos = self.space(end, nested)
        if s[pos] == "}":
            hi = lo
            pos = self.space(pos + 1, nested)
        elif s[pos] == ",":
            pos = self.space(pos + 1, nested)
            if "0" <= s[pos] <= "9":
                end = self.int_end(pos)
                hi = int(s[pos:end])
                pos = self.space(end, nested)
            if s[pos] != "}":
                raise self.fail("expecting '}'", pos)
            pos = self.space(pos + 1, nested)
        else:
            raise self.fail("expecting ','", pos)
        if lo > MAX_REPETITION_THRESHOLD:
            raise self.fail(f"number of repetitions exceeds {MAX_REPETITION_THRESHOLD}", pos)
        if hi is not None and hi > MAX_REPETITION_THRESHOLD:
            hi = None
        return lo, hi, pos

    def token(self, pos: int) -> tuple[int, int]:
        """``<[id]>`` or ``<piece>`` (a text that must be exactly one token)."""
        s, start = self.src, pos
        if s[pos] != "<":
            raise self.fail("expecting '<'", pos)
        pos += 1
        if s[pos] == "[":
            end = self.int_end(pos + 1)
            tid = int(s[pos + 1 : end])
            if tid > 0xFFFFFFFF:
                raise self.fail("token id is too big", pos + 1)
            if s[end] != "]":
                raise self.fail("expecting ']'", end)
            if s[end + 1] != ">":
                raise self.fail("expecting '>'", end + 1)
            return tid, end + 2
        if self.tokenize is None:
            raise self.fail("no vocabulary to parse a token", start)
        while s[pos] not in "\0>":
            pos += 1
        if s[pos] != ">":
            raise self.fail("expecting '>'", pos)
        tokens = list(self.tokenize(s[start : pos + 1]))
        if len(tokens) != 1:
            raise self.fail(f"invalid token '{s[start : pos + 1]}' (not exactly one token)", start)
        return int(tokens[0]), pos + 1

    def sequence(self, pos: int, name: str, rule: Rule, nested: bool) -> int:
        seq = _Seq(len(rule))
        s = self.src
        while s[pos] != "\0":
            c = s[pos]
            if c == '"':
                pos = self.literal(pos + 1, rule, seq, nested)
            elif c == "[":
                pos = self.char_class(pos + 1, rule, seq, nested)
            elif c in "<!":
                kind = TOKEN
                if c == "!":
                    kind, pos = TOKEN_NOT, pos + 1
                tid, end = self.token(pos)
                seq.start(len(rule))
                rule.append((kind, tid))
                pos = self.space(end, nested)
            elif _is_word(c):
                end = self.name_end(pos)
                ref = self.symbol_id(s[pos:end])
                self.first_ref.setdefault(ref, pos)
                pos = self.space(end, nested)
                seq.start(len(rule))
                rule.append((RULE_REF, ref))
            elif c == "(":
                pos = self.space(pos + 1, True)
                n_before = len(self.symbols)
                sub = self.new_symbol(name)
                pos = self.alternates(pos, name, sub, True)
                seq.last_start, seq.n_prev_rules = len(rule), max(1, len(self.symbols) - n_before)
                rule.append((RULE_REF, sub))
                if s[pos] != ")":
                    raise self.fail("expecting ')'", pos)
                pos = self.space(pos + 1, nested)
            elif c == ".":
                seq.start(len(rule))
                rule.append((CHAR_ANY, 0))
                pos = self.space(pos + 1, nested)
            elif c in "*+?":
                at = pos
                pos = self.space(pos + 1, nested)
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                self.repeat(rule, seq, lo, hi, name, at)
            elif c == "{":
                at = pos
                lo, hi, pos = self.braces(pos + 1, nested)
                self.repeat(rule, seq, lo, hi, name, at)
            else:
                break
        return pos

    def literal(self, pos: int, rule: Rule, seq: _Seq, nested: bool) -> int:
        seq.start(len(rule))
        while self.src[pos] != '"':
            if self.src[pos] == "\0":
                raise self.fail("unexpected end of input (unterminated string)", pos)
            m = _PLAIN.match(self.src, pos)
            if m is not None:  # a run of plain characters at once
                rule.extend((CHAR, ord(c)) for c in m.group())
                pos = m.end()
                continue
            cp, pos = self.char(pos)
            rule.append((CHAR, cp))
        return self.space(pos + 1, nested)

    def char_class(self, pos: int, rule: Rule, seq: _Seq, nested: bool) -> int:
        s = self.src
        start_type = CHAR
        if s[pos] == "^":
            start_type, pos = CHAR_NOT, pos + 1
        seq.start(len(rule))
        while s[pos] != "]":
            if s[pos] == "\0":
                raise self.fail("unexpected end of input (unterminated character class)", pos)
            cp, pos = self.char(pos)
            rule.append((CHAR_ALT if seq.last_start < len(rule) else start_type, cp))
            if s[pos] == "-" and s[pos + 1] != "]":
                if s[pos + 1] == "\0":
                    raise self.fail("unexpected end of input", pos + 1)
                cp, pos = self.char(pos + 1)
                rule.append((CHAR_RNG_UPPER, cp))
        return self.space(pos + 1, nested)

    def rule(self, pos: int) -> int:
        end = self.name_end(pos)
        name = self.src[pos:end]
        rule_id = self.symbol_id(name)
        pos = self.space(end, False)
        if self.src[pos : pos + 3] != "::=":
            raise self.fail("expecting ::=", pos)
        pos = self.space(pos + 3, True)
        pos = self.alternates(pos, name, rule_id, False)
        if self.src[pos] == "\r":
            pos += 2 if self.src[pos + 1] == "\n" else 1
        elif self.src[pos] == "\n":
            pos += 1
        elif self.src[pos] != "\0":
            raise self.fail("expecting newline or end", pos)
        return self.space(pos, True)


class _Seq:
    """Where the last item of a sequence starts, and how many rules it expands to."""

    __slots__ = ("last_start", "n_prev_rules")

    def __init__(self, start: int) -> None:
        self.last_start, self.n_prev_rules = start, 1

    def start(self, at: int) -> None:
        self.last_start, self.n_prev_rules = at, 1


def parse_rules(text: str, tokenize: Tokenize | None = None) -> tuple[list[Rule], dict[str, int]]:
    """Rules and symbol ids of a GBNF text (``llama_grammar_parser::parse``), every
    referenced rule defined. ``tokenize`` resolves ``<piece>`` token constraints."""
    if not isinstance(text, str):
        raise GrammarError(f"the grammar must be text, not {type(text).__name__}")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is too large ({len(text)} characters, at most "
                           f"{MAX_GRAMMAR_CHARS})")  # fmt: skip
    text = text.split("\0", 1)[0]
    p = _Parser(text, tokenize)
    pos = p.space(0, True)
    while p.src[pos] != "\0":
        pos = p.rule(pos)
    names = {v: k for k, v in p.symbols.items()}
    for sid in range(len(p.symbols)):
        if sid >= len(p.rules) or p.rules[sid] is None:
            raise p.fail(f"undefined rule '{names[sid]}'", p.first_ref.get(sid, 0))
    return [r for r in p.rules if r is not None], p.symbols


def _left_recursive(rules: list[Rule]) -> int | None:
    """A rule on a left-recursive cycle (llama.cpp's ``llama_grammar_detect_left_recursion``:
    a rule reaches itself through leftmost references, skipping referenced rules that have
    an empty alternative), or None."""
    may_be_empty = [any(r[i][0] in (END, ALT) and (i == 0 or r[i - 1][0] == ALT)
                        for i in range(len(r))) for r in rules]  # fmt: skip
    left: list[list[int]] = []
    for r in rules:
        refs, leading = [], True
        for t, v in r:
            if t == RULE_REF and leading:
                refs.append(v)
                leading = may_be_empty[v]
            else:
                leading = t in (END, ALT)
        left.append(refs)
    color = [0] * len(rules)  # 0 new, 1 on the path, 2 done
    for start in range(len(rules)):
        if color[start]:
            continue
        color[start] = 1
        path = [(start, iter(left[start]))]
        while path:
            node, it = path[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                path.pop()
            elif color[nxt] == 1:
                return nxt
            elif color[nxt] == 0:
                color[nxt] = 1
                path.append((nxt, iter(left[nxt])))
    return None


def parse_grammar(text: str, root: str = "root", tokenize: Tokenize | None = None) -> Grammar:
    """A usable grammar (``llama_grammar_init_impl``): parsed, with a ``root`` rule and no
    left recursion."""
    rules, symbols = parse_rules(text, tokenize)
    if not rules:
        raise GrammarError("the grammar has no rules")
    if root not in symbols:
        raise GrammarError(f"the grammar does not define the start rule '{root}'")
    bad = _left_recursive(rules)
    if bad is not None:
        name = next(k for k, v in symbols.items() if v == bad)
        raise GrammarError(f"left recursion in rule '{name}' (not supported)")
    return Grammar(rules, symbols, symbols[root])
