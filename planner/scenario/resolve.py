"""Scenario files -> validated, resolved scenarios.

A file holds one scenario (a mapping), a list of scenarios, or a mapping with ``scenarios:``
(a list) and ``defaults:`` (a mapping deep-merged under each scenario). Names are resolved
against the catalogs; every problem is collected and reported at once, one line per field.
"""

from __future__ import annotations

import copy
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from planner import catalog
from planner.core.arch import has_full_architecture
from planner.catalog.store import UnknownName
from planner.core.errors import EXCERPT_CHARS, InputError, clip, excerpt, format_validation_error
from planner.catalog.hf_config import ConfigError
from planner.core.specs import GpuSpec, Layout, ModelSpec, Scenario, Workload
from planner.scenario.legality import pp_fault

#: Flat option names (CLI flags, keyword arguments) -> the scenario section that holds them.
FLAG_SECTIONS: dict[str, str] = {
    **{k: "workload" for k in (
        "method", "optimizer", "precision", "seq_len", "micro_batch", "grad_accum",
        "global_batch", "tokens", "lora_rank", "lora_alpha", "lora_targets", "quant_bits",
        "double_quant", "allow_relax")},
    **{k: "layout" for k in (
        "gpu", "gpus", "dp", "tp", "pp", "cp", "ep", "sp", "zero", "offload", "checkpointing",
        "attention", "uneven_pp")},
    **{k: "overrides" for k in (
        "activation_bytes", "k_factor", "lora_params", "lora_bytes_per_param",
        "base_bytes_per_param", "reserve")},
    **{k: "search" for k in ("gpu_types", "max_gpus", "distinct", "utilization")},
    **{k: "constraints" for k in ("budget_usd", "deadline_hours", "fleet", "pcie_model_parallel")},
    **{k: "" for k in ("name", "profile", "model", "objective", "top", "time_limit_s")},
}


@dataclass(frozen=True)
class ResolvedScenario:
    """A scenario with names looked up and derived layout values filled in."""

    scenario: Scenario
    model: ModelSpec
    gpu: GpuSpec | None
    layout: Layout  # gpus and dp always set
    grad_accum: int | None
    warnings: tuple[str, ...] = field(default=())
    source: str | None = None

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def workload(self):
        return self.scenario.workload

    @property
    def overrides(self):
        return self.scenario.overrides

    @property
    def profile(self) -> str:
        return self.scenario.profile


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``; nested mappings merge, everything else is replaced."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def scenario_from_flags(**flags: Any) -> dict[str, Any]:
    """Flat options (``method="lora", gpu="rtx-4090"``) -> a nested scenario mapping."""
    out: dict[str, Any] = {}
    problems = []
    for key, value in flags.items():
        if value is None:
            continue
        section = FLAG_SECTIONS.get(key)
        if section is None:
            problems.append(f"{key}: unknown option")
        elif section:
            out.setdefault(section, {})[key] = value
        else:
            out[key] = value
    if problems:
        raise InputError(problems)
    return out


#: The largest YAML file read (scenario or portfolio): far above any real one (the shipped
#: examples are under 4 KiB), small enough that reading it stays quick.
MAX_INPUT_BYTES = 1 << 20
#: The deepest nesting of mappings and lists (a portfolio's job scenario is 5 deep).
MAX_DEPTH = 32
#: The most values (scalars, mappings, lists) a file may hold once its aliases are expanded:
#: thousands of scenarios of a few dozen values each. A few hundred bytes of nested aliases
#: ("billion laughs") would otherwise expand to billions.
MAX_VALUES = 100_000
#: The longest text (a key or a value) accepted anywhere: names, paths, catalog names.
MAX_TEXT_CHARS = 1024


class _Refused(yaml.MarkedYAMLError):
    """A YAML document refused by a limit; ``where`` names the field."""

    def __init__(self, where: str, problem: str, mark):
        super().__init__(problem=problem, problem_mark=mark)
        self.where = where


try:  # libyaml's parser (C) under the Python composer below: about 3× faster on large files
    from yaml._yaml import CParser as _CParser

    class _SafeBase(yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver,
                    _CParser):
        def __init__(self, stream):
            _CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            yaml.composer.Composer.__init__(self)
except ImportError:  # PyYAML built without libyaml
    _SafeBase = yaml.SafeLoader  # type: ignore[misc,assignment]


