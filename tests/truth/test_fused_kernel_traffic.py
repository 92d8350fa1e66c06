"""The memory traffic fused kernels save, recounted from the eager ops on the CPU.

``planner.perf.timing.FUSED_NORM_SAVED_VECTORS``, ``FUSED_ROPE_SAVED_VECTORS`` and
``FUSED_SWIGLU_SAVED_VECTORS`` are counts, not fits: the bytes each aten op of transformers' eager
Llama RMSNorm, rotary embedding (``rotate_half`` by slicing, negation and concatenation) and
SwiGLU reads and writes, forward and autograd backward, against a fused kernel's one read and one
write of each tensor. Here the same ops run under a dispatch mode that adds up every op's input
and output bytes (views move nothing), in hidden-size 16-bit vectors per token.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from planner.perf.timing import FUSED_NORM_SAVED_VECTORS, FUSED_ROPE_SAVED_VECTORS, FUSED_SWIGLU_SAVED_VECTORS

HIDDEN, TOKENS = 1024, 32
#: Ops that make views (no bytes moved).
VIEW_OPS = ("aten.view", "aten._unsafe_view", "aten.t.", "aten.transpose", "aten.expand", "aten.slice.",
            "aten.unsqueeze", "aten.squeeze", "aten.as_strided", "aten.detach", "aten.alias", "aten.select.",
            "aten.permute", "aten.split", "aten.reshape")
#: A fused kernel's traffic in vectors per vector of the tensor it transforms: one read and one
#: write forward; backward reads the gradient and writes the input's (RMSNorm also the weight's
#: partial sums, 1.5 more).
FUSED_FORWARD, FUSED_BACKWARD, FUSED_NORM_BACKWARD = 2.0, 2.0, 3.5


class _Traffic(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not str(func).startswith(VIEW_OPS):
            tensors = [t for t in tree_flatten((args, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def _vectors(run, inputs) -> tuple[float, float]:
    """Forward and backward traffic of ``run(*inputs)`` in hidden 16-bit vectors per token."""
    fwd, bwd = _Traffic(), _Traffic()
    with fwd:
        outs = run(*inputs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]
    with bwd:
        torch.autograd.backward(outs, grads)
    per_vector = TOKENS * HIDDEN * 2
    return fwd.bytes / per_vector, bwd.bytes / per_vector


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)


def test_two_rmsnorms_move_what_fused_rmsnorm_saves():
    """transformers' LlamaRMSNorm: 18 vectors forward, 48 backward; fused 2 and 3.5; two a layer."""
    def rms(x, w):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return w * h.to(x.dtype)

    fwd, bwd = _vectors(rms, (_bf16(TOKENS, HIDDEN), _bf16(HIDDEN)))
    saved = 2 * ((fwd - FUSED_FORWARD) + (bwd - FUSED_NORM_BACKWARD))
    assert saved == pytest.approx(FUSED_NORM_SAVED_VECTORS, rel=0.05)


def test_rotary_by_concatenation_moves_what_a_fused_rotary_saves():
    """q·cos + rotate_half(q)·sin for q and a GQA k a quarter as wide: per width of q and k,
    10.1 vectors forward and 14.1 backward; fused 2 and 2."""
    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def rope(q, k, cos, sin):
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    head = 64
    q, k = _bf16(TOKENS, HIDDEN // head, head), _bf16(TOKENS, HIDDEN // head // 4, head)
    cos, sin = (torch.randn(TOKENS, 1, head, dtype=torch.bfloat16) for _ in range(2))
    fwd, bwd = _vectors(rope, (q, k, cos, sin))
    widths = 1.25  # q and k in hidden widths
    saved = (fwd - FUSED_FORWARD * widths) + (bwd - FUSED_BACKWARD * widths)
    assert saved / widths == pytest.approx(FUSED_ROPE_SAVED_VECTORS, rel=0.05)


def test_swiglu_moves_what_a_fused_swiglu_saves():
    """silu(gate)·up: 5 inner-width vectors forward and 9 backward; fused 3 and 5 (the gate and
    up read, one output; backward reads the gradient, gate and up and writes two gradients)."""
    ffn = 3 * HIDDEN
    fwd, bwd = _vectors(lambda g, u: torch.nn.functional.silu(g) * u, (_bf16(TOKENS, ffn), _bf16(TOKENS, ffn)))
    widths = ffn / HIDDEN
    saved = (fwd - 3 * widths) + (bwd - 5 * widths)
    assert saved / widths == pytest.approx(FUSED_SWIGLU_SAVED_VECTORS, rel=0.05)
