"""JSON schemas as llama.cpp reads them (``common/json-schema.cpp``): a tree of nodes over
the subset the grammar converter handles, with ``$ref`` resolved inside the document.

Every node keeps the JSON path it was read at (``#/properties/a/items``, or the ``$ref``
it is the target of); :class:`JsonSchemaError` names that path. Beyond llama.cpp, whose
recursion has no bound, schemas nested deeper than :data:`MAX_DEPTH` or with more than
:data:`MAX_NODES` nodes are refused with the path where the bound was crossed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..errors import UsageError

MAX_DEPTH = 256  # nested schemas, $ref targets included
MAX_NODES = 200_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT_MAX = 2**31 - 1

# node kinds (common_chat_schema::node_kind)
ANY, REF, ANY_OF, ALL_OF, CONST, ENUM = "any", "ref", "anyOf", "allOf", "const", "enum"
NULL, BOOLEAN, NUMBER, INTEGER, STRING = "null", "boolean", "number", "integer", "string"
ARRAY, TUPLE, OBJECT = "array", "tuple", "object"
# string formats
F_NONE, F_UUID, F_DATE, F_TIME, F_DATE_TIME = "", "uuid", "date", "time", "date-time"


class JsonSchemaError(UsageError):
    """A JSON schema that cannot become a grammar; ``path`` is the JSON path of the problem
    (``#`` the whole schema)."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(f"JSON schema error at {path}: {message}")


@dataclass(eq=False, slots=True)
class Node:
    kind: str
    path: str
    children: list[Node] = field(default_factory=list)  # anyOf, allOf, tuple items
    value: Any = None  # const
    values: list[Any] = field(default_factory=list)  # enum
    ref: str = ""
    target: Node | None = None
    pattern: str = ""
    format: str = F_NONE
    min_len: int = 0  # minLength / minItems
    max_len: int = -1  # maxLength / maxItems, -1 unbounded
    items: Node | None = None
    minimum: int = INT64_MIN
    maximum: int = INT64_MAX
    properties: list[tuple[str, Node, bool]] = field(default_factory=list)
    additional: Node | None = None  # None: no additional properties


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _stoull(s: str) -> int | None:
    """``std::stoull``: leading blanks, digits, trailing text ignored; None when it throws."""
    m = re.match(r"[ \t\n\v\f\r]*([+-]?)(\d+)", s)
    if m is None or m.group(1) == "-" or int(m.group(2)) > 2**64 - 1:
        return None
    return int(m.group(2))


class _Builder:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.refs: dict[str, Node | None] = {}
        self.pending: list[Node] = []
        self.depth = 0
        self.n_nodes = 0

    def node(self, kind: str, path: str, **kw: Any) -> Node:
        self.n_nodes += 1
        if self.n_nodes > MAX_NODES:
            raise JsonSchemaError(path, f"the schema is too large (over {MAX_NODES} nodes)")
        return Node(kind, path, **kw)

    def count(self, schema: dict, key: str, path: str, default: int) -> int:
        if key not in schema:
            return default
        v = schema[key]
        if not _is_int(v) or v < 0 or v > INT_MAX:
            raise JsonSchemaError(path, f"{key} must be a non-negative integer")
        return v

    def lengths(self, node: Node, schema: dict, what: str) -> Node:
        """``min{what}`` / ``max{what}`` (Items, Length) into the node."""
        node.min_len = self.count(schema, f"min{what}", node.path, 0)
        node.max_len = self.count(schema, f"max{what}", node.path, -1)
        return node

    def bound(self, schema: dict, key: str, path: str, round_up: bool) -> int:
        v = schema[key]
        if not _is_int(v):
            if isinstance(v, bool) or not isinstance(v, float):
                raise JsonSchemaError(path, f"{key} must be a number")
            if not math.isfinite(v):
                raise JsonSchemaError(path, f"{key} must be a finite number")
            v = math.ceil(v) if round_up else math.floor(v)
        if not INT64_MIN <= v <= INT64_MAX:
            raise JsonSchemaError(path, f"{key} is out of the 64-bit integer range")
        return v

    @staticmethod
    def format(schema: dict, path: str) -> str:
        if "format" not in schema:
            return F_NONE
        f = schema["format"]
        if not isinstance(f, str):
            raise JsonSchemaError(path, "format must be a string")
        if f in (F_DATE, F_TIME, F_DATE_TIME):
            return f
        if f == "uuid" or (len(f) == 5 and f.startswith("uuid") and "1" <= f[4] <= "5"):
            return F_UUID
        return F_NONE

    def resolve(self, ref: str, path: str) -> Any:
        target = self.root
        for sel in ref[1:].split("/")[1:]:
            if isinstance(target, dict) and sel in target:
                target = target[sel]
            elif isinstance(target, list):
                idx = _stoull(sel)
                if idx is None or idx >= len(target):
                    raise JsonSchemaError(path, f"cannot resolve $ref {ref}, {sel} is out of range")
                target = target[idx]
            else:
                raise JsonSchemaError(path, f"cannot resolve $ref {ref}, {sel} not found")
        return target

    def build_ref(self, value: Any, path: str) -> Node:
        if not isinstance(value, str):
            raise JsonSchemaError(path, "$ref must be a string")
        if value != "#" and not value.startswith("#/"):  # "#": the whole document
            raise JsonSchemaError(path, f"unsupported $ref {value}, only references into "
                                  "the same document are supported")  # fmt: skip
        if value not in self.refs:
            self.refs[value] = None  # a cycle back to this $ref stops here
            self.refs[value] = self.build(self.resolve(value, path), value)
        node = self.node(REF, path, ref=value)
        self.pending.append(node)
        return node

    def alternatives(self, kind: str, alts: Any, path: str) -> Node:
        if not isinstance(alts, list):
            raise JsonSchemaError(path, "must be an array of schemas")
        if not alts:
            raise JsonSchemaError(path, "must not be empty")
        node = self.node(kind, path)
        # an alternative that is the schema false matches nothing: it is left out
        node.children = [self.build(a, f"{path}/{i}") for i, a in enumerate(alts) if a is not False]
        if not node.children:
            raise JsonSchemaError(path, "every alternative is the schema false")
        return node

    def build_object(self, schema: dict, path: str) -> Node:
        node = self.node(OBJECT, path)
        req = schema.get("required")
        required = {n for n in req if isinstance(n, str)} if isinstance(req, list) else set()
        if "properties" in schema:
            props = schema["properties"]
            if not isinstance(props, dict):
                raise JsonSchemaError(path, "properties must be an object")
            # a property whose schema is false may not appear: it is left out
            node.properties = [(name, self.build(p, f"{path}/properties/{name}"),
                                name in required) for name, p in props.items()
                               if p is not False]  # fmt: skip
        if "additionalProperties" in schema:
            extra = schema["additionalProperties"]
            if isinstance(extra, bool):
                node.additional = self.node(ANY, path) if extra else None
            elif isinstance(extra, dict):
                node.additional = self.build(extra, f"{path}/additionalProperties")
            else:
                raise JsonSchemaError(path, "additionalProperties must be a boolean or a schema")
        elif "properties" not in schema:
            node.additional = self.node(ANY, path)  # {"type": "object"}: any object
        return node

    def build_array(self, schema: dict, path: str) -> Node:
        node = self.node(ARRAY, path)
        if "items" in schema or "prefixItems" in schema:
            key = "items" if "items" in schema else "prefixItems"
            items = schema[key]
            if isinstance(items, list):
                node.kind = TUPLE
                node.children = [self.build(s, f"{path}/{key}/{i}") for i, s in enumerate(items)]
                return node
            node.items = self.build(items, f"{path}/{key}")
        else:
            node.items = self.node(ANY, path)
        return self.lengths(node, schema, "Items")

    def build_string(self, schema: dict, path: str) -> Node:
        node = self.node(STRING, path)
        if "pattern" in schema:
            if not isinstance(schema["pattern"], str):
                raise JsonSchemaError(path, "pattern must be a string")
            node.pattern = schema["pattern"]
        node.format = self.format(schema, path)
        return self.lengths(node, schema, "Length")

    def build_integer(self, schema: dict, path: str) -> Node:
        node = self.node(INTEGER, path)
        if "minimum" in schema:
            node.minimum = self.bound(schema, "minimum", path, True)
        elif "exclusiveMinimum" in schema:
            node.minimum = self.bound(schema, "exclusiveMinimum", path, False) + 1
        if "maximum" in schema:
            node.maximum = self.bound(schema, "maximum", path, False)
        elif "exclusiveMaximum" in schema:
            node.maximum = self.bound(schema, "exclusiveMaximum", path, True) - 1
        if node.minimum > INT64_MAX or node.maximum < INT64_MIN:
            raise JsonSchemaError(path, "the bounds are out of the 64-bit integer range")
        return node

    def build(self, schema: Any, path: str) -> Node:
        if self.depth >= MAX_DEPTH:
            raise JsonSchemaError(path, f"the schema is nested too deeply (over {MAX_DEPTH} "
                                  "levels, $ref targets included)")  # fmt: skip
        self.depth += 1
        try:
            return self.build_node(schema, path)
        finally:
            self.depth -= 1

    def build_node(self, schema: Any, path: str) -> Node:
        if schema is True:  # the boolean schema that accepts every value
            return self.node(ANY, path)
        if schema is False:
            raise JsonSchemaError(path, "the schema false (no valid value) is supported only as "
                                  "a property's or an alternative's schema")  # fmt: skip
        if not isinstance(schema, dict):
            raise JsonSchemaError(path, "schema must be an object")
        if "$ref" in schema:
            return self.build_ref(schema["$ref"], path)
        if "oneOf" in schema or "anyOf" in schema:
            key = "oneOf" if "oneOf" in schema else "anyOf"
            return self.alternatives(ANY_OF, schema[key], f"{path}/{key}")
        t = schema.get("type")
        if isinstance(t, list):  # {"type": ["a", "b"]}: one alternative per type
            if not t:
                raise JsonSchemaError(path, "type must not be empty")
            node = self.node(ANY_OF, path)
            node.children = [self.build({**schema, "type": ti}, f"{path}/type/{i}")
                             for i, ti in enumerate(t)]  # fmt: skip
            return node
        if "const" in schema:
            return self.node(CONST, path, value=schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise JsonSchemaError(path, "enum must be a non-empty array")
            return self.node(ENUM, path, values=list(values))
        if t is not None and not isinstance(t, str):
            raise JsonSchemaError(path, "type must be a string or an array of strings")
        return self.build_typed(schema, t or "", path)

    def build_typed(self, schema: dict, t: str, path: str) -> Node:
        extra = schema.get("additionalProperties")
        has_props = "properties" in schema or ("additionalProperties" in schema
                                               and extra is not True)  # fmt: skip
        if not t:  # the structural keywords decide, in the converter's order
            if has_props:
                return self.build_object(schema, path)
            if "allOf" in schema:
                return self.alternatives(ALL_OF, schema["allOf"], f"{path}/allOf")
            if "items" in schema or "prefixItems" in schema:
                return self.build_array(schema, path)
            if any(k in schema for k in ("pattern", "minLength", "maxLength")) or (
                self.format(schema, path) != F_NONE
            ):
                return self.build_string(schema, path)
            return self.node(ANY, path)
        if t in ("object", "string") and "allOf" in schema and not (t == "object" and has_props):
            return self.alternatives(ALL_OF, schema["allOf"], f"{path}/allOf")
        builders = {"object": self.build_object, "string": self.build_string,
                    "array": self.build_array, "integer": self.build_integer}  # fmt: skip
        if t in builders:
            return builders[t](schema, path)
        if t in (NUMBER, BOOLEAN, NULL):
            return self.node(t, path)
        raise JsonSchemaError(path, f"unrecognized type {t}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def load_schema(schema: str | bytes | dict | Any) -> Any:
    """A schema given as JSON text, or already as Python values."""
    if not isinstance(schema, (str, bytes, bytearray)):
        return schema
    try:
        return json.loads(schema, parse_constant=_reject_constant)
    except RecursionError:
        raise JsonSchemaError("#", "the schema is nested too deeply to read") from None
    except ValueError as e:  # JSONDecodeError is a ValueError
        raise JsonSchemaError("#", f"not valid JSON: {e}") from None


def build_schema(schema: Any) -> Node:
    """``common_chat_schema_from_json``: the root node; every ``$ref`` has its target."""
    b = _Builder(schema)
    root = b.build(schema, "#")
    for node in b.pending:
        node.target = b.refs[node.ref]
    return root


def dump_json(v: Any) -> str:
    """``nlohmann::ordered_json::dump()``: compact, UTF-8 kept, keys in their order, numbers
    as nlohmann writes them (``1.0``, ``1e+16``)."""
    if v is None or isinstance(v, bool):
        return "null" if v is None else ("true" if v else "false")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _dump_float(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(dump_json(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(f"{dump_json(str(k))}:{dump_json(x)}" for k, x in v.items()) + "}"
    raise JsonSchemaError("#", f"not a JSON value: {type(v).__name__}")


def _dump_float(x: float) -> str:
    """nlohmann's ``dtoa``: the shortest digits, fixed notation for decimal exponents in
    (-4, 15], else ``d.ddde+XX``."""
    if not math.isfinite(x):
        return "null"
    if x == 0.0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    _sign, digits_t, exp = Decimal(repr(abs(x))).as_tuple()
    digits = "".join(map(str, digits_t)).rstrip("0")
    exp += len(digits_t) - len(digits)  # value = digits * 10**exp
    k, n = len(digits), len(digits) + int(exp)
    s = "-" if x < 0 else ""
    if k <= n <= 15:
        return f"{s}{digits}{'0' * (n - k)}.0"
    if 0 < n <= 15:
        return f"{s}{digits[:n]}.{digits[n:]}"
    if -4 < n <= 0:
        return f"{s}0.{'0' * -n}{digits}"
    e = n - 1
    mant = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{s}{mant}e{'-' if e < 0 else '+'}{abs(e):02d}"
