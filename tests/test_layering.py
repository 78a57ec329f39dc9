"""The layering rule of docs/ARCHITECTURE.md: a module imports only its own layer or below."""

from __future__ import annotations

import ast
from pathlib import Path

import llamacpy

# top-level module or package -> layer
LAYERS = {
    "_lazy": 0,
    "_startup": 0,
    "errors": 0,
    "fileio": 0,
    "gguf": 0,
    "hparams": 0,
    "registry": 0,
    "kernel_cache": 0,
    "kernel_progress": 0,
    "kernel_warm": 0,
    "simd": 0,
    "quants": 1,
    "ops": 2,
    "tokenizer": 2,
    "sampling": 2,
    "grammar": 2,
    "models": 3,
    "engine": 4,
    "api": 5,
    "eval": 5,
    "quantize": 5,
    "convert": 5,
    "server": 6,
    "cli": 7,
    "__main__": 7,
    "__init__": 7,
}
ROOT = Path(llamacpy.__file__).parent


def _top(module_path: Path) -> str:
    rel = module_path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def _imported_tops(source: str, depth: int) -> set[str]:
    """Top-level llamacpy modules imported by a module ``depth`` packages below llamacpy."""
    tree = ast.parse(source)
    tops: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("llamacpy."):
                    tops.add(a.name.split(".")[1])
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("llamacpy."):
                    tops.add(node.module.split(".")[1])
                elif node.module == "llamacpy":
                    tops.update(a.name for a in node.names)
            elif node.level == depth + 1:  # relative import reaching the llamacpy package
                if node.module:
                    tops.add(node.module.split(".")[0])
                else:
                    tops.update(a.name for a in node.names)
    return tops


def test_every_module_has_a_layer() -> None:
    for path in ROOT.rglob("*.py"):
        assert _top(path) in LAYERS, f"{path}: add its top-level package to LAYERS"


def test_imports_respect_layers() -> None:
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        own = LAYERS[_top(path)]
        depth = len(path.relative_to(ROOT).parts) - 1
        for top in _imported_tops(path.read_text(), depth):
            if top == "__version__":
                continue
            if LAYERS.get(top, 99) > own:
                violations.append(f"{path.relative_to(ROOT)} (layer {own}) imports {top}")
    assert not violations, "\n".join(violations)


def test_checker_finds_imports_of_every_form() -> None:
    src = (
        "import llamacpy.engine.kv\n"
        "from llamacpy.server import app\n"
        "from llamacpy import api\n"
        "from ..cli import main\n"
        "from .. import sampling\n"
        "from .sibling import x\n"
    )
    assert _imported_tops(src, depth=1) == {"engine", "server", "api", "cli", "sampling"}


def test_lazy_package_names_are_the_objects_not_submodules() -> None:
    import importlib

    for package in ("llamacpy.engine", "llamacpy.api"):
        pkg = importlib.import_module(package)
        for name, module in pkg._NAMES.items():
            assert name != module, f"{package}.{name} is also a submodule name"
            importlib.import_module(f"{package}.{module}")  # a submodule imported first ...
            assert getattr(pkg, name) is getattr(
                importlib.import_module(f"{package}.{module}"), name
            )
