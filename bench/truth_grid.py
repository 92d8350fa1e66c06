"""Print the ground-truth grid: bytes saved for backward by a real HF Llama (+PEFT) on the CPU
against the detailed profile's formulas, per recipe and shape.

    pip install ".[truth]"   # torch==2.13.0 (CPU), transformers, peft
    python bench/truth_grid.py
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "truth"))

import torch
from harness import Shape, build, measure, predicted

RECIPES = {
    "bf16 sdpa full": {"dtype": torch.bfloat16, "attention": "sdpa", "lora": False},
    "bf16 eager full": {"dtype": torch.bfloat16, "attention": "eager", "lora": False},
    "fp32 sdpa full": {"dtype": torch.float32, "attention": "sdpa", "lora": False},
    "bf16 sdpa lora fp32-adapters": {"dtype": torch.bfloat16, "attention": "sdpa", "lora": True},
    "bf16 eager lora bf16-adapters": {"dtype": torch.bfloat16, "attention": "eager", "lora": True,
                                          "adapter_fp32": False},
    "bf16 sdpa full ckpt": {"dtype": torch.bfloat16, "attention": "sdpa", "lora": False, "checkpointing": True},
    "bf16 sdpa lora dropout": {"dtype": torch.bfloat16, "attention": "sdpa", "lora": True, "dropout": 0.1},
}
SHAPES = [Shape(b=b, s=s, h=h, heads=h // 32, kv_heads=kv, f=f, layers=2, vocab=v)
          for b, s, (h, kv), f, v in itertools.product(
              (1, 2), (64, 160), ((128, 2), (256, 8)), (344, 688), (512, 2000))]


def main() -> int:
    worst = 0
    n = 0
    start = time.time()
    print(f"{'recipe':32} {'shape (b,s,h,kv,f,V)':26} {'layer measured':>15} {'formula':>12} "
          f"{'Δ layers':>9} {'Δ outside':>9}")
    for (name, kw), shape in itertools.product(RECIPES.items(), SHAPES):
        got, want = measure(build(shape, **kw), shape), predicted(shape, **kw)
        d_layers = max(abs(g - w) for g, w in zip(got.layers, want["layers"]))
        d_out = abs(got.outside - want["outside"]) + abs(got.shared - want["shared"])
        worst = max(worst, d_layers)
        n += 1
        dims = f"{shape.b},{shape.s},{shape.h},{shape.kv_heads},{shape.f},{shape.vocab}"
        print(f"{name:32} {dims:26} {got.layers[-1]:15,} {int(want['layers'][-1]):12,} "
              f"{d_layers:9,.0f} {d_out:9,.0f}")
    print(f"{n} runs in {time.time() - start:.0f} s; largest per-layer difference: {worst:,.0f} bytes")
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
