"""The GPU and model catalogs: load ``catalogs/*.yaml`` into specs; look names up.

Nothing is read at import time. Lookup is case-insensitive and ignores separators, so
``RTX 4090``, ``rtx-4090`` and ``rtx4090`` are one name. A model name may also be a Hugging Face
hub id as people type it: an organisation or mirror in front (``NousResearch/``, ``unsloth/``),
variant and packaging tags behind (``-Instruct``, ``-chat-hf``, ``-it``, ``-bnb-4bit``, ``-GPTQ``):
:func:`model_name_candidates` peels those off, since they leave the architecture as it is. An
unknown name gets "did you mean", drawn from the same architecture family only.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Generic, TypeVar

import yaml

from planner.core.entries import GpuSpec, ModelSpec
from planner.core.errors import excerpt
from planner.core.textfiles import is_dir, is_file

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # planner/
#: Where catalogs live: next to the package in a source checkout, inside it once installed.
_CATALOG_DIRS = (_PACKAGE_DIR.parent / "catalogs", _PACKAGE_DIR / "_catalogs")


class UnknownName(LookupError):
    """A name that is in no catalog; the message carries suggestions."""


def catalog_dir() -> Path:
    for candidate in _CATALOG_DIRS:
        if (candidate / "gpus.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no catalogs found in {', '.join(map(str, _CATALOG_DIRS))}")


def normalize_name(name: str) -> str:
    """Lower-case, drop separators: ``NVIDIA RTX-4090`` -> ``nvidiartx4090``."""
    return re.sub(r"[^a-z0-9.]", "", name.strip().lower())


#: Name parts that mark a fine-tune, a chat/instruct variant or a repackaging of the same weights
#: shapes (quantisation, file format, who converted it): none changes the architecture.
_VARIANT_TOKENS = frozenset({
    "instruct", "chat", "hf", "it", "base", "pt", "sft", "dpo", "rlhf", "ft", "dynamic", "thinking",
    "gptq", "awq", "gguf", "ggml", "exl2", "mlx", "onnx", "bnb", "4bit", "8bit", "nf4", "fp8",
    "fp16", "bf16", "int4", "int8", "w4a16", "w8a8", "w8a16", "unsloth", "quantized", "hqq",
    "marlin", "safetensors",
})
#: llama.cpp quantisation tags (``Q4_K_M``, ``Q8_0``, ``IQ3_XS``) and a trailing file suffix.
_QUANT_TAG = re.compile(r"(?<![a-z0-9])(i?q[1-8](_k)?(_[a-z0-9]{1,2})?|f16|f32)(?![a-z0-9])")
_FILE_SUFFIX = re.compile(r"\.(gguf|bin|safetensors)$")


#: An update's date stamp after the name (Qwen3's ``-2507``, Mistral Small's ``-2501``/``-2503``,
#: Kimi K2's ``-0905``: YYMM or MMDD): a re-trained release of the same architecture. Sizes carry
#: a unit (``7b``, ``135m``) and versions a letter or dot (``v0.3``, ``3.1``), so four bare
#: digits are neither.
_UPDATE_STAMP = re.compile(r"^\d{4}$")


def _name_tokens(name: str) -> list[str]:
    """The lower-cased parts of a name without organisation, file suffix, variant tags and
    update stamps."""
    bare = name.strip().lower().rsplit("/", 1)[-1]
    bare = _QUANT_TAG.sub("", _FILE_SUFFIX.sub("", bare))
    tokens = [t for t in re.split(r"[-_\s]+", bare) if t]
    # The first part is the model's own name; tags are stripped from the rest.
    return tokens[:1] + [t for t in tokens[1:] if t not in _VARIANT_TOKENS and not _UPDATE_STAMP.match(t)]


def model_name_candidates(name: str) -> list[str]:
    """Normalised keys to try for a typed model name, most literal first.

    ``TheBloke/Llama-2-7B-Chat-GPTQ`` -> ``thebloke/llama-2-7b-chat-gptq``'s key, then without the
    organisation (``llama27bchatgptq``), then without variant tags (``llama27b``), then without a
    leading ``meta-`` (``Meta-Llama-3-8B`` is ``llama-3-8b``). Versions (``v0.3``, ``3.1``) and
    sizes are kept: they do change the architecture.
    """
    text = name.strip().lower()
    out: list[str] = []

    def add(s: str) -> None:
        key = normalize_name(s)
        if key and key not in out:
            out.append(key)

    add(text)
    add(text.rsplit("/", 1)[-1])
    kept = _name_tokens(text)
    add("-".join(kept))
    if kept and kept[0] == "meta" and len(kept) > 1:
        add("-".join(kept[1:]))
    return out


#: Architecture families by the word that names them in a model's name. When a name holds
#: several (``deepseek-r1-distill-llama-70b``), the last one is the architecture: a distilled or
#: derived model is named "<maker>-...-<base architecture>-<size>".
_FAMILY_WORDS: tuple[tuple[str, str], ...] = (
    ("tinyllama", "tinyllama"), ("codellama", "llama"), ("llama", "llama"), ("qwq", "qwen"),
    ("qwen", "qwen"), ("mixtral", "mistral"), ("mistral", "mistral"), ("ministral", "mistral"),
    ("codestral", "mistral"), ("gemma", "gemma"), ("phi", "phi"), ("deepseek", "deepseek"),
    ("yi", "yi"), ("falcon", "falcon"), ("smollm", "smollm"), ("olmo", "olmo"), ("opt", "opt"),
    ("gpt", "gpt"), ("davinci", "gpt"), ("bloom", "bloom"), ("chatglm", "glm"), ("glm", "glm"),
    ("baichuan", "baichuan"), ("internlm", "internlm"), ("minicpm", "minicpm"), ("kimi", "deepseek"),
    ("pythia", "gpt-neox"), ("neox", "gpt-neox"), ("stablelm", "stablelm"),
)


def name_family(name: str) -> str | None:
    """The architecture family a model name points to (see :data:`_FAMILY_WORDS`), or None."""
    text = "-".join(_name_tokens(name))
    best: tuple[int, str] | None = None
    for word, family in _FAMILY_WORDS:
        # Short words only at a word's start ("yi-34b", "phi-3", "opt-125m"), not inside others.
        pattern = rf"(?<![a-z]){word}" if len(word) <= 3 else word
        for match in re.finditer(pattern, text):
            start = match.start()
            if best is None or start > best[0]:
                best = (start, family)
    if best is None:
        return None
    # "tinyllama" also contains "llama" further right: the longer word names the family.
    if best[1] == "llama" and re.search(r"tinyllama", text):
        tl = text.rfind("tinyllama")
        if tl + len("tiny") == best[0]:
            return "tinyllama"
    return best[1]


def _size_b(text: str) -> float | None:
    """The parameter count a name states, in billions (``70b`` -> 70, ``135m`` -> 0.135)."""
    match = re.search(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])", text)
    if not match:
        return None
    value = float(match.group(1))
    return value if match.group(2) == "b" else value / 1000


def _nearest_in_size(name: str, ids: Iterable[str]) -> list[str]:
    """Of ``ids``, the three whose stated size is nearest (by ratio) the size ``name`` states."""
    import math

    want = _size_b("-".join(_name_tokens(name)))
    if want is None or want <= 0:
        return []
    sized = [(abs(math.log(size / want)), entry_id) for entry_id in ids
             if (size := _size_b(entry_id)) is not None and size > 0]
    return [entry_id for _, entry_id in sorted(sized)[:3]]


#: Names of models whose layers are not all softmax-attention decoder layers, which the
#: formulas describe (the catalog holds none of them and ``hf_config`` refuses their configs),
#: and what their layers are instead. An unknown name that matches one is told so, not offered
#: a transformer spelled alike.
_HYBRID_NAMES: tuple[tuple[str, str], ...] = (
    (r"qwen3\.5|qwen3-next", "interleaves Gated DeltaNet linear-attention layers with its attention layers"),
    (r"jamba|zamba|bamba|falcon-h1|nemotron-h|granite-4\.0-h", "combines Mamba state-space layers with attention layers"),
    (r"mamba", "is built of Mamba state-space layers"),
    (r"rwkv", "is built of RWKV recurrent layers"),
    (r"recurrentgemma", "interleaves Griffin recurrent blocks with its attention layers"),
    (r"lfm2", "interleaves short-convolution blocks with its attention layers"),
    (r"kimi-linear", "interleaves Kimi Delta Attention linear-attention layers with its attention layers"),
    (r"minimax-text-01|minimax-m1|minimax-vl-01", "interleaves Lightning linear-attention layers with its attention layers"),
)


def hybrid_architecture(name: str) -> str | None:
    """What a model name's layers are when they are not the softmax-attention decoder layers the
    planner models (see :data:`_HYBRID_NAMES`), or None."""
    text = "-".join(_name_tokens(name))
    for pattern, what in _HYBRID_NAMES:
        if re.search(rf"(?<![a-z0-9]){pattern}", text):
            return what
    return None


#: How an unknown model's error ends: the way to use a model the catalog lacks.
CONFIG_HINT = ("not in the catalog? give the path to its Hugging Face config.json (or the folder "
               "holding it) as the model: --model ./my-model/config.json, or model: in a scenario file")


T = TypeVar("T", GpuSpec, ModelSpec)


class Catalog(Generic[T]):
    """Entries by id, with an index of every id and alias."""

    def __init__(self, kind: str, entries: Iterable[T]):
        self.kind = kind
        self.entries: dict[str, T] = {}
        self._index: dict[str, str] = {}
        for entry in entries:
            if entry.id in self.entries:
                raise ValueError(f"{kind} catalog: duplicate id {entry.id!r}")
            self.entries[entry.id] = entry
            names = [entry.id, *entry.aliases]
            if isinstance(entry, ModelSpec) and entry.hf_repo:
                names += [entry.hf_repo, entry.hf_repo.split("/")[-1]]
            for name in names:
                key = normalize_name(name)
                owner = self._index.setdefault(key, entry.id)
                if owner != entry.id:
                    raise ValueError(
                        f"{kind} catalog: name {name!r} belongs to both {owner!r} and {entry.id!r}"
                    )

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries.values())

    def _keys(self, name: str) -> list[str]:
        if self.kind == "model":
            return model_name_candidates(name)
        return [normalize_name(name)]

    def find(self, name: str) -> T | None:
        """The entry a name means, or None (models: hub ids and variant tags allowed)."""
        for key in self._keys(name):
            if key in self._index:
                return self.entries[self._index[key]]
        return None

    def get(self, name: str) -> T:
        entry = self.find(name)
        if entry is not None:
            return entry
        hybrid = hybrid_architecture(name) if self.kind == "model" else None
        if hybrid:
            raise UnknownName(
                f"unknown {self.kind} {excerpt(name)}: it {hybrid}, and the planner models decoders "
                "whose layers are all softmax attention, so it has no estimate for it (nor for "
                "its config.json)")
        message = f"unknown {self.kind} {excerpt(name)}{self.suggest(name)}"
        if self.kind == "model":
            message += f"; {CONFIG_HINT}"
        raise UnknownName(message)

    def suggest(self, name: str) -> str:
        """"; did you mean a, b, c?" from the names closest to ``name`` (for models, only of the
        architecture family the name points to: a Llama typo never suggests a DeepSeek MoE)."""
        keys = self._keys(name)
        index = self._index
        family = name_family(name) if self.kind == "model" else None
        ids: list[str] = []
        if family is not None:
            # A near-exact spelling (one or two letters off) is the model meant, whatever
            # family word the typo left standing ("deepseek-r1-distill-lama-70b").
            for match in difflib.get_close_matches(keys[-1], index, n=3, cutoff=0.9):
                if index[match] not in ids:
                    ids.append(index[match])
            index = {k: v for k, v in index.items() if self.entries[v].family == family}
        for key in reversed(keys):  # the most stripped key is the model's own name
            for match in difflib.get_close_matches(key, index, n=8, cutoff=0.6):
                entry_id = index[match]
                if entry_id not in ids:
                    ids.append(entry_id)
        if not ids and family is not None:
            # Nothing spelled alike: the family's models nearest in size ("72b" -> the 70Bs).
            ids = _nearest_in_size(name, dict.fromkeys(index.values()))
        if not ids:
            return f" (see `planner {self.kind}s` for the list)"
        return f"; did you mean {', '.join(ids[:3])}?"


#: The shipped catalogs are read with libyaml's safe loader where PyYAML has it (its wheels do):
#: the same documents, about ten times faster than the pure-Python parser, which spent most of a
#: quick ``planner plan`` reading them.
CATALOG_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_catalog_file(path: Path, key: str) -> list[dict]:
    """The ``key`` list of a shipped catalog file (read with :data:`CATALOG_LOADER`)."""
    with path.open(encoding="utf-8") as f:
        data = yaml.load(f, Loader=CATALOG_LOADER)
    return data[key]


@lru_cache(maxsize=1)
def _gpus_from_file() -> Catalog[GpuSpec]:
    rows = load_catalog_file(catalog_dir() / "gpus.yaml", "gpus")
    return Catalog("gpu", (GpuSpec.model_validate(row) for row in rows))


#: GPU specs that replace the file's while :func:`gpus_overlaid` is active (e.g. imported prices).
_GPU_OVERLAY: list[Catalog[GpuSpec]] = []


def gpus() -> Catalog[GpuSpec]:
    return _GPU_OVERLAY[-1] if _GPU_OVERLAY else _gpus_from_file()


@contextmanager
def gpus_overlaid(entries: Iterable[GpuSpec]):
    """Within the block, the GPU catalog is ``entries`` (same ids, e.g. with other prices)."""
    _GPU_OVERLAY.append(Catalog("gpu", entries))
    try:
        yield
    finally:
        _GPU_OVERLAY.pop()


@lru_cache(maxsize=1)
def models() -> Catalog[ModelSpec]:
    rows = load_catalog_file(catalog_dir() / "models.yaml", "models")
    return Catalog("model", (ModelSpec.model_validate(row) for row in rows))


def get_gpu(name: str) -> GpuSpec:
    return gpus().get(name)


def get_model(name: str, *, base_dir: Path | None = None) -> ModelSpec:
    """A catalog name, or a path to a Hugging Face ``config.json`` (or its folder).

    A relative path is looked up beside ``base_dir`` (the scenario file's folder) first.
    """
    cat = models()
    entry = cat.find(name)
    if entry is not None:
        return entry
    path = Path(name).expanduser()
    candidates = [path] if path.is_absolute() or base_dir is None else [base_dir / path, path]
    for candidate in candidates:
        if is_file(candidate) or is_dir(candidate):  # never raises, whatever the name
            from planner.catalog.hf_config import load_hf_config

            return load_hf_config(candidate)
    if name.endswith(".json"):
        from planner.catalog.hf_config import ConfigError

        raise ConfigError(f"no such file {name!r}")
    return cat.get(name)
