"""Which logit copies are alive at the peak of Hugging Face's causal-LM loss, measured on the CPU
with real transformers modules (Llama, OPT, GPT-2 heads), against
:func:`planner.memory.logits.loss_bytes`.

``ForCausalLMLoss`` upcasts the compute-dtype logits to FP32 and runs ``cross_entropy``
(log-softmax, then NLL). The upcast is not saved (log-softmax keeps its output), and the training
loop drops the model's output before ``backward``, so the compute-dtype logits are gone too. At
the log-softmax backward three FP32 vocabulary-wide tensors exist at once: the saved
log-probabilities, NLL's gradient (``zeros_like`` then a scatter) and log-softmax's gradient:
12 bytes per logit. The forward of the loss holds e + 4 + 4 (logits, upcast, log-probabilities),
less. The slope of the step's peak in the vocabulary size isolates exactly these terms.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from truth.harness import peak_bytes as _peak_bytes

from planner.core.entries import ModelSpec
from planner.memory.logits import loss_bytes


def _model(kind: str, vocab: int):
    t = transformers
    if kind == "llama":
        return t.LlamaForCausalLM(t.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=4, vocab_size=vocab, tie_word_embeddings=False, use_cache=False,
            attn_implementation="sdpa"))
    if kind == "opt":
        return t.OPTForCausalLM(t.OPTConfig(
            hidden_size=64, ffn_dim=256, num_hidden_layers=1, num_attention_heads=4, vocab_size=vocab,
            word_embed_proj_dim=64, max_position_embeddings=512, dropout=0.0, pad_token_id=0,
            bos_token_id=0, eos_token_id=0, attn_implementation="sdpa"))
    return t.GPT2LMHeadModel(t.GPT2Config(
        n_embd=64, n_layer=1, n_head=4, vocab_size=vocab, n_positions=512, attn_pdrop=0.0,
        embd_pdrop=0.0, resid_pdrop=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="sdpa"))


def _step_peak(kind: str, vocab: int, b: int, s: int) -> int:
    torch.manual_seed(0)
    model = _model(kind, vocab).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (b, s))

    def step():
        loss = model(input_ids=ids, labels=ids).loss  # the Trainer keeps only the loss
        loss.backward()
        for p in model.parameters():
            p.grad = None

    step()  # warm-up outside the measurement
    return _peak_bytes(step)


@pytest.mark.parametrize("kind", ["llama", "opt", "gpt2"])
def test_hf_causal_lm_loss_peaks_at_12_bytes_per_logit(kind):
    b, s, v1, v2 = 4, 256, 8000, 16000
    slope = (_step_peak(kind, v2, b, s) - _step_peak(kind, v1, b, s)) / (b * s * (v2 - v1))
    spec = ModelSpec(id="t", layers=1, hidden=64, heads=4, ffn=128, vocab=v1)
    _, peak, held = loss_bytes(spec, 2, b * s, "standard")
    assert held == 0
    assert peak / (b * s * v1) == 12  # the formula: three FP32 copies, no compute-dtype one
    assert slope == pytest.approx(12, abs=0.05)


def test_a_125m_model_at_40_x_2048_tokens_allocates_under_80_gb():
    """GPT-style 125M (vocabulary 50,272), micro-batch 40 × 2048 tokens, mixed precision, no
    checkpointing: 49 GB of loss tensors (12 B/logit) and 24 GB of activations, 76 GB allocated:
    under an 80 GB card's 85.9e9 bytes. (The device view adds 15 % fragmentation on what churns,
    logits included, which the torchtitan rows' reserved memory bears out.)"""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve

    raw = {"profile": "detailed",
           "model": {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 50272,
                     "norm": "layernorm", "gated_mlp": False, "tied_embeddings": True},
           "workload": {"method": "full", "precision": "mixed", "seq_len": 2048, "micro_batch": 40},
           "layout": {"gpu": "a100-80gb", "gpus": 1, "checkpointing": "none"}}
    est = estimate_resolved(resolve(raw))
    tokens = 40 * 2048
    assert est.components["logits"] == pytest.approx(12 * tokens * 50272, rel=1e-6)
    assert est.predicted["allocated_bytes"] < est.capacity_bytes


def _compute_dtype_loss_peak(vocab: int, b: int, s: int) -> int:
    """A loop with neither autocast nor an upcast: PyTorch's cross-entropy on 16-bit logits, the
    labels shifted by slicing the logits (``logits[:, :-1].reshape(-1, V)``, which copies them
    when the batch holds more than one sequence), the output dropped before backward."""
    torch.manual_seed(0)
    model = _model("llama", vocab).to(torch.bfloat16)
    ids = torch.randint(0, vocab, (b, s))
    criterion = torch.nn.CrossEntropyLoss()

    def step():
        logits = model(input_ids=ids).logits
        loss = criterion(logits[:, :-1, :].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        del logits
        loss.backward()
        for p in model.parameters():
            p.grad = None

    step()
    return _peak_bytes(step)


def test_a_cross_entropy_left_in_the_compute_dtype_peaks_at_three_copies():
    """``loss: compute_dtype``: log-softmax in 16 bits over the whole batch keeps its output
    (e per logit); its backward holds NLL's gradient, its own and the saved output: 3e = 6 bytes
    per logit, not the 12 of the FP32 cross-entropy nor TRL's row-wise 4."""
    b, s, v1, v2 = 2, 256, 8000, 16000
    slope = (_compute_dtype_loss_peak(v2, b, s) - _compute_dtype_loss_peak(v1, b, s)) / (b * s * (v2 - v1))
    spec = ModelSpec(id="t", layers=1, hidden=64, heads=4, ffn=128, vocab=v1)
    saved, peak, held = loss_bytes(spec, 2, b * s, "compute_dtype")
    assert (saved / (b * s * v1), peak / (b * s * v1), held) == (2, 6, 0)
    assert slope == pytest.approx(6, abs=0.1)
