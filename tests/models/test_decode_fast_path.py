"""The decode step through generate(): the prompt is checked once, decode steps are lean and give the same tokens.

Also the compiled path on a CPU: static cache + torch.compile (inductor) gives the dynamic cache's tokens, with
one graph for every decode step.
"""

import inspect

import pytest
import torch
from conftest import DECODE_LAYOUT_MIN_NEW_TOKENS, random_ids, tiny_causal, tiny_seq2seq
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache, StaticCache

from hf_minitx.models import decoding_minitx, modeling_minitx
from hf_minitx.models.decoding_minitx import (
    CACHE_NAME,
    DECODE_STEPS,
    MiniTxGrowingLayer,
    decode_copy,
    project_with,
    set_decode_layout,
)
from hf_minitx.tools.benchmark.generation import compile_config

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


@pytest.mark.parametrize("options", [{}, {"qk_norm": True, "num_key_value_heads": 2,
                                          "position_embedding_type": "rope"}], ids=["default", "qk_norm-gqa-rope"])
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
    assert cache not in DECODE_STEPS and not hasattr(cache, "_minitx_padding")  # no decode-step state kept
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
    """docs/generation.md's recipe for a long session: one StaticCache of fixed size, reset before each generate()."""
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
    attention.o_proj.register_forward_hook(lambda *_: seen.append(decode_copy(attention) is not None))
    ids = random_ids(1, 4)
    model.generate(ids, max_new_tokens=3, min_new_tokens=3, **GREEDY)
    assert seen and all(seen)  # fused during generate()
    assert decode_copy(attention) is None and list(model.state_dict()) == keys  # and gone after, nothing saved
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert not any("forward" in vars(m) for m in linears + [attention])  # no decode forward outlives the call
    assert "query_key_value" not in vars(attention)
    seen.clear()
    model(ids, decoder_input_ids=ids) if model.config.is_encoder_decoder else model(ids)
    assert seen == [False]  # a plain forward (training, evaluation) uses the three projections
    calls = []
    attention.q_proj.register_forward_hook(lambda *_: calls.append(1))  # as PEFT or accelerate would hook it
    model.generate(ids, max_new_tokens=3, min_new_tokens=3, **GREEDY)
    assert len(calls) == 3  # one call per forward of generate(): a hooked projection is never bypassed



@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_a_short_generate_call_reads_the_weights_as_stored(build, monkeypatch):
    """Copying the weights into the decode layout costs about what 10-15 decode steps save: a call asking for
    fewer new tokens than `DECODE_LAYOUT_MIN_NEW_TOKENS` makes no copy, one asking for more does, same tokens."""
    monkeypatch.setattr(decoding_minitx, "DECODE_LAYOUT_MIN_NEW_TOKENS", DECODE_LAYOUT_MIN_NEW_TOKENS)
    model = build()
    seen = []  # whether the head has its decode copy, at every decoder forward (a hooked linear gets none)
    model.model.decoder.register_forward_hook(lambda *_: seen.append(decode_copy(model.lm_head) is not None))
    ids = random_ids(1, 4)
    short, long = DECODE_LAYOUT_MIN_NEW_TOKENS - 1, DECODE_LAYOUT_MIN_NEW_TOKENS
    few = model.generate(ids, max_new_tokens=short, min_new_tokens=short, **GREEDY)
    assert seen == [False] * short
    seen.clear()
    many = model.generate(ids, max_new_tokens=long, min_new_tokens=long, **GREEDY)
    assert seen == [True] * long
    assert torch.equal(many[:, :few.shape[1]], few)
    seen.clear()  # a max_length this short bounds the new tokens below the threshold too
    model.generation_config.max_new_tokens = 100  # as a trained folder's; the caller's max_length bounds the call
    model.generate(ids, max_length=short, **GREEDY)
    assert seen and not any(seen)
    seen.clear()  # and so does a caller's GenerationConfig that asks it
    from transformers import GenerationConfig

    model.generate(ids, generation_config=GenerationConfig(max_length=short, do_sample=False))
    assert seen and not any(seen)

