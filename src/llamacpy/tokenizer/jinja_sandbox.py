"""A Jinja2 sandbox for untrusted chat templates, with llama.cpp's globals and filters.

Built on :class:`jinja2.sandbox.ImmutableSandboxedEnvironment` (no attribute escapes, no
mutation of the caller's data) plus limits a sandbox alone does not give:

* wall-clock time: every loop iteration, call, filter and test checks the deadline;
* output and intermediate size: string/list repetition, concatenation (``~``, ``+``),
  ``%`` formatting, filters and methods are checked before or right after they allocate;
* ``range`` is capped, call depth (macros, recursive loops) is capped.

Lists and dicts the template builds itself may be changed (``append``, ``pop``, ...), as
llama.cpp's engine allows and some templates (Kimi K2) need; the inputs stay immutable.

The environment can also record which input values a template touched (llama.cpp's
"usage stats", used to detect a template's capabilities); see :class:`Tracked`.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import Undefined
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEnvironment,
    modifies_known_mutable,
)

from .errors import ChatTemplateError, ChatTemplateLimitError


@dataclass(frozen=True)
class Limits:
    """Resource limits for one render."""

    time_s: float = 2.0
    max_output: int = 1 << 20  # characters of output, and of any intermediate string/list
    max_range: int = 100_000
    max_depth: int = 64  # nested calls (macros, recursive loops)


class RaisedException(ChatTemplateError):
    """``raise_exception(...)`` in a template."""


# --- usage tracking (capability probes) ------------------------------------------------


class Tracked:
    """Mixin for probe values: records whether and how a template used them."""

    _used: bool
    _ops: set[str]

    def _mark(self, op: str | None = None) -> None:
        self._used = True
        if op:
            self._ops.add(op)


class TStr(str, Tracked):
    def __new__(cls, value: str) -> TStr:
        obj = super().__new__(cls, value)
        obj._used = False
        obj._ops = set()
        return obj


class TList(list, Tracked):
    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self._used = False
        self._ops = set()


class TDict(dict, Tracked):
    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self._used = False
        self._ops = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self._mark("get")
        value = super().get(key, default)
        _mark(value)
        return value


def track(value: Any) -> Any:
    """A deep copy of JSON-like data made of tracked values."""
    if isinstance(value, str):
        return TStr(value)
    if isinstance(value, list | tuple):
        return TList(track(v) for v in value)
    if isinstance(value, dict):
        return TDict({k: track(v) for k, v in value.items()})
    return value


def _mark(value: Any, op: str | None = None, deep: bool = False) -> None:
    if isinstance(value, Tracked):
        value._mark(op)
    if deep:
        if isinstance(value, dict):
            for v in value.values():
                _mark(v, deep=True)
        elif isinstance(value, list | tuple):
            for v in value:
                _mark(v, deep=True)


# --- llama.cpp-compatible helpers ----------------------------------------------------


class LlamaUndefined(Undefined):
    """Undefined the way llama.cpp's engine treats it: attribute and item access give
    undefined again, it prints and concatenates as "", iterates as empty, has length 0."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name[:2] == "__":
            raise AttributeError(name)
        return self

    def __getitem__(self, key: Any) -> Any:
        return self

    def __add__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other
        return self._fail_with_undefined_error()

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return other
        return self._fail_with_undefined_error()

    def __len__(self) -> int:
        return 0


def finalize(value: Any) -> Any:
    """How llama.cpp prints a value: none/undefined/objects as "", lists as their items
    concatenated."""
    if value is None or isinstance(value, Undefined | dict):
        return ""
    if isinstance(value, list | tuple | Iterator):
        return "".join(str(finalize(v)) for v in value)
    return value


class GenerationExtension(Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask marker):
    renders its body unchanged."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _listify(fn: Callable) -> Callable:
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return list(fn(*args, **kwargs))

    for attr in ("jinja_pass_arg",):
        if hasattr(fn, attr):
            setattr(wrapped, attr, getattr(fn, attr))
    return wrapped


def _plain(value: Any) -> Any:
    if isinstance(value, Undefined):
        raise TypeError("Object of type Undefined is not JSON serializable")
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)  # llama.cpp writes 1.0 as 1
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | Iterator):
        return [_plain(v) for v in value]
    return value


