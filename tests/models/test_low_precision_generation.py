"""bf16 weights and torchao int8 weight-only quantization generate() on a CPU, with fp32's greedy tokens.

The model is trained in the test to continue a repeating pattern, so that greedy tokens have clear margins and
rounding cannot flip them: equal tokens then say the low-precision paths compute the same network. The decode
layout (`generation_weight`) copies bf16 weights in bf16 and steps aside for quantized ones.
"""

from __future__ import annotations

import pytest
import torch
from conftest import PERIOD, tiny_causal, train_on_pattern
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from hf_minitx.models.decoding_minitx import decode_layout_applies

GREEDY = dict(do_sample=False, pad_token_id=0, eos_token_id=None, max_new_tokens=20, min_new_tokens=20)


@pytest.fixture(scope="module")
def pattern_model(tmp_path_factory):
    """A tiny causal LM trained to continue PERIOD, saved to a folder."""
    model = train_on_pattern(tiny_causal(position_embedding_type="rope", norm_type="rmsnorm", hidden_act="swiglu"))
    folder = tmp_path_factory.mktemp("pattern")
    model.save_pretrained(folder)
    return folder


def prompt() -> torch.Tensor:
    return torch.tensor([PERIOD[2:] + PERIOD[:3]])  # (1, 7)


class CopiesSeen(LogitsProcessor):
    """Records, at every decode step, the dtype of each decode-layout copy the model holds (none: an empty set)."""

    def __init__(self, model):
        self.model, self.seen, self.holders = model, set(), set()

    def __call__(self, input_ids, scores):
        for module in self.model.modules():
            for name in ("generation_weight", "fused_qkv"):
                copy = module.__dict__.get(name)
                if copy is not None:
                    self.seen.add(copy.weight.dtype)
                    self.holders.add(module)
        return scores


def generate_watching(model, holders: set | None = None) -> tuple[list[int], set]:
    """Greedy tokens, and the dtypes of the decode-layout copies seen (the modules holding them go to `holders`)."""
    watcher = CopiesSeen(model)
    out = model.generate(prompt(), logits_processor=LogitsProcessorList([watcher]), **GREEDY)
    if holders is not None:
        holders.update(watcher.holders)
    return out[0].tolist(), watcher.seen


def test_the_trained_pattern_gives_fp32_tokens_with_the_decode_layout(pattern_model):
    model = AutoModelForCausalLM.from_pretrained(pattern_model).eval()
    tokens, seen = generate_watching(model)
    following = {token: PERIOD[(i + 1) % len(PERIOD)] for i, token in enumerate(PERIOD)}
    start = prompt().shape[1] - 1
    assert all(tokens[i + 1] == following[tokens[i]] for i in range(start, len(tokens) - 1))  # the pattern goes on
    assert seen == {torch.float32}  # the watcher sees the copies fp32 decoding makes


def test_bf16_weights_generate_fp32_tokens_with_bf16_copies(pattern_model):
    reference, _ = generate_watching(AutoModelForCausalLM.from_pretrained(pattern_model).eval())
    model = AutoModelForCausalLM.from_pretrained(pattern_model, dtype=torch.bfloat16).eval()
    tokens, seen = generate_watching(model)
    assert tokens == reference
    assert seen == {torch.bfloat16}  # copies in the weights' own dtype, never expanded to fp32


def test_int8_weight_only_generates_fp32_tokens_without_expanding_the_weights(pattern_model):
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    reference, _ = generate_watching(AutoModelForCausalLM.from_pretrained(pattern_model).eval())
    model = AutoModelForCausalLM.from_pretrained(
        pattern_model, quantization_config=TorchAoConfig(Int8WeightOnlyConfig())).eval()
    quantized = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and not decode_layout_applies(m)]
    assert len(quantized) >= 4 * model.config.num_hidden_layers  # q, k, v, o, mlp: quantized, so stepped aside
    holders = set()
    tokens, _ = generate_watching(model, holders)
    assert tokens == reference
    assert not holders & set(quantized)  # no quantized weight came back as an fp32 copy (unquantized ones may)
    assert all(type(m.weight.data) is not torch.Tensor for m in quantized)  # still quantized after generate()