class _BoundedLoader(_SafeBase):
    """PyYAML's safe loader with limits checked while the document is composed (before any
    value is built): depth, values after alias expansion, text length; and duplicate keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self._path: list[str] = []
        self._values = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values expanded, height)

    def _where(self) -> str:
        def dotted(parts: list[str]) -> str:
            return "".join(p if p.startswith("[") or i == 0 else "." + p for i, p in enumerate(parts))

        if len(self._path) > 6:
            return f"{dotted(self._path[:3])}…{dotted(self._path[-2:])}"
        return dotted(self._path) or "(top level)"

    def compose_node(self, parent, index):
        if isinstance(parent, yaml.MappingNode):
            label = "(a key)" if index is None else (clip(index.value, 40) if isinstance(index, yaml.ScalarNode)
                                                   else "(complex key)")
        elif isinstance(parent, yaml.SequenceNode):
            label = f"[{index}]"
        else:
            label = None
        if label is not None:
            self._path.append(label)
        try:
            return self._compose_bounded(parent, index)
        finally:
            if label is not None:
                self._path.pop()

    def _compose_bounded(self, parent, index):
        event = self.peek_event()
        depth = len(self._path)
        if isinstance(event, yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:
                raise _Refused(self._where(), f"alias *{clip(event.anchor, 40)} refers to a value that contains it",
                               event.start_mark)
            self._count(size[0], event.start_mark)
            if depth + size[1] > MAX_DEPTH:
                raise _Refused(self._where(), f"nested deeper than {MAX_DEPTH} levels (through alias "
                               f"*{clip(event.anchor, 40)})", event.start_mark)
            return node
        if depth > MAX_DEPTH:
            raise _Refused(self._where(), f"nested deeper than {MAX_DEPTH} levels", event.start_mark)
        if isinstance(event, yaml.ScalarEvent) and len(event.value) > MAX_TEXT_CHARS:
            raise _Refused(self._where(), f"text of {len(event.value):,} characters is longer than the "
                           f"{MAX_TEXT_CHARS:,} allowed: {excerpt(event.value)}", event.start_mark)
        before = self._values
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        height = 1 + max((self._sizes[id(n)][1] for n in self._children(node)), default=0)
        self._sizes[id(node)] = (self._values - before, height)
        return node

    @staticmethod
    def _children(node):
        if isinstance(node, yaml.SequenceNode):
            return node.value
        if isinstance(node, yaml.MappingNode):
            return [n for kv in node.value for n in kv]
        return ()

    def _count(self, n: int, mark) -> None:
        self._values += n
        if self._values > MAX_VALUES:
            raise _Refused(self._where(), f"more than {MAX_VALUES:,} values (aliases expanded)", mark)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue
                if first is not key_node.start_mark:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {excerpt(key)} (first at line {first.line + 1})",
                        key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # e.g. a timestamp 2027-13-45
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {excerpt(node.value) if isinstance(node, yaml.ScalarNode) else 'a value'}: "
                f"{clip(str(exc), EXCERPT_CHARS)}", node.start_mark) from None


def read_text_bounded(path: str | Path, *, limit: int = MAX_INPUT_BYTES) -> str:
    """A regular file's text (UTF-8, at most ``limit`` bytes); anything else is one line of InputError.

    The file is opened without blocking and checked again once open, so a named pipe or a
    device never stalls the read."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        if path.is_symlink():
            raise InputError([f"{path}: a broken symbolic link or a link loop"]) from None
        if isinstance(exc, FileNotFoundError):
            raise InputError([f"{path}: no such file"]) from None
        raise InputError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    except ValueError:  # a NUL byte in the path
        raise InputError([f"{path}: no such file"]) from None
    _check_regular(path, st, limit)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        _check_regular(path, os.fstat(fd), limit)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise InputError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputError([f"{path}: larger than the {limit:,} bytes allowed"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError([f"{path}: not a UTF-8 text file (byte {exc.start:,})"]) from None


def _check_regular(path: Path, st: os.stat_result, limit: int) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise InputError([f"{path}: a folder, not a file"])
    if not stat.S_ISREG(st.st_mode):
        raise InputError([f"{path}: not a regular file ({_file_kind(st.st_mode)})"])
    if st.st_size > limit:
        raise InputError([f"{path}: {st.st_size:,} bytes is larger than the {limit:,} allowed"])


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a file"


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data, within the limits above; any problem is one line of InputError."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        mark = exc.problem_mark
        raise InputError([f"{source}: {exc.where}: {exc.problem} (line {mark.line + 1}, column "
                          f"{mark.column + 1})"]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        context = getattr(exc, "context", None)
        if context and context.startswith("found"):  # "found duplicate anchor 'x'; first occurrence"
            cmark = getattr(exc, "context_mark", None)
            problem = f"{context} at line {cmark.line + 1}, {problem}" if cmark else f"{context}, {problem}"
        raise InputError([f"{source}: malformed YAML: {where}{clip(problem, 2 * EXCERPT_CHARS)}"]) from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """A YAML file's content, read within the limits above (:data:`MAX_INPUT_BYTES`,
    :data:`MAX_DEPTH`, :data:`MAX_VALUES`, :data:`MAX_TEXT_CHARS`, no duplicate keys); a
    missing, unreadable, oversized, malformed or non-UTF-8 file is one line of InputError."""
    return parse_yaml(read_text_bounded(path), str(path))


def read_scenario_file(path: str | Path) -> list[dict[str, Any]]:
    """The raw scenario mappings of a file, ``defaults:`` merged in."""
    return scenarios_from_data(load_yaml(path), path)


def scenarios_from_data(data: Any, path: str | Path) -> list[dict[str, Any]]:
    """The raw scenario mappings of a file's content (:func:`load_yaml`), ``defaults:`` merged in."""
    path = Path(path)
    defaults: dict[str, Any] = {}
    if isinstance(data, dict) and "scenarios" in data:
        extra = sorted(set(data) - {"scenarios", "defaults"}, key=str)  # keys may be numbers, dates…
        if extra:
            raise InputError([f"{path}: {clip(str(k))}: unknown key beside scenarios/defaults" for k in extra])
        defaults = data.get("defaults") or {}
        data = data["scenarios"]
        if not isinstance(defaults, dict):
            raise InputError([f"{path}: defaults: must be a mapping"])
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise InputError([f"{path}: expected a scenario mapping or a list of them"])
    out = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise InputError([f"{path}: [{i}]: a scenario must be a mapping"])
        merged = deep_merge(defaults, item)
        merged.setdefault("name", path.stem if len(data) == 1 else f"{path.stem}[{i}]")
        problem = model_name_problem(merged.get("model"))
        if problem:
            raise InputError([f"{path}: " + (f"[{i}]: " if len(data) > 1 else "") + problem])
        out.append(merged)
    return out


#: The longest file name (one part of a path) file systems take, in bytes (POSIX NAME_MAX).
MAX_FILE_NAME_BYTES = 255


def model_name_problem(model: Any) -> str | None:
    """Why a model given as text can be neither a catalog name nor a path, or None.

    A part longer than a file name may be is checked here, before anything looks the path up
    (the file system would answer with an error, not with "no such file")."""
    if not isinstance(model, str):
        return None
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in model.split("/")), default=0)
    if longest > MAX_FILE_NAME_BYTES:
        return (f"model: {excerpt(model)} is no catalog name, nor a path (a part of {longest:,} bytes; "
                f"file names take at most {MAX_FILE_NAME_BYTES})")
    if "\x00" in model:
        return f"model: {excerpt(model)} is no catalog name, nor a path (it holds a NUL character)"
    return None


def _divides(a: int, b: int) -> bool:
    return b % a == 0


def resolve(
    raw: dict[str, Any] | Scenario, *, source: str | None = None, base_dir: Path | None = None
) -> ResolvedScenario:
    """Validate a scenario mapping and resolve it; raises :class:`InputError` listing every problem.

    ``source`` prefixes every message (the file, and the index in a list); ``base_dir`` is
    where relative ``config.json`` paths are looked up first (the scenario file's folder).
    """
    prefix = f"{source}: " if source else ""
    scenario = _validated(raw, prefix)
    problems: list[str] = []
    warnings: list[str] = []
    model = _resolve_model(scenario, base_dir, problems)
    gpu = _resolve_gpu(scenario.layout, problems)
    lay, wl = scenario.layout, scenario.workload
    dp, gpus = _derive_dp_and_gpus(lay, problems)
    if model is not None:
        _check_model_split(scenario, model, problems, warnings)
    _check_sequence(wl, lay, model, problems, warnings)
    _check_experts(lay, model, dp, problems)
    _check_sharding(wl, lay, problems)
    grad_accum = _derive_grad_accum(wl, dp, problems)
    scenario = _fit_profile(scenario, model, problems, warnings)
    _check_saved_modules(scenario, warnings)
    if gpu is not None:
        _check_gpu(wl, lay, gpu, problems, warnings)
    if problems:
        raise InputError([prefix + p for p in problems])
    return ResolvedScenario(
        scenario=scenario,
        model=model,
        gpu=gpu,
        layout=lay.model_copy(update={"dp": dp, "gpus": gpus}),
        grad_accum=grad_accum,
        warnings=tuple(warnings),
        source=source,
    )


def _validated(raw: dict[str, Any] | Scenario, prefix: str) -> Scenario:
    """The scenario checked against the schema; every schema problem is one line of InputError."""
    if isinstance(raw, Scenario):
        return raw
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise InputError([prefix + line for line in format_validation_error(exc, Scenario)]) from None
    except (TypeError, ValueError) as exc:  # a check that fails on a value instead of refusing it
        raise InputError([prefix + line for line in _unvalidatable(raw, exc)]) from None


def _resolve_model(scenario: Scenario, base_dir: Path | None, problems: list[str]) -> ModelSpec | None:
    """The scenario's model: a catalog name or a config path looked up, or the spec given inline."""
    if not isinstance(scenario.model, str):
        model = scenario.model
        if model.params_b is None and not has_full_architecture(model):
            problems.append("model: give params_b, or heads, ffn and vocab to count parameters")
        return model
    try:
        return catalog.get_model(scenario.model, base_dir=base_dir)
    except (UnknownName, ConfigError) as exc:
        problems.append(f"model: {exc}")
    except (OSError, ValueError) as exc:  # a name no file system accepts as a path (too long…)
        problems.append(f"model: {excerpt(scenario.model)} is no catalog name, nor a readable path "
                        f"({clip(getattr(exc, 'strerror', None) or str(exc), EXCERPT_CHARS)})")
    return None


def _resolve_gpu(lay: Layout, problems: list[str]) -> GpuSpec | None:
    if lay.gpu is None:
        return None
    try:
        return catalog.get_gpu(lay.gpu)
    except UnknownName as exc:
        problems.append(f"layout.gpu: {exc}")
        return None


def _derive_dp_and_gpus(lay: Layout, problems: list[str]) -> tuple[int, int]:
    """(dp, gpus) of the layout."""
    # gpus = dp·tp·pp·cp, with whichever of gpus and dp is missing derived from the other.
    mp = lay.tp * lay.pp * lay.cp
    dp, gpus = lay.dp, lay.gpus
    if dp is None:
        if gpus is None:
            dp = 1
        elif gpus % mp:
            problems.append(
                f"layout.gpus: {gpus} is not a multiple of tp·pp·cp = {lay.tp}·{lay.pp}·{lay.cp} = {mp}"
            )
            dp = 1
        else:
            dp = gpus // mp
    if gpus is None:
        gpus = dp * mp
    elif gpus != dp * mp:
        problems.append(
            f"layout.gpus: {gpus} ≠ dp·tp·pp·cp = {dp}·{lay.tp}·{lay.pp}·{lay.cp} = {dp * mp}"
        )
    return dp, gpus


def uneven_pp_allowed(scenario: Scenario) -> bool:
    """Pipeline stages of unequal layer counts: asked for (``layout.uneven_pp``), and modelled by
    the profile (the detailed profile sizes the heaviest stage; the seed profile's documents do
    not)."""
    return bool(scenario.layout.uneven_pp) and scenario.profile == "detailed"


def _check_model_split(scenario: Scenario, model: ModelSpec, problems: list[str],
                       warnings: list[str]) -> None:
    """Tensor parallelism divides the model's heads; pipeline parallelism its layers."""
    lay = scenario.layout
    if model.heads is not None and not _divides(lay.tp, model.heads):
        problems.append(f"layout.tp: {lay.tp} does not divide the model's {model.heads} attention heads")
    kv = model.kv_heads_eff
    if kv is not None and model.mla is None and kv % lay.tp and lay.tp % kv:
        problems.append(f"layout.tp: {lay.tp} does not divide the model's {kv} KV heads")
    fault = pp_fault(model, lay.pp, uneven=uneven_pp_allowed(scenario))
    if fault:
        hint = (" (set layout.uneven_pp: true for stages of unequal size)"
                if scenario.profile == "detailed" and lay.pp <= model.layers else "")
        problems.append(f"layout.pp: {lay.pp} {fault}{hint}")
    elif model.layers % lay.pp:
        warnings.append(f"layout.pp: {lay.pp} does not divide {model.layers} layers: the "
                        f"heaviest stage holds {-(-model.layers // lay.pp)}")


def _check_saved_modules(scenario: Scenario, warnings: list[str]) -> None:
    """``modules_to_save`` counts only for a LoRA run (or a search that may relax to one) under
    the detailed profile, ``eval_micro_batch`` only for training under it: elsewhere each is
    said to change nothing."""
    wl = scenario.workload
    if wl.eval_micro_batch and (wl.method == "inference" or scenario.profile == "seed"):
        why = "inference has no evaluation passes" if wl.method == "inference" else \
            "the seed profile (the documents' rules) does not size evaluation; the detailed profile does"
        warnings.append(f"workload.eval_micro_batch: {why}")
    if not wl.modules_to_save:
        return
    if wl.method not in ("lora", "qlora") and "method" not in wl.allow_relax:
        what = "nothing is trained" if wl.method == "inference" else "full fine-tuning trains every module"
        warnings.append(f"workload.modules_to_save: applies to LoRA and QLoRA; {what}")
    elif scenario.profile == "seed":
        warnings.append("workload.modules_to_save: the seed profile (the documents' rules) does not "
                        "count modules trained in full beside the adapters; the detailed profile does")


def _check_sequence(wl: Workload, lay: Layout, model: ModelSpec | None, problems: list[str],
                    warnings: list[str]) -> None:
    """The sequence against the model's context, and context parallelism dividing it."""
    if model is not None and model.max_position and wl.seq_len > model.max_position:
        warnings.append(f"workload.seq_len: {wl.seq_len} exceeds the model's context of "
                        f"{model.max_position} tokens (max_position_embeddings): positions past it "
                        "were never trained, unless the RoPE is scaled to reach them")
    if not _divides(lay.cp, wl.seq_len):
        problems.append(f"layout.cp: {lay.cp} does not divide workload.seq_len {wl.seq_len}")


def _check_experts(lay: Layout, model: ModelSpec | None, dp: int, problems: list[str]) -> None:
    """Expert parallelism needs a mixture-of-experts model, and divides its experts and dp."""
    if lay.ep <= 1:
        return
    if model is not None and model.moe is None:
        problems.append(f"layout.ep: {lay.ep} needs a mixture-of-experts model")
    elif model is not None and model.moe.experts % lay.ep:
        problems.append(f"layout.ep: {lay.ep} does not divide the model's {model.moe.experts} experts")
    if dp % lay.ep:
        problems.append(f"layout.ep: {lay.ep} does not divide dp = {dp} (experts are split within dp)")


def _check_sharding(wl: Workload, lay: Layout, problems: list[str]) -> None:
    """Offload needs ZeRO (parameter offload ZeRO-3); neither applies to inference."""
    if lay.offload != "none" and lay.zero == 0:
        problems.append(f"layout.offload: {lay.offload!r} needs ZeRO/FSDP (layout.zero ≥ 1)")
    if lay.offload == "optimizer+params" and lay.zero != 3:
        problems.append("layout.offload: 'optimizer+params' needs layout.zero: 3 (parameters must be sharded)")
    if wl.method == "inference" and (lay.zero or lay.offload != "none"):
        problems.append("layout.zero: ZeRO and offload apply to training, not to method: inference")


def _derive_grad_accum(wl: Workload, dp: int, problems: list[str]) -> int | None:
    """The workload's grad_accum, derived from global_batch = micro_batch·dp·grad_accum if missing."""
    grad_accum = wl.grad_accum
    if wl.global_batch is None or wl.method == "inference":
        return grad_accum
    per_step = wl.micro_batch * dp
    if grad_accum is None:
        if wl.global_batch % per_step:
            problems.append(
                f"workload.global_batch: {wl.global_batch} is not a multiple of "
                f"micro_batch·dp = {wl.micro_batch}·{dp} = {per_step}"
            )
        else:
            grad_accum = wl.global_batch // per_step
    elif wl.global_batch != per_step * grad_accum:
        problems.append(
            f"workload.global_batch: {wl.global_batch} ≠ micro_batch·dp·grad_accum = "
            f"{wl.micro_batch}·{dp}·{grad_accum} = {per_step * grad_accum}"
        )
    return grad_accum


def _fit_profile(scenario: Scenario, model: ModelSpec | None, problems: list[str],
                 warnings: list[str]) -> Scenario:
    """The scenario, its profile switched to seed where detailed was only the default and the
    model has no full architecture."""
    if scenario.profile != "detailed" or model is None or has_full_architecture(model):
        return scenario
    if "profile" in scenario.model_fields_set:
        problems.append("profile: 'detailed' needs the full architecture (heads, ffn, vocab), "
                        "not only params_b; give them or use profile: seed")
        return scenario
    # The default profile cannot model a model given only as params_b/layers/hidden: the
    # documents' rules (seed) can, and the answer says which profile it used.
    warnings.append("profile: the model gives no full architecture, so the seed profile (the "
                    "documents' rules) is used; give heads, ffn and vocab for the detailed one")
    return scenario.model_copy(update={"profile": "seed"})


def _check_gpu(wl: Workload, lay: Layout, gpu: GpuSpec, problems: list[str], warnings: list[str]) -> None:
    """What the GPU lacks for the workload (BF16, FlashAttention-2), and TP against its node."""
    if wl.precision == "bf16" and not gpu.supports_bf16:
        warnings.append(f"{gpu.name} has no BF16: pure-BF16 training will not run natively; use fp16")
    if wl.precision == "mixed" and not gpu.supports_bf16:
        warnings.append(f"{gpu.name} has no BF16: mixed precision runs as FP16 with loss scaling")
    if lay.attention == "flash" and not gpu.supports_flash_attn2:
        warnings.append(
            f"{gpu.name} has no FlashAttention-2: 'flash' means a memory-efficient kernel (SDPA/xformers)"
        )
    if lay.tp > gpu.gpus_per_node:
        problems.append(f"layout.tp: {lay.tp} exceeds the {gpu.gpus_per_node} GPUs of a {gpu.name} node")
    elif lay.tp > gpu.nvlink_domain:
        warnings.append(f"TP {lay.tp} on {gpu.name} runs over PCIe (NVLink domain {gpu.nvlink_domain})")


def _null_leaves(raw: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(raw, dict):
        return [p for k, v in raw.items() for p in _null_leaves(v, path + (k,))]
    return [path] if raw is None and path else []


def _without(raw: dict[str, Any], path: tuple) -> dict[str, Any]:
    out = dict(raw)
    if len(path) == 1:
        out.pop(path[0], None)
    else:
        out[path[0]] = _without(out[path[0]], path[1:])
    return out


def _unvalidatable(raw: dict[str, Any], exc: Exception) -> list[str]:
    """Lines naming the fields whose value the schema's checks could not even test (an explicit
    ``null`` where a number with bounds is expected): with every null left out the mapping can
    be checked; each null put back alone that breaks the check again is one line."""
    nulls = _null_leaves(raw)[:100]
    bare = raw
    for path in nulls:
        bare = _without(bare, path)

    def breaks(mapping: dict[str, Any]) -> bool:
        try:
            Scenario.model_validate(mapping)
        except ValidationError:
            return False
        except (TypeError, ValueError):
            return True
        return False

    culprits = []
    if nulls and not breaks(bare):
        for path in nulls:  # the other nulls stay out
            if breaks(deep_merge(bare, _nested(path, None))):
                culprits.append(path)
    if not culprits:
        return [f"(top level): cannot be checked: {clip(str(exc), EXCERPT_CHARS)}"]
    lines = [f"{'.'.join(map(str, p))}: null is not a value here (leave the key out for its default)"
             for p in culprits]
    rest = raw
    for path in culprits:
        rest = _without(rest, path)
    try:
        Scenario.model_validate(rest)
    except ValidationError as other:  # the problems of the other fields, as usual
        lines += format_validation_error(other, Scenario)
    except (TypeError, ValueError):
        pass
    return lines


def _nested(path: tuple, value: Any) -> dict[str, Any]:
    out: Any = value
    for key in reversed(path):
        out = {key: out}
    return out


def load_scenarios(path: str | Path) -> list[ResolvedScenario]:
    """Read and resolve every scenario in a file (all problems of all scenarios together)."""
    raws = read_scenario_file(path)
    resolved: list[ResolvedScenario] = []
    problems: list[str] = []
    for i, raw in enumerate(raws):
        source = str(path) if len(raws) == 1 else f"{path}[{i}]"
        try:
            resolved.append(resolve(raw, source=source, base_dir=Path(path).parent))
        except InputError as exc:
            problems.extend(exc.problems)
    if problems:
        raise InputError(problems)
    return resolved