def tojson(
    value: Any,
    indent: int | None = None,
    ensure_ascii: bool = False,
    separators: tuple[str, str] | list[str] | None = None,
    sort_keys: bool = False,
) -> str:
    """``tojson`` as Python's ``json.dumps`` (llama.cpp and transformers agree), no HTML escaping."""
    if separators is not None:
        separators = tuple(separators)  # type: ignore[assignment]
    return json.dumps(
        _plain(value),
        indent=indent,
        ensure_ascii=ensure_ascii,
        separators=separators,  # type: ignore[arg-type]
        sort_keys=sort_keys,
        default=_json_default,
    )


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "__html__"):
        return str(obj)
    if isinstance(obj, set | frozenset):
        return list(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def _size(value: Any) -> int:
    if isinstance(value, str | bytes | list | tuple | dict):
        return len(value)
    return 0


# --- environment ---------------------------------------------------------------------


class SandboxEnvironment(ImmutableSandboxedEnvironment):
    """The environment chat templates run in (one render at a time)."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            extensions=[loopcontrols, GenerationExtension],
            undefined=LlamaUndefined,
            finalize=finalize,
        )
        self.limits = limits or Limits()
        self._deadline = float("inf")
        self._depth = 0
        self._frozen: set[int] = set()
        self.now = _dt.datetime.now()
        self.globals.update(
            raise_exception=self._raise_exception,
            strftime_now=self._strftime_now,
            range=self._range,
            __guard_iter=self._guard_iter,
            __guard_concat=self._guard_concat,
        )
        self.globals.pop("lipsum", None)
        self.filters["tojson"] = tojson
        self.filters["safe"] = str  # no Markup: llama.cpp has no autoescaping
        for name in ("map", "select", "reject", "selectattr", "rejectattr", "unique"):
            self.filters[name] = _listify(self.filters[name])
        self.filters = {k: self._wrap(k, f, "") for k, f in self.filters.items()}
        self.tests = {k: self._wrap(k, f, "test_is_") for k, f in self.tests.items()}

    # --- limits ---------------------------------------------------------------------

    def begin(self, frozen: Iterable[int] = ()) -> None:
        """Start a render: arm the deadline; ``frozen`` are ids of the caller's containers."""
        self._deadline = time.monotonic() + self.limits.time_s
        self._depth = 0
        self._frozen = set(frozen)

    def check_time(self) -> None:
        if time.monotonic() > self._deadline:
            raise ChatTemplateLimitError(
                f"chat template exceeded the time limit ({self.limits.time_s:g} s)"
            )

    def check_size(self, value: Any) -> Any:
        if _size(value) > self.limits.max_output:
            raise ChatTemplateLimitError(
                f"chat template built a value larger than {self.limits.max_output} items"
            )
        return value

    def _check_args(self, args: tuple, kwargs: dict) -> None:
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.limits.max_output:
                raise ChatTemplateLimitError(f"chat template argument too large: {a}")

    def _wrap(self, name: str, fn: Callable, prefix: str) -> Callable:
        env = self

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            env.check_time()
            env._check_args(args, kwargs)
            first = next((a for a in args if not _is_context(a)), None)
            _mark(first, prefix + name, deep=name in ("tojson", "string", "pprint"))
            return env.check_size(fn(*args, **kwargs))

        for attr in ("jinja_pass_arg",):
            if hasattr(fn, attr):
                setattr(wrapped, attr, getattr(fn, attr))
        return wrapped

    def _range(self, *args: int) -> Iterator[int]:
        r = range(*args)
        if len(r) > self.limits.max_range:
            raise ChatTemplateLimitError(
                f"range() of {len(r)} items exceeds the limit of {self.limits.max_range}"
            )
        return iter(r)

    def _guard_iter(self, iterable: Any) -> Iterator[Any]:
        self.check_time()
        _mark(iterable, "object_access" if isinstance(iterable, dict) else "array_access")
        for item in iterable:
            self.check_time()
            _mark(item)
            if isinstance(item, tuple):
                for x in item:
                    _mark(x)
            yield item

    def _guard_concat(self, parts: list[Any]) -> str:
        self.check_time()
        total = 0
        out = []
        for p in parts:
            s = str(p)
            total += len(s)
            if total > self.limits.max_output:
                raise ChatTemplateLimitError(
                    f"chat template built a string longer than {self.limits.max_output}"
                )
            out.append(s)
        return "".join(out)

    # --- sandbox hooks --------------------------------------------------------------

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.check_time()
        lim = self.limits.max_output
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(n, int) and _size(seq) and _size(seq) * n > lim:
                    raise ChatTemplateLimitError(
                        "chat template repeated a string or list too often"
                    )
        elif operator == "**":
            if isinstance(right, int | float) and isinstance(left, int | float):
                bits = abs(left).bit_length() if isinstance(left, int) else 64
                if abs(right) > 1 and bits * abs(right) > 1 << 16:
                    raise ChatTemplateLimitError("chat template exponent too large")
        elif operator == "+":
            if _size(left) + _size(right) > lim:
                raise ChatTemplateLimitError("chat template built a value too large")
        elif operator == "%" and isinstance(left, str):
            self._check_format(left)
        result = super().call_binop(context, operator, left, right)
        if isinstance(result, int) and result.bit_length() > 1 << 16:
            raise ChatTemplateLimitError("chat template built a number too large")
        return self.check_size(result)

    def _check_format(self, fmt: str) -> None:
        import re

        for m in re.finditer(r"\d+", fmt):
            if len(m.group()) > 6:
                raise ChatTemplateLimitError("chat template format width too large")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self.check_time()
        __self._check_args(args, kwargs)
        __self._depth += 1
        if __self._depth > __self.limits.max_depth:
            __self._depth -= 1
            raise ChatTemplateLimitError(
                f"chat template exceeded the call depth limit ({__self.limits.max_depth})"
            )
        try:
            result = SandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)
        finally:
            __self._depth -= 1
        return __self.check_size(result)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__
        env = self

        def checked(*args: Any, **kwargs: Any) -> str:
            env._check_format(fmt)
            return env.check_size(wrapped(*args, **kwargs))

        return checked

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if not SandboxedEnvironment.is_safe_attribute(self, obj, attr, value):
            return False
        if modifies_known_mutable(obj, attr):
            # the template's own lists/dicts may change; the caller's data may not
            return isinstance(obj, list | dict) and id(obj) not in self._frozen
        return True

    def getitem(self, obj: Any, argument: Any) -> Any:
        result = super().getitem(obj, argument)
        if isinstance(obj, Tracked):
            op = "array_access" if isinstance(argument, int) else "object_access"
            obj._mark(op)
        _mark(result)
        return result

    def getattr(self, obj: Any, attribute: str) -> Any:
        result = super().getattr(obj, attribute)
        if isinstance(obj, Tracked):
            obj._mark(
                attribute if callable(result) and not isinstance(obj, dict) else "object_access"
            )
        _mark(result)
        return result

    # --- parsing: guard loops and ``~`` ------------------------------------------------

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for node in tree.find_all(nodes.For):
            node.iter = nodes.Call(
                nodes.Name("__guard_iter", "load"), [node.iter], [], None, None, lineno=node.lineno
            )
        _replace_concat(tree)
        return tree

    # --- globals ----------------------------------------------------------------------

    def _raise_exception(self, message: Any = "") -> None:
        raise RaisedException(f"Jinja Exception: {message}")

    def _strftime_now(self, fmt: str) -> str:
        self._check_format(fmt)
        return self.now.strftime(fmt)


def _is_context(obj: Any) -> bool:
    from jinja2.runtime import Context, EvalContext

    return isinstance(obj, Context | EvalContext)


def _replace_concat(node: nodes.Node) -> None:
    """Turn every ``a ~ b`` into ``__guard_concat([a, b])`` (size-checked)."""
    for field in node.fields:
        value = getattr(node, field, None)
        if isinstance(value, nodes.Concat):
            for child in value.nodes:
                _replace_concat(child)
            setattr(
                node,
                field,
                nodes.Call(
                    nodes.Name("__guard_concat", "load"),
                    [nodes.List(value.nodes)],
                    [],
                    None,
                    None,
                    lineno=value.lineno,
                ),
            )
        elif isinstance(value, nodes.Node):
            _replace_concat(value)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, nodes.Concat):
                    for child in item.nodes:
                        _replace_concat(child)
                    value[i] = nodes.Call(
                        nodes.Name("__guard_concat", "load"),
                        [nodes.List(item.nodes)],
                        [],
                        None,
                        None,
                        lineno=item.lineno,
                    )
                elif isinstance(item, nodes.Node):
                    _replace_concat(item)
