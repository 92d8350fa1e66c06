"""A measured-runs CSV and the cells of its rows: the file read with its required columns; a
cell as a number, as lower-cased text, as yes or no, as a release; and the cells every reader of
a row looks at (:class:`RowText`). A row the planner cannot express raises :class:`Unmodelable`,
which says why.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from planner.core.errors import InputError

#: Phrases of an offload or sharding cell that say something is *not* offloaded ("no CPU
#: offload", "no parameter or optimizer offload", "offload: false", "offload_optimizer not
#: stated"), removed before the cell is searched for what is.
NOT_OFFLOADED = (r"\b(no|not|without)\s+(\w+\s+((or|and)\s+\w+\s+)?)?offload\w*"
                 r"|offload\w*\s*[=:]\s*(no|false|off|none)|\w+\s+not\s+stated")


#: The expert-parallel degree a cell states: "EP=8", "EP8", "EP: 8", "expert parallel 8",
#: "expert parallelism 4", "expert_model_parallel_size 8", "--expert-model-parallel-size 8". "EP"
#: in capitals only (not "ep 4 steps", "epoch"), and not a count of nodes or steps after it.
EXPERT_PARALLEL = re.compile(
    r"(?<![\w-])EP\s*[=:]?\s*(\d+)\b(?!\s*(?:nodes?|steps?|epochs?|GPUs?)\b)"
    r"|(?i:(?<!no )expert[ _-]?(?:model[ _-])?parallel(?:ism)?(?:[ _-]size)?\s*[=:(]?\s*(\d+))")


def expert_degree(text: str) -> int:
    """The largest expert-parallel degree ``text`` states (:data:`EXPERT_PARALLEL`); 1 where none."""
    return max((int(a or b) for a, b in EXPERT_PARALLEL.findall(text)), default=1)


#: The experts' own tensor-parallel degree a cell states (Megatron-Core's MoE parallel folding):
#: "ETP=1", "ETP1", "expert tensor parallel 1", "--expert-tensor-parallel-size 1",
#: "expert_tensor_parallel_degree 1" (torchtitan). "ETP" in capitals only.
EXPERT_TENSOR_PARALLEL = re.compile(
    r"(?<![\w-])ETP\s*[=:]?\s*(\d+)\b"
    r"|(?i:expert[ _-]tensor[ _-](?:model[ _-])?parallel(?:ism)?(?:[ _-](?:size|degree))?\s*[=:(]?\s*(\d+))")


def expert_tensor_degree(*texts: str) -> int | None:
    """The experts' own tensor-parallel degree the first of ``texts`` to state one gives
    (:data:`EXPERT_TENSOR_PARALLEL`); None where none does (the experts split like the dense
    layers)."""
    for text in texts:
        found = {int(a or b) for a, b in EXPERT_TENSOR_PARALLEL.findall(text)}
        if len(found) == 1:
            return found.pop()
        if found:
            raise Unmodelable(f"expert tensor parallelism: the row states {sorted(found)}")
    return None


def read_csv(path: str | Path, required: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of a measured-runs CSV; one line per missing ``required`` column, or no file."""
    path = Path(path)
    if not path.is_file():
        raise InputError([f"{path}: no such file"])
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError([f"{path}: missing column {c}" for c in missing])
        return list(reader)


class Unmodelable(ValueError):
    """A row the planner cannot express; the message says why."""


def num(row: dict[str, str], key: str, default: float | None = None) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return default
    try:
        return float(text)
    except ValueError:
        raise Unmodelable(f"{key} {text!r}: not a number") from None


def cell(row: dict[str, str], key: str) -> str:
    return (row.get(key) or "").strip().lower()


def yes(row: dict[str, str], key: str) -> bool:
    return cell(row, key) in ("yes", "true", "1")


def no(row: dict[str, str], key: str) -> bool:
    return cell(row, key) in ("no", "false", "0")


def framework_of(row: dict[str, str]) -> str:
    return cell(row, "framework")


def version_of(text: str) -> tuple[int, ...] | None:
    """``0.42.0`` -> (0, 42, 0); ``<0.43.2`` (only known to be older) -> just below (0, 43, 2)."""
    found = re.search(r"(\d+(?:\.\d+)*)", text)
    if not found:
        return None
    version = tuple(int(x) for x in found.group(1).split("."))
    return version[:-1] + (version[-1] - 1,) if text.startswith("<") else version


#: ``framework`` values on the Hugging Face stack, when a file has no ``hf_model`` column.
HF_FRAMEWORKS = frozenset({"hf-trainer", "hf-accelerate", "trl", "axolotl", "llama-factory", "peft"})


@dataclass(frozen=True)
class RowText:
    """The cells of a row that the readers of its workload and layout look at, lower-cased once."""

    method: str
    opt: str
    prec: str
    framework: str  # the ``framework`` column
    hf_stack: bool  # a transformers model trained with PEFT / the Trainer (``hf_model``)


def text_of(row: dict[str, str]) -> RowText:
    method = row["method"].strip()
    if method not in ("full", "lora", "qlora"):
        raise Unmodelable(f"method {method!r}: only full, lora and qlora runs are modelled")
    if method == "lora" and cell(row, "quant_bits") == "8":
        method = "qlora"  # LoRA over an LLM.int8 base: the planner's quantized-base LoRA, 8 bits
    framework = framework_of(row)
    hf = yes(row, "hf_model") if cell(row, "hf_model") else framework in HF_FRAMEWORKS
    return RowText(method, row["optimizer"].lower(), row["precision"].lower(), framework, hf)
