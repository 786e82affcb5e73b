"""The model files read like the paper: few frames of our own down to attention, linear maps called as modules,
`nn.Module.apply` free for its usual use, and the decoding machinery standing above the layers."""

import sys
from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_causal, tiny_seq2seq

from hf_minitx.models import decoding_minitx, layers_minitx, modeling_minitx

MODELS_DIR = Path(layers_minitx.__file__).resolve().parent
GREEDY = dict(do_sample=False, pad_token_id=0, eos_token_id=2)


def own_frames_down_to_here() -> list[str]:
    """Names of the frames in hf_minitx/models from the caller up to MiniTxForCausalLM.forward (included)."""
    names, frame = [], sys._getframe(2)  # skip this function and the spy calling it
    while frame is not None:
        if Path(frame.f_code.co_filename).resolve().parent == MODELS_DIR:
            names.append(frame.f_code.co_qualname)
            if frame.f_code.co_qualname == "MiniTxForCausalLM.forward":
                return names[::-1]
        frame = frame.f_back
    raise AssertionError("the attention product was not reached from MiniTxForCausalLM.forward")


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_at_most_six_own_frames_from_the_causal_lm_forward_to_the_attention_product(monkeypatch, norm_position):
    """MiniTxForCausalLM.forward -> MiniTxModel -> stack -> decoder layer -> attention -> eager attention: the
    attention product (the first torch.matmul of the eager function) sits under at most 6 of our own frames,
    in a plain forward and in generate()'s decode layout."""
    model = tiny_causal(norm_position=norm_position)
    model.set_attn_implementation("eager")
    stacks: list[list[str]] = []
    matmul = torch.matmul

    def spy(*args, **kwargs):
        if sys._getframe(1).f_code.co_qualname == "eager_attention_forward":
            stacks.append(own_frames_down_to_here())
        return matmul(*args, **kwargs)

    monkeypatch.setattr(torch, "matmul", spy)
    ids = random_ids(1, 5)
    with torch.no_grad():
        model(ids)
    model.generate(ids, max_new_tokens=3, min_new_tokens=3, **GREEDY)
    assert stacks and all(stack == stacks[0] for stack in stacks)
    assert stacks[0][-1] == "eager_attention_forward" and len(stacks[0]) <= 6, stacks[0]


@pytest.mark.parametrize("build", [tiny_causal, tiny_seq2seq], ids=["causal", "seq2seq"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope"])
def test_model_apply_reaches_every_submodule(build, positions):
    """`model.apply(fn)` (e.g. a custom init) calls fn on every submodule, the position modules included."""
    model = build(position_embedding_type=positions)
    seen: list[torch.nn.Module] = []
    model.apply(seen.append)
    assert {id(m) for m in seen} == {id(m) for m in model.modules()} and len(seen) == len(list(model.modules()))


def test_layers_call_their_linear_maps_as_modules_and_decoding_stands_above_them():
    """The architecture does not import the decoding machinery nor route its linear maps through it; the
    decode layout is put on the modules by generate() and taken off again."""
    layers_source = Path(layers_minitx.__file__).read_text()
    modeling_source = Path(modeling_minitx.__file__).read_text()
    assert "decoding_minitx import" not in layers_source
    for source in (layers_source, modeling_source):
        assert "project(" not in source and "project_query_key_value(" not in source
    assert "layers_minitx import" in Path(decoding_minitx.__file__).read_text()


@pytest.mark.parametrize("build", [tiny_causal, tiny_seq2seq], ids=["causal", "seq2seq"])
def test_a_hooked_linear_called_as_a_module_runs_its_hook_in_every_forward(build):
    """Each linear map is called as a module in a plain forward: a hook on fc1 or lm_head sees every call."""
    model = build()
    calls = []
    for linear in (model.model.decoder.layers[0].mlp.fc1, model.lm_head):
        linear.register_forward_hook(lambda module, *_: calls.append(module))
    ids = random_ids(2, 4)
    with torch.no_grad():
        model(ids, decoder_input_ids=ids) if model.config.is_encoder_decoder else model(ids)
    assert calls == [model.model.decoder.layers[0].mlp.fc1, model.lm_head]
