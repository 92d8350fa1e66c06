"""Write, for one plan, the files that implement it (``planner export``).

``bundle`` reads the plan (``planner plan --json`` output, or a scenario and a rank) and fills one
bundle: ``frameworks`` writes the launchers and sharding back-ends (DeepSpeed JSON, accelerate
config, torchrun command, SkyPilot task), ``recipes`` the training recipes (Hugging Face
TrainingArguments + PEFT LoraConfig + BitsAndBytesConfig, torchtune override, Megatron-LM
arguments). ``common`` holds the pinned plan as one object and the bundle they fill.
"""

from planner.launch.exporters.bundle import export_plan, export_resolved, load_plan, write_bundle
from planner.launch.exporters.common import BACKENDS, FORMATS, Bundle

__all__ = ["BACKENDS", "FORMATS", "Bundle", "export_plan", "export_resolved", "load_plan", "write_bundle"]
