"""Launch: turn a plan into the configs people run, and read the configs they already have.

``exporters`` writes, for one plan, the files that implement it (DeepSpeed JSON, accelerate FSDP
config, torchrun command, Hugging Face TrainingArguments + PEFT LoraConfig + BitsAndBytesConfig,
torchtune override, Megatron-LM arguments, SkyPilot task). Every setting the plan decided is in
them; what it did not decide (learning rate, data, output folder…) is listed for the user to fill
in, never invented. ``importers`` reads DeepSpeed, accelerate, TrainingArguments, TRL,
LLaMA-Factory, PEFT, axolotl and torchtune configs into a scenario overlay, and warns of the
mistakes people make in them. The words both directions share (FSDP's strategies, DeepSpeed's
ZeRO blocks, PEFT's module names) are one table each in ``planner.core.codes``.
"""
