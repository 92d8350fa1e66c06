"""Read the configs people already have (``--config``) into a scenario overlay, one module per tool.

``configs`` loads each file, tells its tool from its keys and runs that tool's reader:
``deepspeed`` (DeepSpeed JSON), ``accelerate`` (accelerate YAML), ``hf_trainer`` (transformers'
TrainingArguments), ``hf_model`` (``from_pretrained`` kwargs, BitsAndBytesConfig), ``peft``
(LoraConfig), ``trl`` (TRL and alignment-handbook recipes), ``llamafactory``, ``axolotl`` and
``torchtune``. Each fills a ``found.Found``, which accounts for every key; ``common`` holds the
value parsing they share; ``checks`` warns of the mistakes people make in the configs, against
what the estimate found.
"""

from planner.launch.importers.checks import annotate
from planner.launch.importers.configs import CONFIG_HELP, merge_configs, read_configs

__all__ = ["CONFIG_HELP", "annotate", "merge_configs", "read_configs"]
