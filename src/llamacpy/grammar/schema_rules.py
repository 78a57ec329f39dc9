"""GBNF text pieces of llama.cpp's ``json-schema-to-grammar.cpp``: primitive rules,
repetitions, integer ranges, literals, "none of these strings", and anchored regular
expressions as rules. The text is llama.cpp's to the character."""

from __future__ import annotations

import re
from collections.abc import Callable

from .schema_nodes import INT64_MAX, INT64_MIN, INT_MAX

SPACE_RULE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

# name -> (content, dependencies)
PRIMITIVE_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "boolean": ('("true" | "false")', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": (
        '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)?',
        ("integral-part", "decimal-part"),
    ),
    "integer": ('("-"? integral-part)', ("integral-part",)),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": (
        '"{" space ( string ":" space value ("," space string ":" space value)* )? space "}"',
        ("string", "value"),
    ),
    "array": ('"[" space ( value ("," space value)* )? space "]"', ("value",)),
    "uuid": (
        '"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
        '[0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\""',
        (),
    ),
    "char": ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "null": ('"null"', ()),
}
STRING_FORMAT_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "date": (
        '[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
        (),
    ),
    "time": (
        '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
        '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
        (),
    ),
    "date-time": ('date "T" time', ("date", "time")),
    "date-string": ('"\\"" date "\\""', ("date",)),
    "time-string": ('"\\"" time "\\""', ("time",)),
    "date-time-string": ('"\\"" date-time "\\""', ("date-time",)),
}
RESERVED_NAMES = frozenset({"root", *PRIMITIVE_RULES, *STRING_FORMAT_RULES})

_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}


def format_literal(text: str) -> str:
    """A GBNF string literal (``\\r``, ``\\n``, ``"`` and ``\\`` escaped)."""
    return '"' + re.sub(r'[\r\n"\\]', lambda m: _LITERAL_ESCAPES[m.group()], text) + '"'


def build_repetition(item: str, lo: int, hi: int, separator: str = "") -> str:
    """``item`` repeated ``lo`` to ``hi`` times (``hi == INT_MAX``: unbounded)."""
    has_max = hi != INT_MAX
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return item + "?"
    if not separator:
        if lo == 1 and not has_max:
            return item + "+"
        if lo == 0 and not has_max:
            return item + "*"
        return f"{item}{{{lo},{hi if has_max else ''}}}"
    rest = build_repetition(f"({separator} {item})", 0 if lo == 0 else lo - 1,
                            hi - 1 if has_max else hi)  # fmt: skip
    result = f"{item} {rest}"
    return f"({result})?" if lo == 0 else result


def gbnf_escape_length(pattern: str, pos: int) -> int:
    """Length of a GBNF escape at ``pos`` (``\\xHH``, ``\\uHHHH``, ``\\UHHHHHHHH``, or one
    of ``\\t \\r \\n \\\\ \\" \\[ \\] \\-``), 0 if there is none."""
    if pos + 1 >= len(pattern) or pattern[pos] != "\\":
        return 0
    c = pattern[pos + 1]
    if c in 'trn\\"[]-':
        return 2
    n_hex = {"x": 2, "u": 4, "U": 8}.get(c, 0)
    if n_hex == 0 or pos + 2 + n_hex > len(pattern):
        return 0
    digits = pattern[pos + 2 : pos + 2 + n_hex]
    return 2 + n_hex if all(h in "0123456789abcdefABCDEF" for h in digits) else 0


