"""Assisted (`assistant_model=`) and prompt-lookup (`prompt_lookup_num_tokens=`) decoding give plain greedy's tokens.

Both verify several draft tokens in one forward over a filled cache and crop the cache where a draft is
rejected; the models are trained on a repeating pattern so that drafts are accepted too (fewer forwards than
tokens), and a random model is used so that most are rejected.
"""

from __future__ import annotations

import pytest
import torch
from conftest import PERIOD, tiny_causal, tiny_seq2seq, train_on_pattern

GREEDY = dict(do_sample=False, pad_token_id=0, eos_token_id=None, max_new_tokens=24, min_new_tokens=24)
BUILDERS = {"causal": tiny_causal, "seq2seq": tiny_seq2seq}
OPTIONS = dict(position_embedding_type="rope", norm_type="rmsnorm", hidden_act="swiglu", qk_norm=True,
               num_key_value_heads=2)


@pytest.fixture(scope="module")
def trained():
    """Each kind, trained on the pattern: a main model (2 layers) and a smaller assistant (1 layer, same vocab)."""
    return {kind: (train_on_pattern(build(**OPTIONS)), train_on_pattern(build(num_hidden_layers=1, **OPTIONS)))
            for kind, build in BUILDERS.items()}


def inputs(kind: str) -> dict:
    ids = torch.tensor([PERIOD * 2])  # (1, 14): a prompt that repeats itself, as prompt lookup needs
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def generate_counting(model, **kwargs) -> tuple[list, int]:
    """generate()'s tokens, and how many forwards of the decoder stack it took."""
    calls = []
    hook = model.model.decoder.register_forward_hook(lambda *args: calls.append(1))
    try:
        return model.generate(**kwargs).tolist(), len(calls)
    finally:
        hook.remove()


@pytest.mark.parametrize("kind", BUILDERS)
def test_prompt_lookup_gives_greedy_tokens_in_fewer_forwards(trained, kind):
    model, _ = trained[kind]
    plain, plain_calls = generate_counting(model, **inputs(kind), **GREEDY)
    looked_up, calls = generate_counting(model, **inputs(kind), prompt_lookup_num_tokens=4, **GREEDY)
    assert looked_up == plain
    assert plain_calls == GREEDY["max_new_tokens"] and calls <= plain_calls // 2  # drafts accepted several at a time


@pytest.mark.parametrize("kind", BUILDERS)
def test_an_assistant_model_gives_greedy_tokens(trained, kind):
    model, assistant = trained[kind]
    plain, plain_calls = generate_counting(model, **inputs(kind), **GREEDY)
    assisted, calls = generate_counting(model, **inputs(kind), assistant_model=assistant, **GREEDY)
    assert assisted == plain
    assert calls < plain_calls // 2  # the assistant's drafts were accepted several at a time


@pytest.mark.parametrize("kind", BUILDERS)
def test_rejected_drafts_crop_the_cache_and_keep_greedy_tokens(kind):
    """Random models: the drafts mostly disagree, so the cache is cropped again and again."""
    build = BUILDERS[kind]
    model, assistant = build(**OPTIONS), build(num_hidden_layers=1, **OPTIONS)
    torch.manual_seed(1)
    for parameter in assistant.parameters():  # a different network from the main model's
        parameter.data.add_(torch.randn_like(parameter) * 0.5)
    plain = model.generate(**inputs(kind), **GREEDY)
    assert model.generate(**inputs(kind), assistant_model=assistant, **GREEDY).tolist() == plain.tolist()
    assert model.generate(**inputs(kind), prompt_lookup_num_tokens=3, **GREEDY).tolist() == plain.tolist()
