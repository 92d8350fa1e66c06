"""The logits and the cross-entropy loss of one training step, per loss implementation.

Bytes on one GPU, as (saved at the end of forward, peak while the loss runs, held by the
training loop): the standard FP32 cross-entropy (Hugging Face, torchtitan; PyTorch's
``loss_parallel`` under TP), torchtune's chunked loss and chunked head, torchtitan's chunked loss
in the forward, losses compiled with torch.compile, Liger's fused linear cross-entropy, Cut
Cross-Entropy, Unsloth's losses, TRL's row-wise log-softmax (16-bit and FP32), a cross-entropy
left in the compute dtype and litgpt's
chunked LoRA head; and the peak of an evaluation forward's loss. Symbols as in
:mod:`planner.memory.activations` (e bytes of the compute dtype, V vocabulary).
"""

from __future__ import annotations

from planner.core.arch import _dims
from planner.core.entries import ModelSpec
from planner.core.memo import by_spec
from planner.memory.inventory import FP32

#: Tokens per sequence chunk of litgpt's LoRA ``lm_head`` and chunked cross-entropy
#: (``lm_head_chunk_size=128`` splits the sequence dimension, so a chunk holds micro-batch × 128
#: tokens; ``chunked_cross_entropy(chunk_size=128)``; litgpt ``finetune/lora.py``, ``utils.py``).
LITGPT_LM_HEAD_CHUNK = 128
#: Bytes per logit that litgpt's training loop holds: Lightning Fabric's precision plugins
#: (``HalfPrecision`` for bf16-true/16-true, ``BitsandbytesPrecision``, ``FSDPPrecision``) cast a
#: module's floating outputs to ``torch.get_default_dtype()`` in ``convert_output`` (Lightning
#: ``fabric/wrappers.py``, ``_FabricModule.forward``, since 2023-04), so the logits reach the loop
#: and the loss in FP32 whatever the compute dtype.
FABRIC_OUTPUT_BYTES = 4
#: FP32 vocabulary-wide tensors alive per token at the peak of ``loss_parallel``'s backward:
#: the saved log-probabilities x, ``grad_input = torch.zeros_like(x)``, the sum
#: ``grad_input + torch.exp(x)`` and its product with the incoming gradient (the ``exp`` temporary
#: is freed by then). Source: PyTorch ``torch/distributed/tensor/parallel/loss.py``,
#: ``_nll_loss_and_log_softmax_backward`` (unchanged since loss parallel landed in 2024).
LOSS_PARALLEL_BACKWARD_FP32_COPIES = 4
#: FP32 vocabulary-wide tensors per token when the loop holds FP32 logits (``loss: held_fp32``):
#: at the end of forward the held logits and the saved log-probabilities; at the log-softmax
#: backward also the log-probabilities' gradient and the logits' gradient. Source: torchtune
#: ``recipes/lora_finetune_single_device.py`` and ``full_finetune_single_device.py`` with
#: ``torchtune/modules/transformer.py`` (``.float()``), from Jan 2024 to PR #1390 (Aug 2024).
HELD_FP32_SAVED_COPIES = 2
HELD_FP32_PEAK_COPIES = 4
#: Chunks of torchtune's ``CEWithChunkedOutputLoss`` and ``LinearCrossEntropyLoss``
#: (``num_output_chunks = 8``) and of torchtitan's ``ChunkedLossWrapper`` (``num_chunks = 8``).
LOSS_CHUNKS = 8
#: Cut Cross-Entropy's backward indexes the valid tokens with an int64 tensor
#: (``_build_flat_valids`` in apple/ml-cross-entropy).
CCE_INDEX_BYTES = 8