class _IntRange:
    """``build_min_max_int``: an integer in [lo, hi] as digit ranges (INT64_MIN / INT64_MAX:
    unbounded), at most 16 digits where unbounded."""

    def __init__(self) -> None:
        self.out: list[str] = []

    def digit_range(self, a: str, b: str) -> None:
        self.out.append(f"[{a}]" if a == b else f"[{a}-{b}]")

    def more_digits(self, lo: int, hi: int) -> None:
        self.out.append("[0-9]")
        if lo == hi == 1:
            return
        self.out.append(f"{{{lo}" + ("" if hi == lo else "," + ("" if hi == INT_MAX else str(hi)))
                        + "}")  # fmt: skip

    def uniform(self, a: str, b: str) -> None:
        out, i = self.out, 0
        while i < len(a) and i < len(b) and a[i] == b[i]:
            i += 1
        if i > 0:
            out.append(f'"{a[:i]}"')
        if i >= len(a) or i >= len(b):
            return
        if i > 0:
            out.append(" ")
        sub_len = len(a) - i - 1
        if sub_len <= 0:
            out.append(f"[{a[i]}-{b[i]}]")
            return
        a_sub, b_sub, zeros, nines = a[i + 1 :], b[i + 1 :], "0" * sub_len, "9" * sub_len
        to_reached = False
        out.append("(")
        if a_sub == zeros:
            self.digit_range(a[i], chr(ord(b[i]) - 1))
            out.append(" ")
            self.more_digits(sub_len, sub_len)
        else:
            out.append(f"[{a[i]}] (")
            self.uniform(a_sub, nines)
            out.append(")")
            if ord(a[i]) < ord(b[i]) - 1:
                out.append(" | ")
                to_reached = b_sub == nines
                self.digit_range(chr(ord(a[i]) + 1), b[i] if to_reached else chr(ord(b[i]) - 1))
                out.append(" ")
                self.more_digits(sub_len, sub_len)
        if not to_reached:
            out.append(" | ")
            self.digit_range(b[i], b[i])
            out.append(" ")
            self.uniform(zeros, b_sub)
        out.append(")")

    def bounded(self, lo: int, hi: int, decimals: int) -> None:
        if lo < 0 and hi < 0:
            self.out.append('"-" (')
            self.build(-hi, -lo, decimals, True)
            self.out.append(")")
            return
        if lo < 0:
            self.out.append('"-" (')
            self.build(0, -lo, decimals, True)
            self.out.append(") | ")
            lo = 0
        lo_s, hi_s = str(lo), str(hi)
        for digits in range(len(lo_s), len(hi_s)):
            self.uniform(lo_s, "9" * digits)
            lo_s = "1" + "0" * digits
            self.out.append(" | ")
        self.uniform(lo_s, hi_s)

    def min_only(self, lo: int, decimals: int, top: bool) -> None:
        less = max(decimals - 1, 1)
        out = self.out
        if lo < 0:
            out.append('"-" (')
            self.build(INT64_MIN, -lo, decimals, False)
            out.append(") | [0] | [1-9] ")
            self.more_digits(0, decimals - 1)
        elif lo == 0:
            if top:
                out.append("[0] | [1-9] ")
                self.more_digits(0, less)
            else:
                self.more_digits(1, decimals)
        elif lo <= 9:
            c, start = str(lo), "1" if top else "0"
            if c > start:
                self.digit_range(start, chr(ord(c) - 1))
                out.append(" ")
                self.more_digits(1, less)
                out.append(" | ")
            self.digit_range(c, "9")
            out.append(" ")
            self.more_digits(0, less)
        else:
            s = str(lo)
            c = s[0]
            if c > "1":
                self.digit_range("1" if top else "0", chr(ord(c) - 1))
                out.append(" ")
                self.more_digits(len(s), less)
                out.append(" | ")
            self.digit_range(c, c)
            out.append(" (")
            self.build(int(s[1:]), INT64_MAX, less, False)
            out.append(")")
            if c < "9":
                out.append(" | ")
                self.digit_range(chr(ord(c) + 1), "9")
                out.append(" ")
                self.more_digits(len(s) - 1, less)

    def build(self, lo: int, hi: int, decimals: int = 16, top: bool = True) -> None:
        has_min, has_max = lo != INT64_MIN, hi != INT64_MAX
        if has_min and has_max:
            self.bounded(lo, hi, decimals)
        elif has_min:
            self.min_only(lo, decimals, top)
        elif has_max and hi >= 0:
            if top:
                self.out.append('"-" [1-9] ')
                self.more_digits(0, max(decimals - 1, 1))
                self.out.append(" | ")
            self.build(0, hi, decimals, True)
        elif has_max:
            self.out.append('"-" (')
            self.build(-hi, INT64_MAX, decimals, False)
            self.out.append(")")
        else:
            raise ValueError("At least one of min_value or max_value must be set")


