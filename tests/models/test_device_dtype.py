"""Any dtype, any device: what can be checked on a CPU-only machine.

- `from_pretrained(..., dtype=bf16/fp16)` gives a model whose forward and generate run in that dtype and
  agree with the float32 model within the dtype's precision (eager and sdpa attention).
- `torch.autocast("cpu", dtype=torch.bfloat16)` over a float32 model works for forward and generate.
- Masks and position tables follow the input's device: the forward pass is run with the default device
  switched to "meta", so any tensor created without `device=` would land on the wrong device and fail.
"""

from __future__ import annotations

import pytest
import torch

from hf_minitx import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration

# position type x model kind: every position type is covered, and each kind twice.
CASES = [("learned", False), ("sinusoidal", True), ("rope", False), ("rope", True), ("sinusoidal", False)]
# Max |logit difference| allowed against float32 (logits here are O(1); bf16 keeps ~3 significant digits).
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 5e-3}


def _model(position: str, seq2seq: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    config = MiniTxConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, position_embedding_type=position,
                          is_encoder_decoder=seq2seq)
    return (MiniTxForConditionalGeneration if seq2seq else MiniTxForCausalLM)(config).eval()


def _inputs(seq2seq: bool) -> dict[str, torch.Tensor]:
    """A left-padded batch: (2, 10) ids with 3 pad positions in the first row."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 64, (2, 10), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    ids[0, :3] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if seq2seq:
        batch["decoder_input_ids"] = torch.cat([torch.ones(2, 1, dtype=torch.long), ids[:, 3:7]], dim=1)  # (2, 5)
    return batch


def _real_logits(model: torch.nn.Module, batch: dict, seq2seq: bool) -> torch.Tensor:
    """Logits at non-padded positions only (padded query rows carry no meaning)."""
    logits = model(**batch, use_cache=False).logits
    return logits if seq2seq else logits[batch["attention_mask"].bool()]


@pytest.mark.parametrize(("position", "seq2seq"), CASES)
def test_half_precision_from_pretrained_runs_and_matches_float32(tmp_path, position, seq2seq):
    reference_model = _model(position, seq2seq)
    reference_model.save_pretrained(tmp_path)
    batch = _inputs(seq2seq)
    reference = _real_logits(reference_model, batch, seq2seq)
    cls = type(reference_model)
    for dtype, impl in ((torch.bfloat16, "sdpa"), (torch.float16, "eager")):
        model = cls.from_pretrained(tmp_path, dtype=dtype, attn_implementation=impl).eval()
        assert {p.dtype for p in model.parameters()} == {dtype}
        logits = _real_logits(model, batch, seq2seq)
        assert logits.dtype == dtype
        assert torch.isfinite(logits).all()
        assert (logits.float() - reference).abs().max().item() < TOLERANCE[dtype], (dtype, impl)
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             max_new_tokens=3, min_new_tokens=3, do_sample=False)
        prompt_len = 0 if seq2seq else batch["input_ids"].shape[1]
        assert out.shape[1] == prompt_len + 3 + (1 if seq2seq else 0)  # seq2seq output starts with decoder_start


@pytest.mark.parametrize(("position", "seq2seq"), CASES[:3])
def test_bf16_autocast_on_cpu_runs_and_stays_close(position, seq2seq):
    model = _model(position, seq2seq)
    batch = _inputs(seq2seq)
    reference = _real_logits(model, batch, seq2seq)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = _real_logits(model, batch, seq2seq)
        out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             max_new_tokens=3, min_new_tokens=3, do_sample=False)
    assert logits.dtype == torch.bfloat16  # the projections really ran in bf16
    assert (logits.float() - reference).abs().max().item() < TOLERANCE[torch.bfloat16]
    assert out.shape[0] == 2 and torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("seq2seq", [False, True])
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_attention_runs_in_float32_under_cpu_autocast_and_its_gradients_stay_close(seq2seq, impl, monkeypatch):
    """Under a CPU bf16 autocast the linear maps run in bf16 but attention itself in float32 (its bf16 backward
    is several times slower on a CPU): every attention call of every layer sees float32 queries, keys and
    values, while outside autocast bf16 inputs reach it unchanged."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hf_minitx.models import attention_minitx, layers_minitx

    seen: list[torch.dtype] = []
    real = ALL_ATTENTION_FUNCTIONS.get_interface(impl, attention_minitx.eager_attention_forward)

    def spy(module, query, key, value, *args, **kwargs):
        seen.extend((query.dtype, key.dtype, value.dtype))
        return real(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(layers_minitx.ALL_ATTENTION_FUNCTIONS, "get_interface", lambda *_: spy)
    model = _model("rope", seq2seq).train()
    model.set_attn_implementation(impl)
    batch = _inputs(seq2seq)
    labels = batch["decoder_input_ids"] if seq2seq else batch["input_ids"]
    model(**batch, labels=labels).loss.backward()
    reference = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(**batch, labels=labels).loss
    loss.backward()
    calls = 3 * (6 if seq2seq else 2)  # (q, k, v) per call: 2 self-attentions, seq2seq 2 + 2 and 2 cross
    assert seen == [torch.float32] * calls
    grads = torch.cat([p.grad.flatten() for name, p in model.named_parameters() if name in reference])
    expected = torch.cat([g.flatten() for g in reference.values()])
    assert (grads - expected).norm() < 0.05 * expected.norm()  # what float32 learns, within bf16 rounding
    seen.clear()
    model.to(torch.bfloat16)(**batch)  # a bf16 model without autocast keeps attending in bf16
    assert set(seen) == {torch.bfloat16}


@pytest.mark.parametrize(("position", "seq2seq"), CASES)
@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_masks_and_position_tables_follow_the_input_device(position, seq2seq, impl):
    model = _model(position, seq2seq)
    model.set_attn_implementation(impl)
    batch = _inputs(seq2seq)
    reference = model(**batch, use_cache=False).logits
    with torch.device("meta"):
        assert torch.arange(3).device.type == "meta"  # the trap is armed: device-less tensors go astray
        logits = model(**batch, use_cache=False).logits
    assert logits.device.type == "cpu"
    assert torch.equal(logits, reference)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_position_tables_and_rotary_angles_follow_the_model_dtype(dtype):
    model = _model("sinusoidal", False).to(dtype)
    table = model.model.decoder.embed_positions.weight
    assert table.dtype == dtype
    rope = _model("rope", False).to(dtype)
    cos, sin = rope.model.decoder.rotary_emb(torch.arange(5)[None], dtype)
    assert cos.dtype == sin.dtype == dtype and cos.shape[-2:] == (5, rope.config.head_dim)
    assert torch.allclose(cos[0, 0, 0].float(), torch.ones(rope.config.head_dim))  # position 0: no rotation


def test_device_check_compares_dtypes_against_cpu_float32(tmp_path):
    from hf_minitx.data.tokenizer import train_bpe_tokenizer
    from hf_minitx.tools.device_check import DeviceCheck, compare_devices, format_report

    tokenizer = train_bpe_tokenizer(["In the beginning was the word", "one hundred and twenty three"] * 4, 280)
    torch.manual_seed(0)
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, position_embedding_type="rope")
    MiniTxForCausalLM(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    fp32, bf16 = compare_devices(tmp_path, "cpu", (torch.float32, torch.bfloat16), max_new_tokens=5)
    assert fp32.max_abs_diff == 0.0 and fp32.cache_matches_no_cache and fp32.passed
    assert 0.0 < bf16.relative_diff < bf16.tolerance and bf16.passed  # really ran in bf16, and close
    assert fp32.new_tokens == bf16.new_tokens == 5
    assert "bfloat16" in format_report([fp32, bf16]) and "FAIL" not in format_report([fp32, bf16])
    too_far = DeviceCheck(**{**fp32.__dict__, "relative_diff": 2 * fp32.tolerance})
    cache_broken = DeviceCheck(**{**fp32.__dict__, "cache_matches_no_cache": False})
    assert not too_far.passed and not cache_broken.passed
    assert DeviceCheck(**{**bf16.__dict__, "cache_matches_no_cache": False}).passed  # near-ties allowed in bf16
