"""Turn llama.cpp's JSON-schema-to-grammar tests into data fixtures.

Reads ``tests/test-json-schema-to-grammar.cpp`` of a llama.cpp checkout and writes
``tests/fixtures/grammar/json_schema_cases.json``: for each ``test({...})`` case its name,
the schema text, whether the conversion must succeed, and the expected grammar (trimmed as
the test's ``trim`` does: outer whitespace and each line's leading blanks removed).

    python scripts/make_json_schema_fixtures.py /path/to/llama.cpp
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from make_grammar_case_fixtures import _calls, _text

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "grammar"


def trim(text: str) -> str:
    """The test's ``trim``: strip, then drop leading blanks of every line."""
    return re.sub(r"(^|\n)[ \t]+", r"\1", text.strip(" \n\r\t"))


def schema_cases(src: str) -> list[dict]:
    cases = []
    for args in _calls(src, "test"):
        if len(args) != 1 or not isinstance(args[0], list) or len(args[0]) != 4:
            continue
        status, name, schema, grammar = args[0]
        assert status in ("SUCCESS", "FAILURE"), status
        cases.append({"name": _text(name), "ok": status == "SUCCESS",
                      "schema": _text(schema), "grammar": trim(_text(grammar))})  # fmt: skip
    return cases


LLAMA_CPP = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp")


def main(args: list[str]) -> None:
    root = Path(args[0]) if args else LLAMA_CPP
    cases = schema_cases((root / "tests" / "test-json-schema-to-grammar.cpp").read_text())
    text = json.dumps(cases, indent=1, ensure_ascii=False) + "\n"
    (OUT / "json_schema_cases.json").write_text(text)
    print(f"json_schema_cases.json: {len(cases)} cases ({sum(c['ok'] for c in cases)} succeed)")


if __name__ == "__main__":
    main(sys.argv[1:])
