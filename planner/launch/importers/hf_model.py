"""The model-loading side of a Hugging Face job: ``from_pretrained`` kwargs (attention, dtype), a
BitsAndBytesConfig, and the model keys TRL's ModelConfig and alignment-handbook put beside the
Trainer's."""

from __future__ import annotations

from planner.launch.importers.common import is_true
from planner.launch.importers.found import Found


def eight_bit(f: Found, where: str) -> None:
    """An 8-bit (LLM.int8) base under LoRA: the planner's quantized-base method, said so."""
    f.warn(where, "LoRA on an 8-bit (LLM.int8) base: the planner has no such method and reads it as "
           "its quantized-base LoRA ('qlora') with 8-bit weights (quant_bits 8); it is not QLoRA")


def read_bnb(cfg: dict, f: Found, where: str) -> None:
    b4, b8 = is_true(cfg.get("load_in_4bit")), is_true(cfg.get("load_in_8bit"))
    if b4 or b8:
        f.set("method", "qlora", where)
        f.set("quant_bits", 4 if b4 else 8, where + ".load_in_*bit")
        if b4:
            f.set("double_quant", bool(cfg.get("bnb_4bit_use_double_quant", False)),
                  where + ".bnb_4bit_use_double_quant")
            if cfg.get("bnb_4bit_compute_dtype") in ("bfloat16", "torch.bfloat16"):
                f.facts["asks_bf16"] = where + ".bnb_4bit_compute_dtype"
            qt = cfg.get("bnb_4bit_quant_type", "fp4")
            if qt != "nf4":
                f.notes.append(f"{where}.bnb_4bit_quant_type: {qt!r} read as NF4 (same bytes)")
        else:
            eight_bit(f, where + ".load_in_8bit")
    for key in ("bnb_4bit_quant_storage", "llm_int8_threshold", "llm_int8_has_fp16_weight",
                "llm_int8_skip_modules", "llm_int8_enable_fp32_cpu_offload", "quant_method",
                "_load_in_4bit", "_load_in_8bit"):
        cfg.get(key)  # read: the same bytes per weight


def read_model_kwargs(cfg: dict, f: Found, where: str) -> None:
    if cfg.get("pretrained_model_name_or_path"):
        f.set("model", cfg["pretrained_model_name_or_path"], where + ".pretrained_model_name_or_path")
    read_attention(cfg, f, where)
    read_model_dtype(cfg, f, where)
    if isinstance(cfg.get("quantization_config"), dict):
        read_bnb(cfg["quantization_config"], f, where + ".quantization_config")
    for key in ("trust_remote_code", "revision", "device_map", "use_cache", "low_cpu_mem_usage"):
        cfg.get(key)  # read: no bearing on training memory


def read_attention(cfg: dict, f: Found, where: str, key: str = "attn_implementation") -> None:
    attn = cfg.get(key)
    if attn is None:
        if is_true(cfg.get("use_flash_attention_2")):
            f.set("attention", "flash", where + ".use_flash_attention_2")
            f.facts["asks_fa2"] = where + ".use_flash_attention_2"
        return
    f.set("attention", "eager" if str(attn) == "eager" else "flash", f"{where}.{key}")
    if attn == "flash_attention_2":
        f.facts["asks_fa2"] = f"{where}.{key}"


def read_model_dtype(cfg: dict, f: Found, where: str) -> None:
    for key in ("dtype", "torch_dtype"):
        if cfg.get(key) is not None:
            f.facts["model_dtype"] = str(cfg[key]).replace("torch.", "")
            f.facts["model_dtype_where"] = f"{where}.{key}"
            return


def read_model_side(cfg: dict, f: Found, where: str, tool: str) -> None:
    """The model-loading keys TRL's ModelConfig and alignment-handbook put beside the Trainer's."""
    if cfg.get("model_name_or_path"):
        f.set("model", cfg["model_name_or_path"], where + ".model_name_or_path")
    read_attention(cfg, f, where)
    read_model_dtype(cfg, f, where)
    mik = cfg.get("model_init_kwargs")
    if isinstance(mik, dict):
        read_attention(mik, f, where + ".model_init_kwargs")
        read_model_dtype(mik, f, where + ".model_init_kwargs")
        if isinstance(mik.get("quantization_config"), dict):
            read_bnb(mik["quantization_config"], f, where + ".model_init_kwargs.quantization_config")