def min_max_int(lo: int, hi: int) -> str:
    r = _IntRange()
    r.build(lo, hi)
    return "".join(r.out)


def not_strings(strings: list[str], char_rule: str) -> str:
    """A JSON string that is none of ``strings`` (``_not_strings``, over a trie of code
    points; built without recursion, so a long key cannot overflow the stack)."""
    root: dict = {}
    ends = set()
    for s in strings:
        node = root
        for ch in s:
            node = node.setdefault(ch, {})
        ends.add(id(node))
    out = ['["] ( ']
    stack: list = [(root, sorted(root.items()), 0)]
    while stack:
        item = stack.pop()
        if item is None:
            out.append(")")
            continue
        node, kids, i = item
        if i < len(kids):
            ch, child = kids[i]
            out.append(("" if i == 0 else " | ") + f"[{ch}]")
            stack.append((node, kids, i + 1))
            if child:
                out.append(" (")
                stack.append(None)
                stack.append((child, sorted(child.items()), 0))
            else:
                out.append(f" {char_rule}+")
        elif kids:
            out.append(f' | [^"{"".join(k for k, _ in kids)}] {char_rule}*')
    out.append(" )" + ("" if id(root) in ends else "?") + ' ["]')
    return "".join(out)


class UnsupportedPattern(Exception):
    """A valid regular expression with no grammar equivalent (becomes any string)."""


class InvalidPattern(Exception):
    """Not a valid regular expression (an error)."""


MAX_PATTERN_DEPTH = 100
_NON_LITERAL = set("|.()[]{}*+?^$")
_ESCAPED_IN_REGEX_ONLY = set("^$.[]()|{}*+?")
_STOI = re.compile(r"[ \t\n\v\f\r]*[+-]?\d+")


def _stoi(s: str) -> int:
    m = _STOI.match(s)
    if m is None or not -(2**31) <= int(m.group()) <= INT_MAX:
        raise UnsupportedPattern("invalid number in curly brackets")
    return int(m.group())


