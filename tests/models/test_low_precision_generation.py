"""bf16 weights and torchao int8 weight-only quantization generate() on a CPU, with fp32's greedy tokens.

The model is trained in the test to continue a repeating pattern, so that greedy tokens have clear margins and
rounding cannot flip them: equal tokens then say the low-precision paths compute the same network. The decode
layout (`generation_weight`) copies bf16 weights in bf16, and reads int8 weight-only weights as int8 through
`torch._weight_int8pack_mm` (never expanded to fp32).
"""

from __future__ import annotations

import pytest
import torch
from conftest import DECODE_LAYOUT_MIN_NEW_TOKENS, PERIOD, tiny_causal, train_on_pattern
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from hf_minitx.models import decoding_minitx
from hf_minitx.models.decoding_minitx import decode_copy, decode_layout_applies, fuse_attention

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
            copy = decode_copy(module)
            if copy is not None:
                self.seen.add(copy.weight.dtype)
                self.holders.add(module)
        return scores


def generate_watching(model, holders: set | None = None, **options) -> tuple[list[int], set]:
    """Greedy tokens, and the dtypes of the decode-layout copies seen (the modules holding them go to `holders`);
    `options` replace the generation options (GREEDY)."""
    watcher = CopiesSeen(model)
    out = model.generate(prompt(), logits_processor=LogitsProcessorList([watcher]), **(options or GREEDY))
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


def int8_model(folder):
    """The folder's model loaded with int8 weight-only quantization, as users load it (torchao's config)."""
    pytest.importorskip("torchao")
    from torchao.quantization import Int8WeightOnlyConfig
    from transformers import TorchAoConfig

    config = TorchAoConfig(Int8WeightOnlyConfig())
    return AutoModelForCausalLM.from_pretrained(folder, quantization_config=config).eval()


def test_int8_weight_only_generates_fp32_tokens_reading_int8_weights(pattern_model):
    reference, _ = generate_watching(AutoModelForCausalLM.from_pretrained(pattern_model).eval())
    model = int8_model(pattern_model)
    quantized = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and not decode_layout_applies(m)]
    assert len(quantized) >= 4 * model.config.num_hidden_layers  # q, k, v, o, mlp: quantized
    holders = set()
    tokens, seen = generate_watching(model, holders)
    assert tokens == reference
    attentions = {m for m in model.modules() if hasattr(m, "q_proj")}
    assert {m for m in quantized if m.out_features != model.config.vocab_size} <= holders | {
        p for a in attentions & holders for p in (a.q_proj, a.k_proj, a.v_proj)}  # every quantized one has a copy
    assert torch.int8 in seen  # and the copies are int8, not fp32 expansions of them
    assert all(type(m.weight.data) is not torch.Tensor for m in quantized)  # still quantized after generate()


def test_int8_copies_compute_what_torchao_computes(pattern_model):
    """Each int8 copy (fused q/k/v included) gives torchao's own product within bf16 rounding of the rows."""
    model = int8_model(pattern_model)
    attention = model.model.decoder.layers[0].self_attn
    states = torch.randn(3, 5, model.config.hidden_size)  # (batch, seq, hidden): several rows, and one below
    with torch.no_grad():
        expected = [linear(states) for linear in (attention.q_proj, attention.k_proj, attention.v_proj)]
        fuse_attention(attention, True)
        try:
            assert decode_copy(attention).weight.dtype == torch.int8
            for rows in (states, states[:1, :1]):
                got = attention.query_key_value(rows)
                for g, e in zip(got, expected, strict=True):
                    torch.testing.assert_close(g, e[:rows.shape[0], :rows.shape[1]], rtol=2e-2, atol=2e-2)
        finally:
            fuse_attention(attention, False)
    assert decode_copy(attention) is None and "query_key_value" not in vars(attention)


def test_int8_weights_of_an_odd_input_width_keep_torchao_call(tmp_path):
    """The int8 kernel reads inputs 16 at a time (its AVX-512 form crashed on 88): a quantized fc2 whose input
    width (intermediate_size 40) is not a multiple of 16 gets no int8 copy, and generate() still gives, step by
    step, the logits of torchao's own call (a plain forward over the tokens it chose)."""
    tiny_causal(hidden_act="swiglu", intermediate_size=40).save_pretrained(tmp_path)
    model = int8_model(tmp_path)
    mlp = model.model.decoder.layers[0].mlp
    assert decoding_minitx.int8_rows(mlp.fc2) is None and decoding_minitx.int8_rows(mlp.fc1) is not None
    watcher = CopiesSeen(model)
    out = model.generate(prompt(), logits_processor=LogitsProcessorList([watcher]), output_scores=True,
                         return_dict_in_generate=True, **GREEDY)
    assert mlp.fc1 in watcher.holders or mlp in watcher.holders
    assert mlp.fc2 not in watcher.holders  # torchao's own call
    with torch.no_grad():
        logits = model(out.sequences).logits[0, prompt().shape[1] - 1:-1]  # (new tokens, vocab)
    torch.testing.assert_close(torch.stack(out.scores)[:, 0], logits, rtol=2e-2, atol=2e-2)


@pytest.mark.slow
def test_compiled_int8_decoding_gives_the_same_tokens(pattern_model):
    """The fastest CPU path (int8 weights read as int8, decode steps compiled over a static cache) keeps the tokens."""
    from hf_minitx.tools.benchmark.generation import compile_config

    reference, _ = generate_watching(AutoModelForCausalLM.from_pretrained(pattern_model).eval())
    model = int8_model(pattern_model)
    tokens = model.generate(prompt(), cache_implementation="static", compile_config=compile_config(), **GREEDY)
    assert tokens[0].tolist() == reference


def test_a_short_call_reads_int8_weights_as_int8_too(pattern_model, monkeypatch):
    """Below the decode layout's length the dense weights are read as stored, but int8 ones still go through
    their int8 copy: one kernel at every length, so the first tokens do not depend on max_new_tokens."""
    monkeypatch.setattr(decoding_minitx, "DECODE_LAYOUT_MIN_NEW_TOKENS", DECODE_LAYOUT_MIN_NEW_TOKENS)
    short = dict(GREEDY, max_new_tokens=DECODE_LAYOUT_MIN_NEW_TOKENS - 1,
                 min_new_tokens=DECODE_LAYOUT_MIN_NEW_TOKENS - 1)
    _, seen = generate_watching(AutoModelForCausalLM.from_pretrained(pattern_model).eval(), **short)
    assert seen == set()  # fp32: no copies for a short call
    model = int8_model(pattern_model)
    tokens, seen = generate_watching(model, **short)
    assert torch.int8 in seen and torch.float32 not in seen
    assert tokens == generate_watching(model)[0][:len(tokens)]


def test_the_finite_weights_check_reads_int8_weights(pattern_model):
    """A model loaded in int8 passes the check every command makes (no raw error from the quantized tensor);
    a non-finite scale is still found and named."""
    from hf_minitx.inference import check_finite_weights

    model = int8_model(pattern_model)
    check_finite_weights(model, pattern_model)
    weight = model.model.decoder.layers[0].mlp.fc1.weight
    weight.scale[0] = float("nan")
    with pytest.raises(ValueError,
                       match=r"non-finite value\(s\) \(NaN or inf\) in model\.decoder\.layers\.0\.mlp\.fc1"):
        check_finite_weights(model, pattern_model)
