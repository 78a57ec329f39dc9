"""``llamacpy tokenize``: the same input handling and output formats as ``llama-tokenize``.

* ``-p TEXT`` / ``-f FILE`` / ``--stdin`` (stdin wins, then the file, then the prompt); the
  text gets llama.cpp's escape processing (``\\n``, ``\\t``, ``\\xNN``, ...) unless
  ``--no-escape``.
* BOS (and EOS/SEP where the vocabulary adds them) per the model's metadata; ``--no-bos``
  adds none. Special-token parsing is on; ``--no-parse-special`` turns it off.
* Default output: one line per token, ``%6d -> 'piece'`` (the piece's raw bytes, cut at a NUL
  byte as C's printf does); ``--ids``: ``[id, id, ...]``; ``--show-count`` appends
  ``Total number of tokens: N``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import UsageError


def process_escapes(data: bytes) -> bytes:
    """llama.cpp's ``string_process_escapes``."""
    out = bytearray()
    i = 0
    n = len(data)
    simple = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("'"): 39, ord('"'): 34, 92: 92}
    while i < n:
        c = data[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = data[i]
            if e in simple:
                out.append(simple[e])
            elif e == ord("x") and i + 2 < n and (val := _strtol2(data[i + 1 : i + 3])) is not None:
                out.append(val & 0xFF)
                i += 2
            else:
                out += bytes([0x5C, e])
        else:
            out.append(c)
        i += 1
    return bytes(out)


def _strtol2(b: bytes) -> int | None:
    """``strtol(b, &end, 16)`` on two bytes; the value if it consumed both, else None."""
    j = 0
    while j < 2 and b[j] in b" \t\n\v\f\r":
        j += 1
    neg = False
    if j < 2 and b[j] in b"+-":
        neg = b[j] == 0x2D
        j += 1
    start = j
    while j < 2 and b[j] in b"0123456789abcdefABCDEF":
        j += 1
    if j == start or j != 2:
        return None
    val = int(b[start:j], 16)
    return -val if neg else val


def _read_prompt(args: argparse.Namespace) -> bytes:
    if args.stdin:
        data = sys.stdin.buffer.read()
    elif args.file is not None:
        try:
            data = Path(args.file).read_bytes()
        except OSError as e:
            raise UsageError(f"could not open file '{args.file}' for reading: {e.strerror}") from e
    elif args.prompt:
        data = os.fsencode(args.prompt)
    else:
        raise UsageError("must specify one of: --stdin, --file or --prompt")
    return process_escapes(data) if args.escape else data


def _run(args: argparse.Namespace) -> int:
    from ..registry import resolve_model
    from ..tokenizer import Tokenizer

    if not (args.stdin or args.file is not None or args.prompt):
        raise UsageError("must specify one of: --stdin, --file or --prompt")
    path = resolve_model(args.model)
    tok = Tokenizer.from_gguf(path)
    prompt = _read_prompt(args)
    add_special = tok.add_bos and not args.no_bos
    ids = tok.encode(prompt, add_special=add_special, parse_special=not args.no_parse_special)
    out = sys.stdout.buffer
    if args.ids:
        out.write(("[" + ", ".join(map(str, ids)) + "]\n").encode())
    else:
        for tid in ids:
            piece = tok.token_to_piece(tid, special=True).split(b"\0", 1)[0]
            out.write(f"{tid:6d} -> '".encode() + piece + b"'\n")
    if args.show_count:
        out.write(f"Total number of tokens: {len(ids)}\n".encode())
    out.flush()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tokenize",
        help="tokenize a prompt (like llama-tokenize)",
        description="Tokenize text with a model's vocabulary, exactly as llama.cpp does.",
    )
    p.add_argument("-m", "--model", required=True, help="model path or registry name")
    p.add_argument("-p", "--prompt", help="text to tokenize")
    p.add_argument("-f", "--file", help="read the text from FILE (bytes verbatim)")
    p.add_argument("--stdin", action="store_true", help="read the text from standard input")
    p.add_argument("--ids", action="store_true", help="print only the ids, as [1, 2, 3]")
    p.add_argument("--no-bos", action="store_true", help="add no BOS (nor EOS/SEP) token")
    p.add_argument(
        "--no-parse-special",
        action="store_true",
        help="treat special-token texts (<|im_end|>, ...) as plain text",
    )
    p.add_argument("--show-count", action="store_true", help="print the number of tokens")
    p.add_argument(
        "--no-escape",
        dest="escape",
        action="store_false",
        help="do not process escapes (\\n, \\t, \\xNN, ...) in the text",
    )
    p.set_defaults(func=_run)