@by_spec
def loss_bytes(model: ModelSpec, e: int, tokens: int, loss: str, tp: int = 1,
               compiled: bool = False, batch: int = 1, first_step: bool = False,
               carried: float = 0.0, head_dequant: float = 0.0) -> tuple[float, float, float]:
    """(saved at the end of forward, peak while the loss runs, held by the training loop) for the
    logits and cross-entropy. ``held`` stays alive after the loss's backward, through the rest of
    backward and the optimizer step, until the next step's forward returns (a loop variable).
    Where the loop holds the previous step's outputs, their graph lives as long: ``carried`` is
    what that graph keeps beside them (inputs on an autograd context), ``head_dequant`` the
    dequantized weight of a quantized ``lm_head`` (made for each chunk, forward and backward).

    ``standard`` (HF ``ForCausalLMLoss``, torchtitan): logits in the compute dtype are upcast
    to FP32 and ``log_softmax`` keeps its FP32 output (4V per token) for backward; at the start
    of backward the FP32 gradient of the log-probabilities and of the logits exist beside it:
    12V per token (forward: e + 4 + 4). ``chunked`` (torchtune ``CEWithChunkedOutputLoss``):
    the compute-dtype logits stay (e·V) and FP32 exists for one chunk at a time (12V/chunks);
    litgpt's chunked LoRA loss differs (see :func:`_litgpt_chunked`). ``fused`` (Liger FLCE, Cut Cross-Entropy): logits never exist whole;
    Liger's chunks are N/⌈V/h⌉ tokens, so about 12·h per token. Vocab-parallel loss divides by TP;
    under TP the standard loss is PyTorch's ``loss_parallel``, whose backward peaks at 16V.
    ``compiled`` (torchtune compiles the chunk's cross-entropy with torch.compile): the upcast,
    log-softmax and gradient of a chunk fuse, so a chunk adds only its e-byte gradient; the loss
    ``compiled`` does the same for the whole unchunked cross-entropy (torchtitan since 2025-04).
    ``cce`` (Cut Cross-Entropy) never forms logits: an FP32 log-sum-exp per token, and at its
    backward the gradient of the hidden states (e·h per token) and the token indices.
    ``in_forward`` (Unsloth's fused loss, 2025): the loss and its gradient run in the forward,
    the logits in the compute dtype and FP32 at once; the hidden states' gradient is kept.
    ``inplace`` (Unsloth's Triton cross-entropy, 2024): e-byte logits, gradient in place.
    ``chunked_head`` (torchtune ``LinearCrossEntropyLoss``, the default of its shipped configs
    since 2025-04): per chunk of tokens the masked hidden states (a copy, e·h, which the head's
    matmul saves where the head trains), the head's e-byte logits and their FP32 upcast, whose
    ``log_softmax`` keeps its FP32 output; no whole logits exist, but every chunk's graph stays
    until the one backward: 4V + e·h per token saved, and one chunk's two FP32 gradients above.
    ``xentropy`` (flash-attn's cross-entropy kernel, llm-foundry's default): as ``compiled``.
    ``chunked_head_in_forward`` (torchtitan ``ChunkedLossWrapper``, its Llama 3 recipes' default
    since 2026-06): the hidden states are detached and each chunk's head, loss and backward run
    in the forward, its gradient written into one buffer of the hidden states' gradient (e·h
    per token, kept for the model's backward); one chunk's log-probabilities and their two FP32
    gradients exist at a time.
    """
    saved, peak, held = _loss_bytes(model, e, tokens, loss, tp, compiled, batch, first_step,
                                    carried, head_dequant)
    if model.logit_softcap and loss not in ("fused", "cce", "in_forward", "inplace", "chunked_head",
                                            "chunked_head_in_forward"):
        # tanh(logits / cap) · cap keeps the tanh output (e per logit) until its backward, which
        # runs after the loss's (HF Gemma 2; litgpt, per chunk of its LoRA head since 2024-12).
        (vocab,) = _dims(model, "vocab")
        cap = e * vocab / tp * tokens
        saved, peak = saved + cap, peak + cap
    return saved, peak, held