class PatternRules:
    """``_pattern_to_rule``: an anchored regular expression (``^...$``) as a rule for the
    JSON string it matches. ``add_rule`` is the converter's."""

    def __init__(self, pattern: str, name: str, add_rule: Callable[[str, str], str]) -> None:
        if len(pattern) < 2 or pattern[0] != "^" or pattern[-1] != "$":
            raise UnsupportedPattern("not anchored with '^' and '$'")
        self.s, self.name, self.add_rule = pattern[1:-1], name, add_rule
        self.i = self.depth = 0
        self.sub_ids: dict[str, str] = {}

    def rule(self) -> str:
        body = _to_rule(self.transform())
        if self.depth != 0:
            raise InvalidPattern("unbalanced parentheses")
        return self.add_rule(self.name, f'"\\"" ({body}) "\\""')

    def transform(self) -> tuple[str, bool]:
        seq: list[tuple[str, bool]] = []
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c == ".":
                seq.append((self.add_rule("dot", "[^\\x0A\\x0D]"), False))
                self.i += 1
            elif c == "(":
                self.group(seq)
            elif c == ")":
                self.i += 1
                if self.depth == 0:
                    raise InvalidPattern("unbalanced parentheses")
                self.depth -= 1
                return _join_seq(seq)
            elif c in "^$":
                raise UnsupportedPattern("anchor inside the pattern")
            elif c == "[":
                seq.append((self.char_class(), False))
            elif c == "|":
                seq.append(("|", False))
                self.i += 1
            elif c in "*+?":
                if not seq:
                    raise InvalidPattern("nothing to repeat")
                seq[-1] = (_to_rule(seq[-1]) + c, False)
                self.i += 1
            elif c == "{":
                self.braces(seq)
            else:
                seq.append((self.literal(c), True))
        return _join_seq(seq)

    def group(self, seq: list[tuple[str, bool]]) -> None:
        s = self.s
        self.i += 1
        if self.i < len(s) and s[self.i] == "?":
            if self.i + 1 < len(s) and s[self.i + 1] == ":":
                self.i += 2  # a non-capturing group is a group
            else:
                raise UnsupportedPattern("unsupported group syntax")
        self.depth += 1
        if self.depth > MAX_PATTERN_DEPTH:
            raise UnsupportedPattern("pattern nesting too deep")
        seq.append(("(" + _to_rule(self.transform()) + ")", False))

    def char_class(self) -> str:
        s, out = self.s, ["["]
        self.i += 1
        while self.i < len(s) and s[self.i] != "]":
            if s[self.i] == "\\":
                n = gbnf_escape_length(s, self.i)
                if n == 0:
                    raise UnsupportedPattern(
                        f"unsupported escape in character class: {s[self.i : self.i + 2]}"
                    )
                out.append(s[self.i : self.i + n])
                self.i += n
            else:
                out.append(s[self.i])
                self.i += 1
        if self.i >= len(s):
            raise InvalidPattern("unterminated character class")
        self.i += 1
        return "".join(out) + "]"

    def braces(self, seq: list[tuple[str, bool]]) -> None:
        s = self.s
        end = s.find("}", self.i + 1)
        if end < 0:
            raise UnsupportedPattern("unterminated curly brackets")
        nums = s[self.i + 1 : end].split(",")
        self.i = end + 1
        if len(nums) not in (1, 2):
            raise UnsupportedPattern("wrong number of values in curly brackets")
        if len(nums) == 1:
            lo = hi = _stoi(nums[0])
        else:
            lo = _stoi(nums[0]) if nums[0] else 0
            hi = _stoi(nums[1]) if nums[1] else INT_MAX
        if not seq:
            raise InvalidPattern("nothing to repeat")
        sub, is_literal = seq[-1]
        if not is_literal:
            if sub not in self.sub_ids:
                self.sub_ids[sub] = ""
                self.sub_ids[sub] = self.add_rule(f"{self.name}-{len(self.sub_ids)}", sub)
            sub = self.sub_ids[sub]
        seq[-1] = (build_repetition(f'"{sub}"' if is_literal else sub, lo, hi), False)

    def literal(self, c: str) -> str:
        s, n, out = self.s, len(self.s), []
        while self.i < n:
            ch = s[self.i]
            if ch == "\\":
                if self.i == n - 1:
                    raise InvalidPattern("trailing backslash")
                if s[self.i + 1] in _ESCAPED_IN_REGEX_ONLY:
                    out.append(s[self.i + 1])
                    self.i += 2
                    continue
                k = gbnf_escape_length(s, self.i)
                if k == 0:
                    raise UnsupportedPattern(f"unsupported escape: {s[self.i : self.i + 2]}")
                out.append(s[self.i : self.i + k])
                self.i += k
            elif ch == '"':
                out.append('\\"')
                self.i += 1
            elif ch not in _NON_LITERAL and (
                self.i == n - 1
                or not out
                or s[self.i + 1] == "."
                or s[self.i + 1] not in _NON_LITERAL
            ):
                out.append(ch)
                self.i += 1
            else:
                break
        if not out:  # nothing consumed, e.g. a stray ']' or '}'
            raise UnsupportedPattern(f"unsupported character: {c}")
        return "".join(out)


def _to_rule(item: tuple[str, bool]) -> str:
    return f'"{item[0]}"' if item[1] else item[0]


def _join_seq(seq: list[tuple[str, bool]]) -> tuple[str, bool]:
    """The sequence as rule text, consecutive literals merged into one."""
    parts: list[str] = []
    literal = ""
    for text, is_literal in seq:
        if is_literal:
            literal += text
            continue
        if literal:
            parts.append(f'"{literal}"')
            literal = ""
        parts.append(text)
    if literal:
        parts.append(f'"{literal}"')
    return " ".join(parts), False
