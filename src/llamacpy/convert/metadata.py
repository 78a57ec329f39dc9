"""``general.*`` metadata: name, size label, license, base models, datasets, sampling defaults.

Collected as llama.cpp's converter (gguf-py's ``Metadata``) does: the model card's YAML front
matter (README.md), ``config.json``'s ``_name_or_path``, the directory name,
``generation_config.json`` (recommended sampling), then a ``--metadata`` override file and
``--model-name``. The same heuristics split a model id like ``org/Name-7B-Instruct-v0.2``
into name, organization, basename, size label, finetune and version.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..gguf.constants import GENERAL_SAMPLING
from .common import ConvertError, read_json, read_json_if_exists
from .kv import KV, T

log = logging.getLogger("llamacpy.convert")

_GGUF_TYPE = {"seq": T.STRING, "int": T.INT32, "float": T.FLOAT32}
# sampling field -> (general.sampling key suffix, GGUF type, generation_config.json key)
_SAMPLING = {
    f"sampling_{name}": (name, _GGUF_TYPE[kind], "temperature" if name == "temp" else name)
    for name, kind in GENERAL_SAMPLING.items()
}
# authorship field -> general.* key, in the order llama.cpp writes them
_STRINGS = {
    "author": "general.author",
    "version": "general.version",
    "organization": "general.organization",
    "finetune": "general.finetune",
    "basename": "general.basename",
    "description": "general.description",
    "quantized_by": "general.quantized_by",
    "size_label": "general.size_label",
}
_LINKS = {
    "license_name": "general.license.name",
    "license_link": "general.license.link",
    "url": "general.url",
    "doi": "general.doi",
    "uuid": "general.uuid",
    "repo_url": "general.repo_url",
    "source_url": "general.source.url",
    "source_doi": "general.source.doi",
    "source_uuid": "general.source.uuid",
    "source_repo_url": "general.source.repo_url",
}
_ENTRY_KEYS = ("name", "author", "version", "organization", "description", "url", "doi",
               "uuid", "repo_url")  # fmt: skip


@dataclass
class Metadata:
    sampling_sequence: Any = None
    sampling_top_k: Any = None
    sampling_top_p: Any = None
    sampling_min_p: Any = None
    sampling_xtc_probability: Any = None
    sampling_xtc_threshold: Any = None
    sampling_temp: Any = None
    sampling_penalty_last_n: Any = None
    sampling_penalty_repeat: Any = None
    sampling_mirostat: Any = None
    sampling_mirostat_tau: Any = None
    sampling_mirostat_eta: Any = None
    name: Any = None
    author: Any = None
    version: Any = None
    organization: Any = None
    finetune: Any = None
    basename: Any = None
    description: Any = None
    quantized_by: Any = None
    size_label: Any = None
    url: Any = None
    doi: Any = None
    uuid: Any = None
    repo_url: Any = None
    source_url: Any = None
    source_doi: Any = None
    source_uuid: Any = None
    source_repo_url: Any = None
    license: Any = None
    license_name: Any = None
    license_link: Any = None
    base_models: Any = None
    tags: Any = None
    languages: Any = None
    datasets: Any = None

    # ------------------------------------------------------------------ output
    def write(self, kv: KV) -> None:
        """Add the ``general.*`` keys (``general.name`` must be set)."""
        for attr, (suffix, vtype, _) in _SAMPLING.items():
            value = getattr(self, attr)
            if value is not None:
                kv.add(f"general.sampling.{suffix}", value, vtype)
        kv.add("general.name", self.name, T.STRING)
        for attr, key in _STRINGS.items():
            if getattr(self, attr) is not None:
                kv.add(key, getattr(self, attr), T.STRING)
        if self.license is not None:
            lic = ",".join(self.license) if isinstance(self.license, list) else self.license
            kv.add("general.license", lic, T.STRING)
        for attr, key in _LINKS.items():
            if getattr(self, attr) is not None:
                kv.add(key, getattr(self, attr), T.STRING)
        for attr, prefix in (("base_models", "base_model"), ("datasets", "dataset")):
            entries = getattr(self, attr)
            if entries is None:
                continue
            kv.add(f"general.{prefix}.count", len(entries), T.UINT32)
            for i, entry in enumerate(entries):
                for k in _ENTRY_KEYS:
                    if k in entry:
                        kv.add(f"general.{prefix}.{i}.{k}", entry[k], T.STRING)
        if self.tags is not None:
            kv.add("general.tags", self.tags, T.ARRAY, T.STRING)
        if self.languages is not None:
            kv.add("general.languages", self.languages, T.ARRAY, T.STRING)


# ---------------------------------------------------------------------------- sources
def load_model_card(directory: Path) -> dict[str, Any]:
    """The YAML front matter of README.md ({} when there is none)."""
    path = directory / "README.md"
    if not path.is_file():
        return {}
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != "---":
        return {}
    body = []
    for line in lines[1:]:
        if line == "---":
            break
        body.append(line)
    text = "\n".join(body) + "\n"
    # the "Norway problem" (a bare `no` is a boolean in YAML 1.1) and tab indentation
    text = text.replace("- no\n", '- "no"\n').replace("\t", "  ")
    try:
        import yaml
    except ImportError:  # a declared dependency; only model cards need it
        raise ConvertError(f"{path}: reading model card front matter needs PyYAML") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConvertError(f"{path}: invalid YAML front matter: {e}") from None
    if not isinstance(data, dict):
        log.error("README.md front matter is %s, not a mapping: ignored", type(data).__name__)
        return {}
    return data


def id_to_title(text: str) -> str:
    """``meta-llama`` -> ``Meta Llama``; acronyms and versions keep their case."""
    words = text.strip().replace("-", " ").split()
    return " ".join(
        w.title() if w.islower() and not re.match(r"^(v\d+(?:\.\d+)*|\d.*)$", w) else w
        for w in words
    )


def _size_part(part: str, total_params: int, types: set[str]) -> str:
    part = part.replace("_", ".")
    if part[-1].isdecimal():  # bloom-7b1 -> 7.1b
        part = part[:-2] + "." + part[-1] + part[-2]
    if len(part) > 1 and part[-2].isdecimal() and part[-1] in "kmbt":
        part = part[:-1] + part[-1].upper()
    if total_params != 0:
        try:
            label = float(part[:-1]) * pow(1000, " KMBT".find(part[-1]))
            if (total_params < 0 and label < abs(total_params) // 8) or (
                total_params > 0 and abs(label - total_params) > 7 * total_params // 8
            ):
                types.add("finetune")  # most likely a context length
                part = part[:-1] + part[-1].lower()
        except ValueError:
            pass
    if not types:
        types.add("size_label")
    return part


def model_id_components(model_id: str | None, total_params: int = 0) -> tuple:
    """``(name, organization, basename, finetune, version, size_label)`` of a model id."""
    if model_id is None:
        return None, None, None, None, None, None
    if " " in model_id:
        return model_id, None, None, None, None, None
    org: str | None
    if "/" in model_id:
        org, full = model_id.split("/", 1)
    else:
        org, full = None, model_id
    if org and org[0] == ".":
        org = None
    parts = [p for p in full.split("-") if p]
    kinds: list[set[str]] = [set() for _ in parts]
    for i, part in enumerate(parts):
        if re.fullmatch(r"(v|iter)?\d+([.]\d+)*", part, re.IGNORECASE):
            kinds[i].add("version")
        elif re.fullmatch(r"i?q\d(_\w)*|b?fp?(16|32)", part, re.IGNORECASE):
            kinds[i].add("type")
            parts[i] = part.upper()
        elif i > 0 and re.fullmatch(
            r"(([A]|\d+[x])?\d+([._]\d+)?[KMBT][\d]?|small|mini|medium|large|x?xl)",
            part,
            re.IGNORECASE,
        ):
            parts[i] = _size_part(part, total_params, kinds[i])
        elif i > 0 and re.fullmatch(r"chat|instruct|vision|lora", part, re.IGNORECASE):
            kinds[i].add("type" if total_params < 0 and part.lower() == "lora" else "finetune")
    # word sizes (mini, large) do not count when there is a numeric one
    if any(c.isdecimal() for p, k in zip(parts, kinds) if "size_label" in k for c in p):
        for p, k in zip(parts, kinds):
            if "size_label" in k and all(c.isalpha() for c in p):
                k.remove("size_label")
    at_start = True
    for p, k in zip(parts, kinds):
        if at_start and ((not k and p[0].isalpha()) or "version" in k):
            k.add("basename")
        else:
            at_start = False
            if not k:
                k.add("finetune")
    for k in reversed(kinds):
        if "basename" in k and len(k) > 1:
            k.remove("basename")
        else:
            break

    def join(kind: str, exclude: str | None = None) -> str | None:
        picked = [p for p, k in zip(parts, kinds) if kind in k and exclude not in k]
        return "-".join(dict.fromkeys(picked) if kind == "size_label" else picked) or None

    basename = join("basename")
    size_label = join("size_label")
    finetune = join("finetune")
    version = join("version", "basename")
    if size_label is None and finetune is None and version is None:
        basename = None
    return full, org, basename, finetune, version, size_label


def _source_entry(item: Any, total_params: int, what: str) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    if not isinstance(item, str):
        log.error("%s entry %r is not in a known format", what, item)
        return {}
    entry: dict[str, Any] = {}
    if item.startswith(("http://", "https://", "ssh://")):
        entry["repo_url"] = item
        m = (
            re.match(r"https?://huggingface.co/([^/]+/[^/]+)$", item)
            if "huggingface.co" in item
            else None
        )
        if m:
            _id_entry(entry, m.group(1), total_params)
        return entry
    name, org = _id_entry(entry, item, total_params)
    if org is not None and name is not None:
        entry["repo_url"] = f"https://huggingface.co/{org}/{name}"
    return entry


def _id_entry(entry: dict[str, Any], model_id: str, total_params: int) -> tuple[Any, Any]:
    """Add the name, organization and version of ``model_id`` to ``entry`` (those it has);
    return its name and organization."""
    name, org, _, _, version, _ = model_id_components(model_id, total_params)
    if name is not None:
        entry["name"] = id_to_title(name)
    if org is not None:
        entry["organization"] = id_to_title(org)
    if version is not None:
        entry["version"] = version
    return name, org


def _first(card: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in card:
            return card[k]
    return None


def _apply_card(md: Metadata, card: dict[str, Any], total_params: int) -> None:
    def use(attr: str, key: str) -> None:
        if key in card and getattr(md, attr) is None:
            setattr(md, attr, card.get(key))

    def use_list(attr: str, key: str) -> None:
        value = card.get(key)
        if value is None:
            return
        current = getattr(md, attr) or []
        current.extend(
            [value] if isinstance(value, str) else value if isinstance(value, list) else []
        )
        setattr(md, attr, current)

    for prefix in ("", "model_"):
        for attr in ("name", "author", "version", "organization", "description", "finetune",
                     "basename", "size_label"):  # fmt: skip
            use(attr, prefix + attr)
        for attr in ("url", "doi", "uuid", "repo_url"):
            use("source_" + attr, prefix + attr)
    use("name", "model_name")
    use("author", "model_creator")
    use("basename", "model_type")
    for attr, keys, what in (
        ("base_models", ("base_model", "base_models", "base_model_sources"), "base model"),
        ("datasets", ("datasets", "dataset", "dataset_sources"), "dataset"),
    ):
        if not any(k in card for k in keys):
            continue
        value = _first(card, *keys)
        items = (
            [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
        )
        entries = getattr(md, attr) or []
        entries.extend(_source_entry(v, total_params, what) for v in items)
        setattr(md, attr, entries)
    use("license", "license")
    use("license_name", "license_name")
    use("license_link", "license_link")
    use_list("tags", "tags")
    use_list("tags", "pipeline_tag")
    use_list("languages", "languages")
    use_list("languages", "language")


def _apply_model_id(md: Metadata, model_id: str, total_params: int) -> None:
    name, org, basename, finetune, version, size_label = model_id_components(model_id, total_params)
    if md.name is None and name is not None:
        md.name = id_to_title(name)
    if md.organization is None and org is not None:
        md.organization = id_to_title(org)
    for attr, value in (("basename", basename), ("finetune", finetune), ("version", version),
                        ("size_label", size_label)):  # fmt: skip
        if getattr(md, attr) is None and value is not None:
            setattr(md, attr, value)


def load_metadata(
    directory: Path,
    *,
    override: Path | None = None,
    model_name: str | None = None,
    total_params: int = 0,
) -> Metadata:
    """Everything known about the model's authorship and recommended sampling."""
    md = Metadata()
    _apply_card(md, load_model_card(directory), total_params)
    cfg = read_json_if_exists(directory / "config.json")
    if isinstance(cfg, dict):
        nop = cfg.get("_name_or_path")
        if isinstance(nop, str) and nop.count("/") <= 1:
            _apply_model_id(md, nop, total_params)
    _apply_model_id(md, directory.name, total_params)
    try:
        gen = read_json_if_exists(directory / "generation_config.json") or {}
    except ConvertError:
        gen = {}  # not every model has a valid generation_config.json
    if isinstance(gen, dict):
        for attr, (_, _, key) in _SAMPLING.items():
            if attr == "sampling_penalty_repeat":
                value = gen.get(key, gen.get("repetition_penalty", md.sampling_penalty_repeat))
            else:
                value = gen.get(key, getattr(md, attr))
            setattr(md, attr, value)
    if override is not None:
        data = read_json(override, what="--metadata file")
        if not isinstance(data, dict):
            raise ConvertError(f"{override}: the metadata override must be a JSON object")
        _apply_override(md, data)
    if model_name is not None:
        md.name = model_name
    if md.name is None:
        md.name = directory.name
    return md


def _apply_override(md: Metadata, data: dict[str, Any]) -> None:
    keys = {attr: f"general.sampling.{suffix}" for attr, (suffix, _, _) in _SAMPLING.items()}
    keys.update({"name": "general.name", "license_name": "general.license.name"})
    keys.update(_STRINGS)
    keys.update(_LINKS)
    keys.update(base_models="general.base_models", datasets="general.datasets")
    keys.update(tags="general.tags", languages="general.languages")
    for f in fields(md):
        key = keys.get(f.name)
        if key is not None and key in data:
            setattr(md, f.name, data[key])
