"""JSON schema to GBNF, as llama.cpp's ``json_schema_to_grammar`` writes it (the same rule
names, rules and order: identical text on llama.cpp's own test schemas).

>>> print(json_schema_to_grammar({"type": "integer", "minimum": 0}))  # doctest: +SKIP
root ::= ([0] | [1-9] [0-9]{0,15})
space ::= | " " | "\\n"{1,2} [ \\t]{0,20}

Errors are :class:`JsonSchemaError` naming the JSON path; a ``pattern`` with no grammar
equivalent accepts any string, with a :class:`JsonSchemaWarning`.
"""

from __future__ import annotations

import re
import sys
import warnings
from typing import Any

from .parser import MAX_GRAMMAR_CHARS
from .schema_nodes import (
    ALL_OF,
    ANY,
    ANY_OF,
    ARRAY,
    CONST,
    ENUM,
    F_UUID,
    INT64_MAX,
    INT64_MIN,
    INT_MAX,
    MAX_DEPTH,
    OBJECT,
    REF,
    STRING,
    TUPLE,
    JsonSchemaError,
    Node,
    build_schema,
    dump_json,
    load_schema,
)
from .schema_rules import (
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    SPACE_RULE,
    STRING_FORMAT_RULES,
    InvalidPattern,
    PatternRules,
    UnsupportedPattern,
    build_repetition,
    format_literal,
    min_max_int,
    not_strings,
)

__all__ = ["GrammarBuilder", "JsonSchemaError", "JsonSchemaWarning", "json_schema_to_grammar"]

_INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")


class JsonSchemaWarning(UserWarning):
    """Part of a schema was widened (a ``pattern`` the grammar cannot express)."""


def _sub(name: str, suffix: str) -> str:
    return f"{name}-{suffix}" if name else suffix


