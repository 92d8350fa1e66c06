"""litgpt's chunked LoRA loss against real PyTorch on the CPU: the peak bytes over a step's loss.

litgpt's LoRA loop (``finetune/lora.py``) runs the frozen ``lm_head`` on 128-token slices of the
sequence, Lightning Fabric casts the returned list to FP32 (``convert_output``), the loop keeps
that list in a variable until the next step's forward returns, and the cross-entropy runs per
chunk. :func:`planner.memory.logits.loss_bytes` says what that costs; here the same operations run
under ``torch.profiler`` with ``profile_memory=True`` and every allocation and free is replayed
to find the measured peak, for a run's first step and for a step whose predecessor's logits are
still held. What the formula leaves out is the vocabulary-free rest (the final hidden states, their
gradient, token ids, a chunk's CPU matmul scratch): :data:`REST_BYTES_PER_TOKEN` per token bounds it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from harness import peak_bytes as _peak_bytes
from torch.profiler import ProfilerActivity, profile

from planner.core.entries import ModelSpec
from planner.memory.logits import LOSS_CHUNKS, loss_bytes

HIDDEN = 64
#: Bytes per token allowed beside the formula: the hidden states, their gradient and a chunk's
#: CPU bf16 matmul scratch (at most 8·h in all; 392 measured at h = 64) and token ids and targets
#: (2·8) — against vocabulary-wide terms of 9–12 bytes per logit, V ≥ 4000 logits per token.
REST_BYTES_PER_TOKEN = 8 * HIDDEN + 16


def _chunked_cross_entropy(logits, targets):
    """litgpt ``utils.chunked_cross_entropy`` for a list of logit chunks (as its LoRA loop calls it)."""
    chunks = [c.reshape(-1, c.size(-1)) for c in logits]
    target_chunks = [t.reshape(-1) for t in targets.split(logits[0].size(1), dim=1)]
    losses = [torch.nn.functional.cross_entropy(c, t, ignore_index=-100, reduction="none")
              for c, t in zip(chunks, target_chunks)]
    n = (targets != -100).sum()
    return torch.cat(losses).sum() / n.maximum(torch.ones_like(n))


def _steps(b: int, s: int, vocab: int, steps: int) -> int:
    """Peak bytes allocated (above the frozen weight) over ``steps`` training steps of the loss."""
    weight = torch.randn(vocab, HIDDEN, dtype=torch.bfloat16)  # frozen lm_head
    held: list = []

    def run() -> None:
        nonlocal held
        for _ in range(steps):
            x = torch.randn(b, s, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
            ids = torch.randint(0, vocab, (b, s))
            out = [torch.nn.functional.linear(xi, weight) for xi in x.split(128, dim=1)]
            logits = [o.to(torch.float32) for o in out]  # Fabric's convert_output
            del out
            held = logits  # the loop's variable: the previous step's list is released here
            logits[-1] = logits[-1][..., :-1, :]
            loss = _chunked_cross_entropy(logits, ids[..., 1:])
            loss.backward()
            del x, ids, loss, logits

    return _peak_bytes(run)


def _model(vocab: int, impl: str = "litgpt") -> ModelSpec:
    return ModelSpec(id="tiny", layers=1, hidden=HIDDEN, heads=4, kv_heads=4, ffn=128, vocab=vocab,
                     impl=impl, fused_qkv=True, tied_embeddings=False)


@pytest.mark.parametrize("b,s,vocab", [(1, 1024, 8000), (2, 1024, 8000), (2, 256, 4000),
                                       (4, 512, 6000)])
@pytest.mark.parametrize("first_step", [True, False], ids=["first-step", "steady"])
def test_litgpt_chunked_loss_peak_matches_the_profiler(b, s, vocab, first_step):
    measured = _steps(b, s, vocab, 1 if first_step else 2)
    _, peak, held = loss_bytes(_model(vocab), 2, b * s, "chunked", batch=b, first_step=first_step)
    assert held == 4 * vocab * b * s  # the FP32 list the loop keeps
    assert peak <= measured <= peak + REST_BYTES_PER_TOKEN * b * s, (measured, peak)


def test_the_held_list_is_what_stays_after_a_step():
    """After two steps nothing but the loop's FP32 list of the last step remains allocated."""
    b, s, vocab = 2, 512, 4000
    weight = torch.randn(vocab, HIDDEN, dtype=torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        held = None
        for _ in range(2):
            x = torch.randn(b, s, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
            logits = [torch.nn.functional.linear(xi, weight).to(torch.float32)
                      for xi in x.split(128, dim=1)]
            held = logits
            _chunked_cross_entropy(logits, torch.randint(0, vocab, (b, s))).backward()
            del x, logits
    end = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    _, _, want = loss_bytes(_model(vocab), 2, b * s, "chunked", batch=b)
    assert held is not None
    assert want <= end <= want + REST_BYTES_PER_TOKEN * b * s


class _LegacyBnb4bitMatmul(torch.autograd.Function):
    """bitsandbytes' ``MatMul4Bit`` before 0.43.2: dequantizes its weight for each use, forward
    and backward, and keeps its input on the context (``ctx.tensors``), not via
    ``save_for_backward``, so backward does not release it. An int8 weight stands for the
    4-bit one; its bf16 copy is the dequantized weight."""

    @staticmethod
    def forward(ctx, a, w_q):
        ctx.tensors = (a, w_q)
        return torch.nn.functional.linear(a, w_q.to(a.dtype))

    @staticmethod
    def backward(ctx, grad):
        _, w_q = ctx.tensors
        return grad @ w_q.to(grad.dtype), None


@pytest.mark.parametrize("b,s,vocab,hidden,layers", [(2, 1024, 1000, 256, 6), (1, 2048, 2000, 128, 8)])
def test_legacy_bnb_inputs_outlive_backward_until_the_loop_lets_go(b, s, vocab, hidden, layers):
    """litgpt's QLoRA loop over a stack of legacy bitsandbytes linears and a quantized, chunked
    head: at a steady step the previous step's graph, with every input its contexts keep, lives
    until the new forward has returned (the loop's ``loss`` and ``logits`` still point at it).
    The shapes keep the dequantized weights small: the CPU's matmul copies a transposed weight
    operand that cuBLAS reads in place, so the CPU cannot show the head's dequantization."""
    tokens = b * s
    weights = [torch.randint(-8, 8, (hidden, hidden), dtype=torch.int8) for _ in range(layers)]
    head = torch.randint(-8, 8, (vocab, hidden), dtype=torch.int8)

    def model(x):
        for w in weights:
            x = _LegacyBnb4bitMatmul.apply(x, w) * 0.01
        return [_LegacyBnb4bitMatmul.apply(xi, head) for xi in x.split(128, dim=1)]

    def run():
        held = loss = None
        for _ in range(2):
            x = torch.randn(b, s, hidden, dtype=torch.bfloat16, requires_grad=True)
            ids = torch.randint(0, vocab, (b, s))
            out = model(x)
            logits = [o.to(torch.float32) for o in out]
            del out
            held = logits
            logits[-1] = logits[-1][..., :-1, :]
            loss = _chunked_cross_entropy(logits, ids[..., 1:])
            loss.backward()
            del x, ids, logits
        return held, loss

    measured = _peak_bytes(run)
    # Each step's inputs on the contexts: every layer's (its ``* 0.01`` product is the next
    # layer's input) and the head's (the final hidden states): (layers + 1)·e·h per token.
    inputs = (layers + 1) * 2 * hidden * tokens
    spec = ModelSpec(id="tiny", layers=max(layers, 1), hidden=hidden, heads=4, kv_heads=4, ffn=128,
                     vocab=vocab, impl="litgpt", fused_qkv=True, tied_embeddings=False)
    _, peak, _ = loss_bytes(spec, 2, tokens, "chunked", batch=b, carried=inputs,
                                head_dequant=vocab * hidden * 2)
    want = inputs + peak
    assert want <= measured <= want + REST_BYTES_PER_TOKEN * tokens * hidden / HIDDEN, (measured, want)


def test_compiled_cross_entropy_keeps_only_the_logits():
    """torchtitan's loss, ``cross_entropy(pred.flatten(0, 1).float(), labels)``, compiled: Inductor
    fuses the upcast, log-softmax and their backward, so the step holds the bf16 logits and
    their bf16 gradient (4 bytes per logit; eager holds 12 once the loop drops ``pred``)."""
    def loss_fn(pred, labels):
        return torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    compiled = torch.compile(loss_fn)
    b, s, vocab = 2, 512, 4000
    labels = torch.randint(0, vocab, (b, s))

    def step(fn):
        pred = torch.randn(b, s, vocab, dtype=torch.bfloat16, requires_grad=True)
        fn(pred, labels).backward()

    try:
        step(compiled)  # compiles outside the measurement
    except Exception as exc:  # noqa: BLE001 - no C++ toolchain for Inductor's CPU kernels
        pytest.skip(f"torch.compile unavailable here: {type(exc).__name__}")
    spec = _model(vocab, impl="hf")
    _, want, _ = loss_bytes(spec, 2, b * s, "compiled")
    measured = _peak_bytes(lambda: step(compiled))
    assert want <= measured <= want + REST_BYTES_PER_TOKEN * b * s, (measured, want)
    _, eager_want, _ = loss_bytes(spec, 2, b * s, "standard")
    eager = _peak_bytes(lambda: step(loss_fn))  # the leaf ``pred`` stays: + its e bytes
    assert eager_want + 2 * vocab * b * s <= eager <= eager_want + 2 * vocab * b * s + REST_BYTES_PER_TOKEN * b * s


def _head(vocab: int, trainable: bool):
    head = torch.nn.Linear(HIDDEN, vocab, bias=False).to(torch.bfloat16)
    head.weight.requires_grad_(trainable)
    return head


@pytest.mark.parametrize("s, vocab", [(512, 4000), (1024, 8000)])
def test_torchtune_linear_cross_entropy_keeps_every_chunks_log_probabilities(s, vocab):
    """torchtune's ``LinearCrossEntropyLoss`` (8 chunks; masked hidden states, head, FP32
    cross-entropy per chunk, one backward at the end), full fine-tuning (the head trains):
    ``chunked_head``. Predicted before it was first measured: 21.6 MB at s = 512, V = 4000
    (one chunk's logits counted too); measured 20.6 MB, so the chunk's transient is its two FP32
    gradients only."""
    b, n = 2, LOSS_CHUNKS
    hidden = torch.randn(b, s, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    head, targets = _head(vocab, True), torch.randint(0, vocab, (b, s))

    def step():
        total = 0.0
        for hc, tc in zip(hidden.tensor_split(n, dim=1), targets.tensor_split(n, dim=1)):
            keep = tc != -100
            total = total + torch.nn.functional.cross_entropy(head(hc[keep]).float(), tc[keep], reduction="sum")
        (total / (b * s)).backward()

    _, want, _ = loss_bytes(_model(vocab, impl="hf"), 2, b * s, "chunked_head")
    measured = _peak_bytes(step)
    assert want <= measured <= want + REST_BYTES_PER_TOKEN * b * s, (measured, want)
    _, standard, _ = loss_bytes(_model(vocab, impl="hf"), 2, b * s, "standard")
    assert measured < 0.5 * standard


@pytest.mark.parametrize("s, vocab", [(512, 4000), (1024, 8000)])
@pytest.mark.parametrize("trainable", [False, True])
def test_torchtitan_chunked_loss_runs_each_chunks_backward_in_the_forward(s, vocab, trainable):
    """torchtitan's ``ChunkedLossWrapper`` (8 chunks of detached hidden states; each chunk's
    head, loss and backward in the forward, into one buffer of the hidden states' gradient):
    ``chunked_head_in_forward``. Where the head trains its weight gradient (a parameter's, counted
    with the gradients) comes on top."""
    b, n = 2, LOSS_CHUNKS
    hidden = torch.randn(b, s, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    head, targets = _head(vocab, trainable), torch.randint(0, vocab, (b, s))

    def step():
        h = hidden.detach()
        buffer = torch.zeros_like(h)
        width = s // n
        for i, (hc, tc) in enumerate(zip(h.tensor_split(n, dim=1), targets.tensor_split(n, dim=1))):
            leaf = hc.detach().requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(head(leaf).flatten(0, 1).float(), tc.flatten(0, 1),
                                                     reduction="sum") / (b * s)
            loss.backward()
            buffer[:, i * width:(i + 1) * width] = leaf.grad
        hidden.backward(buffer)

    _, want, _ = loss_bytes(_model(vocab, impl="hf"), 2, b * s, "chunked_head_in_forward")
    head_grad = 2 * vocab * HIDDEN if trainable else 0
    measured = _peak_bytes(step)
    assert want + head_grad <= measured <= want + head_grad + REST_BYTES_PER_TOKEN * b * s, (measured, want)