def test_single_row_copies_come_in_one_part_per_thread_except_for_a_static_cache():
    """A dynamic-cache call splits the single-row copies over the CPU threads (one batched product, each thread
    its part); a static-cache call, which generate() may compile, keeps one part. Same tokens either way."""
    model = tiny_causal()
    parts = []
    model.model.decoder.register_forward_hook(
        lambda *_: parts.append(decode_copy(model.lm_head).by_input.shape[0]))
    ids = random_ids(1, 4)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        split = model.generate(ids, max_new_tokens=4, min_new_tokens=4, **GREEDY)
        assert parts == [2] * 4
        parts.clear()
        static = model.generate(ids, max_new_tokens=4, min_new_tokens=4, cache_implementation="static", **GREEDY)
        assert parts == [1] * 4
        parts.clear()
        cache = StaticCache(config=model.config, max_cache_len=16)  # a static cache passed in: the same
        given = model.generate(ids, max_new_tokens=4, min_new_tokens=4, **{CACHE_NAME: cache}, **GREEDY)
        assert parts == [1] * 4 and torch.equal(given, static)
        torch.set_num_threads(1)
        parts.clear()
        single = model.generate(ids, max_new_tokens=4, min_new_tokens=4, **GREEDY)
        assert parts == [1] * 4
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(split, static) and torch.equal(split, single)