class _Converter:
    """``common_chat_schema_converter`` (``dotall`` off)."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {"space": SPACE_RULE}
        self.resolving: set[str] = set()
        self.errors: list[tuple[str, str]] = []  # (JSON path, message)
        self.warnings: list[str] = []
        self.depth = 0

    def add_rule(self, name: str, rule: str) -> str:
        esc = _INVALID_RULE_CHARS.sub("-", name)
        if self.rules.get(esc, rule) == rule:
            self.rules[esc] = rule
            return esc
        i = 0
        while f"{esc}{i}" in self.rules and self.rules[f"{esc}{i}"] != rule:
            i += 1
        self.rules[f"{esc}{i}"] = rule
        return f"{esc}{i}"

    def add_primitive(self, name: str, key: str = "") -> str:
        """The built-in rule ``key`` (default: ``name``) as ``name``, and what it uses."""
        content, deps = PRIMITIVE_RULES.get(key or name) or STRING_FORMAT_RULES[key or name]
        n = self.add_rule(name, content)
        for dep in deps:
            if dep not in self.rules:
                self.add_primitive(dep)
        return n

    def visit_primitive(self, rule_name: str, type_: str) -> str:
        return self.add_primitive("root" if rule_name == "root" else type_, type_)

    def visit_pattern(self, pattern: str, name: str, path: str) -> str:
        snapshot = dict(self.rules)
        try:
            return PatternRules(pattern, name, self.add_rule).rule()
        except UnsupportedPattern as e:
            self.rules = snapshot
            self.warnings.append(f"pattern {pattern} is not supported ({e}), accepting any string")
            return self.add_rule(name, self.add_primitive("string"))
        except InvalidPattern as e:
            self.rules = snapshot
            self.errors.append((path, f"Invalid pattern {pattern}: {e}"))
            return ""

    def resolve_ref(self, node: Node) -> str:
        ref = node.ref
        fragment = ref[ref.find("#") + 1 :] if "#" in ref else ref
        name = "ref" + _INVALID_RULE_CHARS.sub("-", fragment)
        if name not in self.rules and ref not in self.resolving:
            if node.target is None:
                self.errors.append((node.path, f"Unresolved $ref {ref}"))
                return ""
            self.resolving.add(ref)
            name = self.visit(node.target, name)
            self.resolving.discard(ref)
        return name

    def object_rule(
        self, props: list[tuple[str, Node]], required: set[str], name: str, extra: Node | None
    ) -> str:
        """``_build_object_rule``: required properties in order, then the optional ones in
        order (any of them may start, the rest follow in order), then ``additional``."""
        req: list[str] = []
        opt: list[str] = []
        kv: dict[str, str] = {}
        for prop, schema in props:
            value = self.visit(schema, _sub(name, prop))
            kv[prop] = self.add_rule(_sub(name, prop + "-kv"),
                                     f'{format_literal(dump_json(prop))} space ":" space {value}')  # fmt: skip
            (req if prop in required else opt).append(prop)
        if extra is not None:
            sub = _sub(name, "additional")
            value = (self.visit(extra, sub + "-value") if extra.kind != ANY
                     else self.add_primitive("value"))  # fmt: skip
            names = [p for p, _ in props]
            key = (self.add_rule(sub + "-k", not_strings(names, self.add_primitive("char")))
                   if names else self.add_primitive("string"))  # fmt: skip
            kv["*"] = self.add_rule(sub + "-kv", f'{key} ":" space {value}')
            opt.append("*")
        if not req and not opt:
            return '"{" space "}"'
        rule = '"{" space ' + ' "," space '.join(kv[p] for p in req)
        if opt:
            rule += " (" + (' "," space ( ' if req else "")
            rule += " | ".join(self.optional_chains(opt, kv, name))
            rule += (" )" if req else "") + " )?"
        return rule + ' space "}"'

    def optional_chains(self, opt: list[str], kv: dict[str, str], name: str) -> list[str]:
        """For each optional property, the chain that starts with it (llama.cpp's
        ``get_recursive_refs``; the ``-rest`` rules are added in its order, innermost first)."""
        n = len(opt)
        rest: list[str] = [""] * n
        for j in range(n - 2, -1, -1):
            k = opt[j + 1]
            body = f'( "," space {kv[k]} )' + ("*" if k == "*" else "?")
            if j + 1 < n - 1:
                body += " " + rest[j + 1]
            rest[j] = self.add_rule(_sub(name, opt[j] + "-rest"), body)
        chains = []
        for i, k in enumerate(opt):
            chain = kv[k] + (f' ( "," space {kv[k]} )*' if k == "*" else "")
            chains.append(chain + (" " + rest[i] if i < n - 1 else ""))
        return chains

    def visit_all_of(self, node: Node, name: str, rule_name: str) -> str:
        required: set[str] = set()
        props: list[tuple[str, Node]] = []
        enum_counts: dict[str, int] = {}

        def add(comp: Node, is_required: bool, seen: frozenset = frozenset()) -> None:
            if comp.kind == REF and comp.target is not None:
                if id(comp.target) in seen:
                    raise JsonSchemaError(comp.path, f"allOf: $ref {comp.ref} refers to itself")
                add(comp.target, is_required, seen | {id(comp.target)})
            elif comp.kind == OBJECT:
                for prop, schema, _ in comp.properties:
                    props.append((prop, schema))
                    if is_required:
                        required.add(prop)
            elif comp.kind == ENUM:
                for v in comp.values:
                    lit = format_literal(dump_json(v))
                    enum_counts[lit] = enum_counts.get(lit, 0) + 1

        for child in node.children:
            for alt in child.children if child.kind == ANY_OF else [child]:
                add(alt, child.kind != ANY_OF)
        common = [v for v in sorted(enum_counts) if enum_counts[v] == len(node.children)]
        if common:
            return self.add_rule(rule_name, "(" + " | ".join(common) + ")")
        return self.add_rule(rule_name, self.object_rule(props, required, name, None))

    def visit(self, node: Node, name: str) -> str:
        if self.depth >= 2 * MAX_DEPTH:
            raise JsonSchemaError(node.path, "the schema is nested too deeply "
                                  f"(over {2 * MAX_DEPTH} levels through $ref)")  # fmt: skip
        self.depth += 1
        try:
            rule_name = f"{name}-" if name in RESERVED_NAMES else (name or "root")
            return self.visit_node(node, name, rule_name)
        finally:
            self.depth -= 1

    def visit_node(self, node: Node, name: str, rule_name: str) -> str:
        k = node.kind
        if k == REF:
            return self.add_rule(rule_name, self.resolve_ref(node))
        if k == ANY_OF:
            alts = [self.visit(c, f"{name}-{i}" if name else f"alternative-{i}")
                    for i, c in enumerate(node.children)]  # fmt: skip
            return self.add_rule(rule_name, " | ".join(alts))
        if k == ALL_OF:
            return self.visit_all_of(node, name, rule_name)
        if k == CONST:
            return self.add_rule(rule_name, format_literal(dump_json(node.value)))
        if k == ENUM:
            values = " | ".join(format_literal(dump_json(v)) for v in node.values)
            return self.add_rule(rule_name, f"({values})")
        if k == OBJECT:
            if not node.properties and node.additional is not None and node.additional.kind == ANY:
                return self.add_rule(rule_name, self.add_primitive("object"))
            props = [(p, s) for p, s, _ in node.properties]
            required = {p for p, _, r in node.properties if r}
            return self.add_rule(
                rule_name, self.object_rule(props, required, name, node.additional)
            )
        if k == TUPLE:
            items = ' "," space '.join(self.visit(c, _sub(name, f"tuple-{i}"))
                                       for i, c in enumerate(node.children))  # fmt: skip
            return self.add_rule(rule_name, f'"[" space {items} space "]"')
        if k == ARRAY:
            return self.visit_array(node, name, rule_name)
        if k == STRING:
            return self.visit_string(node, rule_name)
        if k == "integer" and (node.minimum != INT64_MIN or node.maximum != INT64_MAX):
            return self.add_rule(rule_name, f"({min_max_int(node.minimum, node.maximum)})")
        if k == ANY:
            return self.add_rule(rule_name, self.add_primitive("value"))
        return self.visit_primitive(rule_name, k)  # integer, number, boolean, null

    def visit_array(self, node: Node, name: str, rule_name: str) -> str:
        assert node.items is not None
        if node.items.kind == ANY and node.min_len == 0 and node.max_len < 0:
            return self.visit_primitive(rule_name, "array")
        item = self.visit(node.items, _sub(name, "item"))
        hi = INT_MAX if node.max_len < 0 else node.max_len
        body = build_repetition(item, node.min_len, hi, '"," space')
        return self.add_rule(rule_name, f'"[" space {body} space "]"')

    def visit_string(self, node: Node, rule_name: str) -> str:
        if node.pattern:
            return self.visit_pattern(node.pattern, rule_name, node.path)
        if node.format == F_UUID:
            return self.visit_primitive(rule_name, "uuid")
        if node.format:
            return self.add_rule(rule_name, self.add_primitive(f"{node.format}-string"))
        if node.min_len > 0 or node.max_len >= 0:
            char = self.add_primitive("char")
            hi = INT_MAX if node.max_len < 0 else node.max_len
            return self.add_rule(
                rule_name, f'"\\"" {build_repetition(char, node.min_len, hi)} "\\""'
            )
        return self.visit_primitive(rule_name, "string")

    def grammar(self) -> str:
        return "".join(f"{k} ::= {self.rules[k]}\n" for k in sorted(self.rules))


def json_schema_to_grammar(schema: str | bytes | dict | Any) -> str:
    """GBNF for the JSON values ``schema`` (JSON text, or parsed) allows, with llama.cpp's
    rules. Raises :class:`JsonSchemaError`; warns :class:`JsonSchemaWarning` for a pattern
    that widens to any string."""
    if sys.getrecursionlimit() < 4000:  # MAX_DEPTH levels of a few Python frames each
        sys.setrecursionlimit(4000)
    conv = _Converter()
    conv.visit(build_schema(load_schema(schema)), "")
    if conv.errors:
        raise JsonSchemaError(conv.errors[0][0], "; ".join(m for _, m in conv.errors))
    if conv.warnings:
        warnings.warn("JSON schema conversion was incomplete: " + "; ".join(conv.warnings),
                      JsonSchemaWarning, stacklevel=2)  # fmt: skip
    text = conv.grammar()
    if len(text) > MAX_GRAMMAR_CHARS:
        raise JsonSchemaError("#", f"the schema's grammar is too large ({len(text)} characters, "
                              f"at most {MAX_GRAMMAR_CHARS})")  # fmt: skip
    return text


class GrammarBuilder:
    """One GBNF from several schemas and hand-written rules (the tool-call grammars):
    ``schema(s, name)`` adds the rules of a JSON schema under ``name`` and returns the rule
    to reference, ``rule(name, body)`` adds a rule, ``grammar()`` is the text."""

    def __init__(self) -> None:
        if sys.getrecursionlimit() < 4000:
            sys.setrecursionlimit(4000)
        self._conv = _Converter()

    def schema(self, schema: Any, name: str) -> str:
        conv = self._conv
        ref = conv.visit(build_schema(load_schema(schema)), name)
        if conv.errors:
            raise JsonSchemaError(conv.errors[0][0], "; ".join(m for _, m in conv.errors))
        return ref

    def rule(self, name: str, body: str) -> str:
        return self._conv.add_rule(name, body)

    def grammar(self) -> str:
        text = self._conv.grammar()
        if len(text) > MAX_GRAMMAR_CHARS:
            raise JsonSchemaError("#", f"the grammar is too large ({len(text)} characters, "
                                  f"at most {MAX_GRAMMAR_CHARS})")  # fmt: skip
        return text
