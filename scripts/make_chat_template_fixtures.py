"""Record how llama-server (``--jinja``) renders chat templates (dev-only).

For every template in llama.cpp's ``models/templates/`` and each model (whose BOS/EOS tokens
and add_bos flag llama.cpp passes to the template), start ``llama-server --jinja
--chat-template-file T`` on 127.0.0.1 and POST a fixed set of conversations to
``/apply-template``; also record the template capabilities from ``/props``.

Usage::

    python scripts/make_chat_template_fixtures.py BUILD_BIN_DIR TEMPLATES_DIR \\
        smollm2=SMOLLM2.gguf gemma3=GEMMA3.gguf

Writes ``tests/fixtures/templates/llama_server.json.gz`` (``__model__``: the model's own
template).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests/fixtures/templates/llama_server.json.gz"
PORT = 18763

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

CONVERSATIONS: list[dict] = [
    {"name": "user", "messages": [{"role": "user", "content": "Hello!"}]},
    {
        "name": "system_multi_turn",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
    },
    {
        "name": "no_generation_prompt",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello, how can I help?"},
            {"role": "user", "content": "Tell me a joke."},
        ],
        "add_generation_prompt": False,
    },
    {
        "name": "typed_content",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe"},
                    {"type": "text", "text": "this."},
                ],
            }
        ],
    },
    {
        "name": "unicode",
        "messages": [
            {"role": "system", "content": "Réponds en français. 日本語も OK 😀"},
            {"role": "user", "content": 'Ünïcode "quotes" {{ braces }} <|im_end|> \\n\ttab'},
        ],
    },
    {
        "name": "tools",
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
    },
    {
        "name": "tool_call_round",
        "messages": [
            {"role": "user", "content": "What's the weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
        ],
        "tools": [WEATHER_TOOL],
    },
]
THINKING = {"user": (False, True), "system_multi_turn": (False, True)}


def _post(path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _get(path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=30) as r:
        return json.loads(r.read())


def _wait_ready(proc: subprocess.Popen) -> bool:
    for _ in range(600):
        if proc.poll() is not None:
            return False
        try:
            _get("/health")
            return True
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.1)
    return False


def render_all(bindir: Path, model: Path, template: Path | None) -> dict:
    """``template`` None: the model's own template (llama.cpp's ChatML fallback if none)."""
    tmpl_args = ["--chat-template-file", str(template)] if template else []
    cmd = [
        str(bindir / "llama-server"),
        "-m", str(model),
        "--jinja",
        *tmpl_args,
        "--host", "127.0.0.1",
        "--port", str(PORT),
        "-c", "512",
        "-np", "1",
        "-t", "1",
        "--no-warmup",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if not _wait_ready(proc):
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            return {"server_error": err}
        props = _get("/props")
        results = []
        for conv in CONVERSATIONS:
            for thinking in THINKING.get(conv["name"], (True,)):
                body = {
                    "messages": conv["messages"],
                    "chat_template_kwargs": {"enable_thinking": thinking},
                }
                if "tools" in conv:
                    body["tools"] = conv["tools"]
                if "add_generation_prompt" in conv:
                    body["add_generation_prompt"] = conv["add_generation_prompt"]
                status, res = _post("/apply-template", body)
                rec = {"conversation": conv["name"], "enable_thinking": thinking, "status": status}
                if status == 200:
                    rec["prompt"] = res["prompt"]
                else:
                    rec["error"] = res.get("error", {}).get("message", "")
                results.append(rec)
        return {"caps": props.get("chat_template_caps"), "results": results}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    bindir, tdir = Path(argv[0]), Path(argv[1])
    models = dict(a.split("=", 1) for a in argv[2:])
    now = dt.datetime.now()
    out: dict = {
        "date": now.strftime("%Y-%m-%d"),
        "conversations": CONVERSATIONS,
        "models": {},
    }
    for mname, mpath in models.items():
        renders = {"__model__": render_all(bindir, Path(mpath), None)}
        for template in sorted(tdir.glob("*.jinja")):
            renders[template.name] = render_all(bindir, Path(mpath), template)
            n_ok = sum(r["status"] == 200 for r in renders[template.name].get("results", []))
            print(f"{mname} {template.name}: {n_ok} ok", file=sys.stderr)
        out["models"][mname] = renders
    if dt.datetime.now().date() != now.date():
        print("warning: the date changed while recording; run again", file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:
        f.write(json.dumps(out, ensure_ascii=False, indent=0).encode())
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
