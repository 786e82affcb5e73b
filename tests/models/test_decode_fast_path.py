"""The decode step through generate(): the prompt is checked once, decode steps are lean and give the same tokens.

Also the compiled path on a CPU: static cache + torch.compile (inductor) gives the dynamic cache's tokens, with
one graph for every decode step.
"""

import pytest
import torch
from conftest import random_ids, tiny_causal, tiny_seq2seq
from transformers import GenerationMixin

from hf_minitx.models import modeling_minitx
from hf_minitx.models.modeling_minitx import CACHE_NAME
from hf_minitx.tools.generation_bench import compile_config

GREEDY = dict(do_sample=False, pad_token_id=0, eos_token_id=2)
BUILDERS = [tiny_causal, tiny_seq2seq]
KIND_IDS = ["causal", "seq2seq"]


def left_padded(batch: int = 2, length: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    ids = random_ids(batch, length, seed=5)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_generate_checks_the_inputs_once_not_on_every_token(build, monkeypatch):
    model = build()
    ids, mask = left_padded()
    calls = []
    original = modeling_minitx.check_inputs

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(modeling_minitx, "check_inputs", counting)
    counts = []
    for new in (3, 12):
        calls.clear()
        model.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **GREEDY)
        counts.append(len(calls))
    assert counts[0] == counts[1] and 1 <= counts[0] <= 3  # the prompt (and source) only, whatever the length


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "num_key_value_heads": 2, "position_embedding_type": "rope"}],
                         ids=["default", "qk_norm-gqa-rope"])
@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_padded_decode_steps_give_the_tokens_of_full_forwards(build, options):
    """Greedy decoding by hand without a cache (every step a checked full forward, three q/k/v projections)
    == generate()'s decode steps (remembered padding, one fused q/k/v product)."""
    model = build(**options)
    ids, mask = left_padded()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, **GREEDY)
    seq2seq = model.config.is_encoder_decoder
    tokens = torch.full((2, 1), model.config.decoder_start_token_id) if seq2seq else ids
    step_mask = mask
    with torch.no_grad():
        for _ in range(6):
            if seq2seq:
                logits = model(ids, attention_mask=mask, decoder_input_ids=tokens, use_cache=False).logits
            else:
                logits = model(tokens, attention_mask=step_mask, use_cache=False).logits
            logits[..., GREEDY["eos_token_id"]] = float("-inf")  # min_new_tokens keeps EOS out
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            step_mask = torch.cat([step_mask, torch.ones(2, 1, dtype=step_mask.dtype)], dim=1)
    assert torch.equal(out, tokens)


def test_a_cache_handed_back_by_generate_is_checked_again():
    """After generate(), a call on its cache with a padded new token is read as such, as an uncached forward does."""
    model = tiny_causal()
    ids = random_ids(1, 5)
    out = model.generate(ids, max_new_tokens=3, min_new_tokens=3, return_dict_in_generate=True, **GREEDY)
    cache = getattr(out, CACHE_NAME)
    assert not hasattr(cache, "_minitx_padding") and not hasattr(cache, "_minitx_generating")
    full = out.sequences[:, :-1]  # every token the cache holds, then one new one
    new = out.sequences[:, -1:]
    mask = torch.ones(1, full.size(1) + 1, dtype=torch.long)
    mask[0, -1] = 0  # padding the generated steps never had: it moves the new token's position
    with torch.no_grad():
        step = model(new, attention_mask=mask, cache=cache).logits[:, -1]
        whole = model(torch.cat([full, new], 1), attention_mask=mask, use_cache=False).logits[:, -1]
    torch.testing.assert_close(step, whole)


@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_lean_decode_inputs_equal_transformers_generic_preparation(build):
    model = build()
    ids, mask = left_padded()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=2, min_new_tokens=2,
                         return_dict_in_generate=True, **GREEDY)
    kwargs = {"use_cache": True, CACHE_NAME: getattr(out, CACHE_NAME)}
    if model.config.is_encoder_decoder:
        kwargs |= {"attention_mask": mask, "encoder_outputs": model.get_encoder()(ids, attention_mask=mask)}
        sequence = out.sequences
    else:
        sequence = out.sequences
        kwargs["attention_mask"] = torch.cat([mask, torch.ones(2, 2, dtype=mask.dtype)], 1)
    ours = model.prepare_inputs_for_generation(sequence, next_sequence_length=1, **kwargs)
    generic = GenerationMixin.prepare_inputs_for_generation(model, sequence, next_sequence_length=1, **kwargs)
    assert ours.keys() == generic.keys()
    for key, value in generic.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] is value, key


@pytest.mark.slow
@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_inductor_compiled_static_cache_gives_dynamic_tokens_with_one_decode_graph(build):
    """The CPU fast path: cache_implementation="static" + compile_config, compiled by inductor."""
    from torch._dynamo.utils import counters

    model = build(num_hidden_layers=1, num_encoder_layers=1, num_decoder_layers=1) if build is tiny_seq2seq else (
        build(num_hidden_layers=1))
    ids, mask = left_padded()
    kwargs = dict(attention_mask=mask, max_new_tokens=8, min_new_tokens=8, **GREEDY)
    dynamic = model.generate(ids, **kwargs)
    torch._dynamo.reset()
    counters.clear()
    fast = dict(cache_implementation="static", compile_config=compile_config("inductor"))
    compiled = model.generate(ids, **kwargs, **fast)
    graphs = counters["stats"]["unique_graphs"]
    again = model.generate(ids, **kwargs, **fast)
    assert torch.equal(compiled, dynamic) and torch.equal(again, dynamic)
    assert graphs == 1  # one graph serves every decode step: no graph break, no recompilation per step
    assert counters["stats"]["unique_graphs"] == graphs  # the second call compiles nothing


def test_one_static_cache_serves_prompts_of_any_length_with_one_compiled_graph():
    """The README's recipe for a long session: one StaticCache of fixed size, reset before each generate()."""
    from torch._dynamo.utils import counters
    from transformers import StaticCache

    model = tiny_causal()
    cache = StaticCache(config=model.config, max_cache_len=40)
    config = compile_config("eager")
    torch._dynamo.reset()
    counters.clear()
    for length, new in ((5, 8), (9, 12), (3, 20)):
        ids = random_ids(1, length, seed=length)
        cache.reset()
        fast = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **{CACHE_NAME: cache},
                              compile_config=config, **GREEDY)
        assert torch.equal(fast, model.generate(ids, max_new_tokens=new, min_new_tokens=new, **GREEDY))
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_qkv_fusion_lasts_one_generate_call_and_leaves_weights_and_hooks_alone(build):
    model = build()
    attention = model.model.decoder.layers[0].self_attn
    keys = list(model.state_dict())
    seen = []
    attention.o_proj.register_forward_hook(lambda *_: seen.append("fused_qkv" in vars(attention)))
    ids = random_ids(1, 4)
    model.generate(ids, max_new_tokens=3, min_new_tokens=3, **GREEDY)
    assert seen and all(seen)  # fused during generate()
    assert "fused_qkv" not in vars(attention) and list(model.state_dict()) == keys  # and gone after, nothing saved
    seen.clear()
    model(ids, decoder_input_ids=ids) if model.config.is_encoder_decoder else model(ids)
    assert seen == [False]  # a plain forward (training, evaluation) uses the three projections
    calls = []
    attention.q_proj.register_forward_hook(lambda *_: calls.append(1))  # as PEFT or accelerate would hook it
    model.generate(ids, max_new_tokens=3, min_new_tokens=3, **GREEDY)
    assert len(calls) == 3  # one call per forward of generate(): a hooked projection is never bypassed