@pytest.mark.parametrize("parts", [1, 2])
def test_generation_weights_compute_the_linear_maps_in_the_layout_decoding_reads_fastest(parts):
    """Wide weights (out >= in) get (parts, in, out / parts) copies on a CPU for single rows, narrow ones are read
    as stored; several rows read the stored weight; same outputs either way."""
    model = tiny_causal()
    set_decode_layout(model, True, parts)
    try:
        attention, mlp = model.model.decoder.layers[0].self_attn, model.model.decoder.layers[0].mlp
        states = torch.randn(3, 2, model.config.hidden_size)
        with torch.no_grad():
            for linear in (attention.o_proj, mlp.fc1, mlp.fc2, model.lm_head):
                copy = decode_copy(linear)
                wide = linear.out_features >= linear.in_features
                assert (copy.by_input is not None) == wide
                if wide:
                    assert copy.by_input.shape == (parts, linear.in_features, linear.out_features // parts)
                assert copy.weight.data_ptr() == linear.weight.data_ptr()  # as stored: not copied
                for rows in ((3, 2), (1, 1)):  # weight @ states^T for several rows, the (in, out) copy for one
                    inputs = torch.randn(*rows, linear.in_features)
                    expected = torch.nn.functional.linear(inputs, linear.weight, linear.bias)
                    torch.testing.assert_close(linear(inputs), expected)  # the module's call, through the copy
            fused = decode_copy(attention)
            torch.testing.assert_close(torch.cat(attention.query_key_value(states), -1), torch.cat(
                [nn_linear(p, states) for p in (attention.q_proj, attention.k_proj, attention.v_proj)], -1))
            expected = torch.cat([attention.q_proj(states), attention.k_proj(states), attention.v_proj(states)], -1)
            torch.testing.assert_close(project_with(fused, states), expected)
            torch.testing.assert_close(project_with(fused, states[:1, :1]), expected[:1, :1])
        calls = []
        mlp.fc1.register_forward_hook(lambda *_: calls.append(1))
        mlp.fc1(states)  # with grad (training): the module's own forward, hooks and all
        assert calls == [1]
    finally:
        set_decode_layout(model, False)


def nn_linear(linear: torch.nn.Linear, states: torch.Tensor) -> torch.Tensor:
    """The linear map as stored, whatever forward the module has now."""
    return torch.nn.functional.linear(states, linear.weight, linear.bias)


def random_heads(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 2, length, 4, generator=gen), torch.randn(batch, 2, length, 4, generator=gen)


def test_growing_cache_layer_holds_what_concatenation_holds_through_beam_crop_and_batch_operations():
    grown, plain = MiniTxGrowingLayer(), DynamicLayer()
    steps = [lambda layer: None] * 3 + [
        lambda layer: layer.reorder_cache(torch.tensor([2, 0, 0])),  # beam search: new views, then new buffers
        lambda layer: layer.crop(-2),  # a shorter view of the same buffers: later writes land after it
        lambda layer: layer.batch_select_indices(torch.tensor([0, 2])),
        lambda layer: layer.batch_repeat_interleave(2),
    ]
    for seed, change in enumerate(steps):
        batch = plain.keys.shape[0] if plain.is_initialized and plain.keys.numel() else 3
        key, value = random_heads(batch, 5 if seed == 0 else 1, seed)
        got, want = grown.update(key, value), plain.update(key, value)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        change(grown), change(plain)
        assert grown.get_seq_length() == plain.get_seq_length()
        assert torch.equal(grown.keys, plain.keys) and torch.equal(grown.values, plain.values)


@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_generate_decodes_into_growing_cache_layers_with_the_tokens_of_concatenation(build):
    """generate()'s dynamic cache, its own or one passed in empty, writes in place; tokens as with concatenation."""
    model = build()
    ids, mask = left_padded()
    kwargs = dict(attention_mask=mask, max_new_tokens=7, min_new_tokens=7, return_dict_in_generate=True, **GREEDY)
    out = model.generate(ids, **kwargs)
    cache = getattr(out, CACHE_NAME)
    self_cache = getattr(cache, "self_attention_cache", cache)
    assert all(type(layer) is MiniTxGrowingLayer for layer in self_cache.layers)
    mine = DynamicCache(config=model.config)
    if model.config.is_encoder_decoder:
        mine = EncoderDecoderCache(mine, DynamicCache(config=model.config))
    theirs = model.generate(ids, **kwargs, **{CACHE_NAME: mine})
    assert torch.equal(theirs.sequences, out.sequences)
    assert all(type(layer) is MiniTxGrowingLayer for layer in getattr(mine, "self_attention_cache", mine).layers)
    concatenated = model.generate(ids, use_cache=False, **kwargs)  # every step a full forward
    assert torch.equal(concatenated.sequences, out.sequences)
    beams = dict(attention_mask=mask, max_new_tokens=5, num_beams=3, **GREEDY)
    assert torch.equal(model.generate(ids, **beams), model.generate(ids, use_cache=False, **beams))


def test_decode_step_state_lives_in_the_decoding_file_not_on_the_cache():
    """While generate() runs, the prompt's padding flags are held by `DECODE_STEPS`; the cache carries no
    attribute of ours, and the entry is gone after the call."""
    model = tiny_causal()
    seen = []

    def look(module, args, kwargs, output):
        cache = kwargs["cache"]
        seen.append((DECODE_STEPS.get(cache), sorted(name for name in vars(cache) if "minitx" in name)))

    model.model.decoder.register_forward_hook(look, with_kwargs=True)
    ids, mask = left_padded()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3,
                         return_dict_in_generate=True, **GREEDY)
    assert seen == [((True, False), [])] * 3  # left padding found in the prompt, no encoder mask
    assert getattr(out, CACHE_NAME) not in DECODE_STEPS


@pytest.mark.parametrize("build", BUILDERS, ids=KIND_IDS)
def test_the_remembered_padding_is_put_on_the_decoder_for_the_length_of_generate_only(build):
    """The stack's forward knows nothing of decode steps: generate() puts the decoder's own `input_padding` on
    (`decoding_minitx.set_remembered_padding`) and takes it off when the call ends, as the decode layout."""
    model = build()
    decoder = model.model.decoder
    seen = []
    decoder.register_forward_pre_hook(lambda module, args: seen.append("input_padding" in vars(module)))
    ids, mask = left_padded()
    model.generate(ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, **GREEDY)
    assert seen == [True] * 3 and "input_padding" not in vars(decoder)
    set_decode_layout(model, True)
    assert "input_padding" in vars(decoder) and "input_padding" not in vars(model.get_encoder())
    set_decode_layout(model, False)
    assert "input_padding" not in vars(decoder)
    modeling_source = inspect.getsource(modeling_minitx)
    assert not any(name in modeling_source for name in ("decode_step_padding", "DECODE_STEPS", "remembering_padding("))
