"""Produce src/llamacpy/quants/iq_grids.npz: the lookup grids of ggml's IQ formats, as data.

Dev-only: reads the ``GGML_TABLE_BEGIN(type, name, size) ... GGML_TABLE_END()`` tables of
llama.cpp's ``ggml/src/ggml-common.h`` and stores each grid as its entries' bytes in memory
order (little-endian), ``uint8 [entries, bytes per entry]``: byte ``j`` of entry ``i`` is the
magnitude (IQ2/IQ3) or the signed value (IQ1, as int8) of element ``j`` of that grid point.
``ksigns_iq2xs`` is not stored: it is ``i | parity(i) << 7``, which this script checks.

    python scripts/make_iq_grids.py [--header PATH/ggml-common.h]
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np

DEFAULT = Path("/root/oracle/llama_cpp_python-0.3.36/vendor/llama.cpp/ggml/src/ggml-common.h")
OUT = Path(__file__).resolve().parents[1] / "src" / "llamacpy" / "quants" / "iq_grids.npz"
GRIDS = {  # name in ggml-common.h -> (numpy dtype of an entry, entries)
    "iq2xxs_grid": ("<u8", 256),
    "iq2xs_grid": ("<u8", 512),
    "iq2s_grid": ("<u8", 1024),
    "iq3xxs_grid": ("<u4", 256),
    "iq3s_grid": ("<u4", 512),
    "iq1s_grid": ("<u8", 2048),
}
_TABLE = re.compile(
    r"GGML_TABLE_BEGIN\(\s*(\w+)\s*,\s*(\w+)\s*,\s*(\w+)\s*\)(.*?)GGML_TABLE_END\(\)", re.S
)


def tables(text: str) -> dict[str, list[int]]:
    """Every table of the header (the first definition of each name), values as ints."""
    out: dict[str, list[int]] = {}
    for _ctype, name, _size, body in _TABLE.findall(text):
        if name not in out:
            out[name] = [int(v, 0) for v in re.findall(r"0x[0-9a-fA-F]+|\d+", body)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--header", type=Path, default=DEFAULT)
    args = ap.parse_args()
    found = tables(args.header.read_text())
    arrays = {}
    for name, (dtype, n) in GRIDS.items():
        vals = np.array(found[name], dtype=np.uint64)
        assert vals.size == n, (name, vals.size)
        arr = vals.astype(dtype)
        arrays[name] = arr.view(np.uint8).reshape(n, -1)
    ks = np.array(found["ksigns_iq2xs"], dtype=np.int64)
    i = np.arange(128)
    parity = np.array([bin(v).count("1") & 1 for v in i])
    assert np.array_equal(ks, i | (parity << 7)), "ksigns_iq2xs is not i | parity(i) << 7"
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes): " + ", ".join(arrays))


if __name__ == "__main__":
    main()