def _loss_bytes(model: ModelSpec, e: int, tokens: int, loss: str, tp: int, compiled: bool,
                batch: int, first_step: bool, carried: float,
                head_dequant: float) -> tuple[float, float, float]:
    (vocab,) = _dims(model, "vocab")
    v = vocab / tp
    if model.impl == "litgpt" and loss in ("chunked", "standard"):
        # litgpt's loops (``finetune/lora.py``, ``full.py``) keep ``logits`` from one step to the
        # next, in FP32 after Fabric's output cast (FABRIC_OUTPUT_BYTES).
        held = FABRIC_OUTPUT_BYTES * v * tokens
        if loss == "chunked":
            return _litgpt_chunked(e, v, tokens, batch, held, first_step, carried,
                                   head_dequant) + (held,)
        saved, peak = _logits_standard(e, v, tokens, tp)
        return saved * tokens, peak * tokens, held
    if loss == "held_fp32":
        # torchtune before its chunked loss (PR #1390, 2024-08-28): ``TransformerDecoder``
        # returns ``self.output(h).float()``, the recipe keeps ``logits = logits[..., :-1, :]
        # .contiguous().transpose(1, 2)`` alive through ``loss.backward()``, and
        # ``nn.CrossEntropyLoss`` keeps its FP32 log-probabilities. At the log-softmax backward
        # the held logits, the log-probabilities, their gradient (``nll_loss`` backward) and the
        # logits' gradient exist at once.
        return (HELD_FP32_SAVED_COPIES * FP32 * v * tokens, HELD_FP32_PEAK_COPIES * FP32 * v * tokens,
                FP32 * v * tokens)
    if loss == "standard":
        saved, peak = _logits_standard(e, v, tokens, tp)
    elif loss == "vocab_parallel":
        # Megatron-Core's ``vocab_parallel_cross_entropy`` (``tensor_parallel/cross_entropy.py``:
        # ``.float()``, ``torch.exp(..., out=exp_logits)``, ``save_for_backward(exp_logits, ...)``,
        # the backward's ``grad_input = softmax`` updated in place): the FP32 softmax is saved
        # (4 per logit); the compute-dtype logits beside it while the loss runs, and the
        # compute-dtype cast of its gradient in backward (e + 4 at either peak).
        saved, peak = FP32 * v, (e + FP32) * v
    elif loss in ("compiled", "xentropy"):
        # Inductor fuses the FP32 upcast, log-softmax and NLL: it keeps the e-byte logits (and a
        # per-token log-sum-exp) and writes the e-byte gradient in one kernel (2e per logit at
        # the peak; ``tests/truth`` measures it on the CPU). flash-attn's cross-entropy kernel
        # (``flash_attn.losses.cross_entropy``, llm-foundry's ``fused_crossentropy``) keeps the
        # same: the e-byte logits and an FP32 log-sum-exp, and an e-byte gradient in backward.
        saved, peak = e * v, 2 * e * v
    elif loss == "chunked":
        saved = e * v
        peak = e * v + (e if compiled else 3 * FP32) * v / LOSS_CHUNKS
    elif loss == "cce":
        # Cut Cross-Entropy (apple/ml-cross-entropy): the forward keeps an FP32 log-sum-exp per
        # token; the backward adds each vocabulary block's share into a zeroed gradient of the
        # hidden states (``tl_lock_add``, the hidden states' dtype) and indexes the tokens
        # (int64). Nothing vocabulary-wide exists.
        return FP32 * tokens, (e * model.hidden + FP32 + CCE_INDEX_BYTES) * tokens, 0.0
    elif loss == "chunked_head":
        # at the start of backward: every chunk's log-probabilities, and for the last chunk the
        # FP32 gradient of its log-probabilities and of its logits (tests/truth measures it)
        saved = FP32 * v + e * model.hidden
        peak = saved + 2 * FP32 * v / LOSS_CHUNKS
    elif loss == "chunked_head_in_forward":
        # a chunk's backward: its log-probabilities and their two FP32 gradients (the logits and
        # their upcast are freed by then), beside the hidden states' gradient buffer
        saved = e * model.hidden
        peak = saved + 3 * FP32 * v / LOSS_CHUNKS
    elif loss == "inplace":
        # Unsloth's ``Fast_CrossEntropyLoss`` (unsloth/kernels/cross_entropy_loss.py, 2024):
        # ``save_for_backward(logits, logsumexp, labels)`` with the logits in the compute dtype
        # (upcast to FP32 only in the kernel's registers); the backward writes the gradient
        # into the saved logits and returns them.
        saved = e * v + FP32
        peak = saved
    elif loss == "in_forward":
        # Unsloth's ``unsloth_fused_ce_loss`` (unsloth_zoo 2025.9, fused_losses/
        # cross_entropy_loss.py): in the forward, each chunk's logits (e bytes) are upcast to
        # FP32 for the cross-entropy, and ``torch.func.grad_and_value`` writes the hidden states'
        # gradient (e·h per token, kept for backward). Chunks are sized to half the free memory:
        # one chunk unless the FP32 logits exceed it, so sized here as one.
        saved = e * model.hidden
        peak = (e + FP32) * v + e * model.hidden
    elif loss == "rowwise":
        # TRL's ``selective_log_softmax`` on 16-bit logits (the DPO family's per-token
        # log-probabilities): ``log_softmax`` row by row (one sequence at a time) in the compute
        # dtype, each row's output saved for its backward; the logits are freed once the rows
        # are taken (no node saves them). At the end of the forward the logits and every row's
        # log-probabilities exist (2e per logit); at the end of the backward every row's
        # gradient and their stack into the logits' gradient (2e).
        saved = e * v
        peak = 2 * e * v
    elif loss == "compute_dtype":
        # ``nn.CrossEntropyLoss`` on the compute-dtype logits, the whole batch at once, in a loop
        # with neither autocast nor ``.float()`` (PyTorch's ``log_softmax`` then writes its
        # output in the input's dtype and saves it; ``nll_loss`` saves the same tensor). At the
        # start of backward the ``nll_loss`` gradient (dense, e per logit) and the
        # ``log_softmax`` gradient exist beside the saved log-probabilities: 3e at the peak.
        # The forward peaks as high where the loop shifts the logits into a contiguous copy
        # (``logits[:, :-1].reshape(-1, V)`` of more than one sequence copies them): the logits,
        # the copy and the log-probabilities. Unlike ``rowwise`` no row is released early.
        saved = e * v
        peak = 3 * e * v
    elif loss == "rowwise_fp32":
        # the same with each row upcast to FP32 before ``log_softmax`` (TRL's logsumexp path for
        # FP32 logits keeps as much; the H200 DPO runner): FP32 log-probabilities saved; at the
        # end of the forward the logits, every row's log-probabilities and the last row's FP32
        # copy; the backward's first row adds its two FP32 gradients to the saved rows, less.
        saved = FP32 * v
        peak = (e + FP32) * v + FP32 * v / max(batch, 1)
    else:
        saved = 0.0
        peak = 3 * FP32 * model.hidden
    return saved * tokens, peak * tokens, 0.0


