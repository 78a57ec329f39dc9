"""Write one copy of llama.cpp's GPT-2 test vocabulary per ``tokenizer.ggml.pre`` name
(dev-only; input for ``make_tokenizer_fixtures.py --pre-dir``).

    python scripts/make_pre_vocabs.py ggml-vocab-gpt-2.gguf OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

from llamacpy.gguf.edit import set_metadata
from llamacpy.tokenizer.pretokenize import PRE_NAMES


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src, out = Path(argv[0]), Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name in PRE_NAMES:
        set_metadata(src, out / f"{name}.gguf", [f"tokenizer.ggml.pre=str:{name}"])
    print(f"wrote {len(PRE_NAMES)} vocabularies to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
