"""What every exporter needs: the pinned plan as one object, and the bundle they fill."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.core.units import nodes_for
from planner.scenario.resolve import ResolvedScenario

#: Export formats, in the order they are written.
FORMATS = ("deepspeed", "accelerate", "torchrun", "hf", "torchtune", "megatron", "skypilot", "verl")

#: Settings no plan decides: every bundle lists them for the user to fill in.
ALWAYS_FILL_IN = (
    "the training script, dataset and tokenizer/packing to sequences of the planned length",
    ("learning rate, schedule, warm-up, weight decay, gradient clipping and the number of steps "
    "(they change the result, not the memory; planner does not choose them)"),
    "where checkpoints and logs are written",
)


@dataclass
class Bundle:
    """The files of one export (name -> text), what the user must fill in, and what was skipped."""

    files: dict[str, str] = field(default_factory=dict)
    fill_in: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def note(self, fmt: str, text: str) -> None:
        self.notes.append(f"{fmt}: {text}")

    def need(self, fmt: str, text: str) -> None:
        self.fill_in.append(f"{fmt}: {text}")

    def readme(self, title: str, decided: list[str]) -> str:
        lines = [f"# {title}", "", "## Decided by the plan", ""]
        lines += [f"- {d}" for d in decided]
        lines += ["", "## Files", ""]
        lines += [f"- `{name}`" for name in self.files if name != "PLAN.md"]
        if self.skipped:
            lines += ["", "## Not written", ""]
            lines += [f"- {fmt}: {why}" for fmt, why in self.skipped.items()]
        lines += ["", "## You fill in (the plan did not decide these)", ""]
        lines += [f"- {t}" for t in (*ALWAYS_FILL_IN, *self.fill_in)]
        if self.notes:
            lines += ["", "## Notes", ""]
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


#: Sharding back-ends of the Hugging Face files: a bundle points at one of them, never both.
BACKENDS = ("deepspeed", "fsdp")
#: The back-end a plan's stack (catalogs/stacks.yaml) shards with.
STACK_BACKEND = {"hf-deepspeed": "deepspeed", "hf-fsdp": "fsdp", "torchtune": "fsdp", "torchtitan": "fsdp", "verl": "fsdp",
                 "llm-foundry": "fsdp"}


@dataclass(frozen=True)
class Ctx:
    """A pinned plan, with the values every target derives from it."""

    rs: ResolvedScenario
    #: The sharding back-end asked for ("deepspeed" or "fsdp"), or None: chosen from the plan.
    asked_backend: str | None = None
    #: The stack the plan names (``plan --json``), or None.
    stack: str | None = None

    @property
    def backend(self) -> str | None:
        """The one sharding back-end of the bundle: None without ZeRO, else deepspeed or fsdp.

        FSDP has no optimizer-only sharding (ZeRO-1) and no optimizer-only offload: those plans
        are DeepSpeed's whatever was asked. Otherwise the asked back-end, the plan's stack's, or
        DeepSpeed."""
        if self.lay.zero == 0:
            return None
        if self.lay.zero == 1 or self.lay.offload == "optimizer":
            return "deepspeed"
        return self.asked_backend or STACK_BACKEND.get(self.stack or "", "deepspeed")

    @property
    def wl(self):
        return self.rs.workload

    @property
    def lay(self):
        return self.rs.layout

    @property
    def gpu(self):
        return self.rs.gpu

    @property
    def model(self):
        return self.rs.model

    @property
    def grad_accum(self) -> int:
        return self.rs.grad_accum or 1

    @property
    def global_batch(self) -> int:
        return self.wl.micro_batch * self.lay.dp * self.grad_accum

    @property
    def nodes(self) -> int:
        if self.gpu is None:
            return 1
        return nodes_for(self.lay.gpus, self.gpu.gpus_per_node)

    @property
    def per_node(self) -> int | None:
        """GPUs per node, or None when the GPUs do not split evenly over the nodes."""
        return self.lay.gpus // self.nodes if self.lay.gpus % self.nodes == 0 else None

    @property
    def half(self) -> str | None:
        """16-bit compute dtype: ``bf16``, ``fp16`` (mixed on a card without BF16), or None (FP32)."""
        p = self.wl.precision
        if p == "fp32":
            return None
        if p == "fp16" or (p == "mixed" and self.gpu is not None and not self.gpu.supports_bf16):
            return "fp16"
        return "bf16"

    @property
    def torch_dtype(self) -> str:
        return {"bf16": "bfloat16", "fp16": "float16", None: "float32"}[self.half]

    @property
    def lora(self) -> bool:
        return self.wl.method in ("lora", "qlora")

    @property
    def targets(self) -> tuple[str, ...]:
        return self.wl.lora_target_set

    @property
    def all_targets(self) -> bool:
        return "all" in self.wl.lora_targets

    @property
    def has_fa2(self) -> bool:
        return self.gpu is not None and self.gpu.supports_flash_attn2 and self.gpu.vendor == "nvidia"

    @property
    def needs_fa2(self) -> bool:
        """The plan's memory-efficient attention needs FlashAttention-2 itself: a model with
        attention-logit soft-capping (Gemma 2), which SDPA cannot compute."""
        return self.lay.attention == "flash" and bool(getattr(self.model, "attention_softcap", False))

    @property
    def hf_attention(self) -> str:
        """``attn_implementation`` of the plan's attention on its GPU: ``sdpa`` (memory-efficient
        attention, no extra package) unless the model needs FlashAttention-2 and the card runs it;
        never ``flash_attention_2`` on a card without it."""
        if self.lay.attention == "eager":
            return "eager"
        if self.needs_fa2 and self.has_fa2:
            return "flash_attention_2"
        return "sdpa"

    @property
    def hf_optim(self) -> str:
        if self.wl.optimizer == "adamw" and self.detail("optimizer_step", "foreach") == "fused":
            return "adamw_torch_fused"
        return {"adamw": "adamw_torch", "adam8bit": "adamw_bnb_8bit",
                "paged_adamw8bit": "paged_adamw_8bit", "sgd": "sgd", "adafactor": "adafactor",
                "lion": "lion_32bit"}[self.wl.optimizer]

    def detail(self, name: str, default):
        """A workload/layout/recipe detail newer scenario formats carry (the default where absent)."""
        for part in (self.wl, self.lay, self.rs.recipe):
            if name in type(part).model_fields:
                return getattr(part, name)
        return default