def eval_loss_bytes(model: ModelSpec, e: int, tokens: int, loss: str, tp: int = 1) -> float:
    """Peak bytes of the logits and the loss in an evaluation forward (no gradients): the loss's
    forward only (see :func:`loss_bytes`). ``standard``: the compute-dtype logits, their FP32
    upcast and the FP32 log-probabilities at once (e + 4 + 4 per logit); ``chunked``: the logits
    and one chunk's upcast and log-probabilities; ``chunked_head`` and ``chunked_head_in_forward``:
    one chunk's logits, upcast and log-probabilities; ``compiled`` and ``inplace``: the logits;
    ``in_forward``: the logits and their FP32 copy; ``fused`` and ``cce`` form no logits."""
    (vocab,) = _dims(model, "vocab")
    v = vocab / tp
    if loss in ("standard", "held_fp32"):
        per = (e + 2 * FP32) * v
    elif loss == "chunked":
        per = e * v + 2 * FP32 * v / LOSS_CHUNKS
    elif loss in ("chunked_head", "chunked_head_in_forward"):  # one chunk's logits, upcast, log-probs
        per = (e + 2 * FP32) * v / LOSS_CHUNKS
    elif loss in ("compiled", "inplace", "xentropy"):
        per = e * v
    elif loss in ("in_forward", "vocab_parallel"):  # the logits and their FP32 copy
        per = (e + FP32) * v
    elif loss == "cce":
        per = FP32
    elif loss in ("rowwise", "rowwise_fp32", "compute_dtype"):  # the logits and the log-probabilities
        per = (e + (FP32 if loss == "rowwise_fp32" else e)) * v
    else:  # fused (Liger): chunks of about V/h tokens
        per = 3 * FP32 * model.hidden
    return per * tokens


def _logits_standard(e: int, v: float, tokens: int, tp: int) -> tuple[float, float]:
    """Per token: (saved, peak) of the unchunked FP32 cross-entropy (see :func:`loss_bytes`)."""
    if tp > 1:
        # PyTorch's ``loss_parallel`` (DTensor cross-entropy over vocabulary shards, as
        # torchtitan and torchtune run TP) computes the backward of NLL and log-softmax as
        # ``(zeros_like(x) + exp(x)) * grad`` in FP32 beside the saved log-probabilities x.
        return FP32 * v, LOSS_PARALLEL_BACKWARD_FP32_COPIES * FP32 * v
    return FP32 * v, max(e + 2 * FP32, 3 * FP32) * v


def _litgpt_chunked(e: int, v: float, tokens: int, batch: int, held: float, first_step: bool,
                    carried: float, head_dequant: float) -> tuple[float, float]:
    """litgpt's LoRA loss: (saved, peak) in bytes.

    The model returns 128-token logit chunks in the compute dtype; Fabric casts them to FP32 (the
    list the loop holds) while the compute-dtype list and the previous step's FP32 list (with its
    graph) are still referenced: e + 4 + 4 bytes per logit at the end of forward (4 less at a
    run's first step). Each chunk's cross-entropy keeps FP32 log-probabilities (saved: 8 per
    logit). The autograd engine runs nodes by decreasing sequence number, so every chunk's NLL
    and log-softmax backward runs before any chunk's cast, and every cast before any
    ``lm_head`` backward: the log-probabilities turn into FP32 gradients beside the held logits
    (with one chunk's NLL and log-softmax gradients on top), then those into e-byte gradients.
    A quantized ``lm_head`` dequantizes its weight for the last chunk of the forward (all the
    e-byte chunks exist) and for the first chunk of its backward (all e-byte gradients exist).
    """
    chunk = min(LITGPT_LM_HEAD_CHUNK * batch, tokens)
    saved = 2 * held
    previous = 0.0 if first_step else held + carried
    cast = previous + ((e + FABRIC_OUTPUT_BYTES) * v * tokens if e < FABRIC_OUTPUT_BYTES else held)
    backward = saved + 2 * FP32 * v * chunk
    peak = max(cast, backward)
    if head_dequant:
        forward_last_chunk = previous + e * v * tokens + head_dequant
        head_backward = held + e * v * tokens + head_dequant
        peak = max(peak, forward_last_chunk, head_backward)
    return saved, peak
