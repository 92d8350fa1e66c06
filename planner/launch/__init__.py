"""Launch: turn a plan into the configs people run, and read the configs they already have.

``export`` writes, for one plan, the files that implement it (DeepSpeed JSON, accelerate FSDP
config, torchrun command, Hugging Face TrainingArguments + PEFT LoraConfig + BitsAndBytesConfig,
torchtune override, Megatron-LM arguments, SkyPilot task). Every setting the plan decided is in
them; what it did not decide (learning rate, data, output folder…) is listed for the user to fill
in, never invented. ``importers`` reads DeepSpeed, accelerate, TrainingArguments, axolotl and
torchtune configs into a scenario overlay; ``checks`` warns of the mistakes people make in them.
"""

from planner.launch.common import FORMATS, Bundle
from planner.launch.export import export_plan, export_resolved, load_plan

__all__ = ["FORMATS", "Bundle", "export_plan", "export_resolved", "load_plan"]
