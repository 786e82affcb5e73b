"""More of the contracts transformers' common model tests check, written for MiniTx (both kinds).

Eager against sdpa after a save and load with every norm epsilon name set on the config, embeddings resized and
swapped, weights missing from a checkpoint initialised, nothing missing or unexpected on a round trip, parameter
counts, determinism, output shapes, activation checkpointing, meta-device construction and saved dtypes.
"""

import copy
import json
from unittest import mock

import pytest
import torch
from conftest import ALL_OPTIONS, random_ids, tiny_config
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_minitx import MiniTxForCausalLM, MiniTxForConditionalGeneration
from hf_minitx.models import checks_minitx

KINDS = {"causal": (MiniTxForCausalLM, AutoModelForCausalLM), "seq2seq": (MiniTxForConditionalGeneration,
                                                                          AutoModelForSeq2SeqLM)}
ARCHITECTURES = {"default": {}, "all-options": ALL_OPTIONS}
# every name under which transformers' models keep a norm epsilon; its eager/sdpa tests set them all to 1.0
EPSILON_NAMES = ("rms_norm_eps", "layer_norm_eps", "norm_eps", "norm_epsilon", "layer_norm_epsilon", "batch_norm_eps")


def build(kind: str, **overrides):
    torch.manual_seed(0)
    cls, _ = KINDS[kind]
    return cls(tiny_config(is_encoder_decoder=kind == "seq2seq", **overrides)).eval()


def batch(kind: str, rows: int = 2, length: int = 6, vocab: int = 64) -> dict:
    ids = random_ids(rows, length, vocab=vocab)
    return {"input_ids": ids, "decoder_input_ids": random_ids(rows, length, seed=1, vocab=vocab)} if (
        kind == "seq2seq") else {"input_ids": ids}


def padded_batch(kind: str, padding: str) -> tuple[dict, torch.Tensor]:
    """Seven rows, the last padded by two on `padding`'s side ("none": no mask); returns the inputs and the mask
    of the positions whose outputs count (the decoder's for an encoder-decoder)."""
    inputs = batch(kind, rows=7, length=8)
    mask = torch.ones(7, 8, dtype=torch.long)
    if padding == "left":
        mask[-1, :2] = 0
    elif padding == "right":
        mask[-1, -2:] = 0
    if padding != "none":
        inputs["attention_mask"] = mask
        if kind == "seq2seq":
            inputs["decoder_attention_mask"] = mask
    return inputs, mask.bool()


@pytest.mark.parametrize("output_attentions", [False, True], ids=["", "attentions"])
@pytest.mark.parametrize("padding", ["left", "right", "none"])
@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_eager_matches_sdpa_after_saving_with_every_epsilon_name(tmp_path, kind, architecture, padding,
                                                                 output_attentions):
    model = build(kind, **ARCHITECTURES[architecture])
    for name in EPSILON_NAMES:
        setattr(model.config, name, 1.0)  # layer_norm_eps is ours: the norms get eps 1.0; the others are kept
    model.save_pretrained(tmp_path)
    _, auto = KINDS[kind]
    sdpa = auto.from_pretrained(tmp_path, attn_implementation="sdpa", dtype=torch.float32).eval()
    eager = auto.from_pretrained(tmp_path, attn_implementation="eager", dtype=torch.float32).eval()
    switched = copy.deepcopy(sdpa)
    switched.set_attn_implementation("eager")
    assert (sdpa.config._attn_implementation, eager.config._attn_implementation) == ("sdpa", "eager")
    assert {name: getattr(eager.config, name) for name in EPSILON_NAMES} == dict.fromkeys(EPSILON_NAMES, 1.0)
    assert all(module.eps == 1.0 for module in eager.modules() if hasattr(module, "eps"))
    inputs, counted = padded_batch(kind, padding)
    with torch.no_grad(), mock.patch.object(checks_minitx.logger, "warning_once") as warn:
        outs = [m(**inputs, output_hidden_states=True, output_attentions=output_attentions)
                for m in (sdpa, eager, switched)]
    states = [(out.decoder_hidden_states if kind == "seq2seq" else out.hidden_states)[-1] for out in outs]
    for other in states[1:]:
        torch.testing.assert_close(other[counted], states[0][counted], atol=1e-6, rtol=1e-4)
    if output_attentions:  # eager's weights; sdpa has none, says so and gives empty tuples, as transformers' models
        weights = [out.decoder_attentions if kind == "seq2seq" else out.attentions for out in outs]
        assert weights[1][0].shape == weights[2][0].shape == (7, 4, 8, 8) and weights[0] == ()
        assert "attn_implementation='eager'" in warn.call_args[0][0]
    assert warn.called == output_attentions


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_resize_token_embeddings_grows_and_shrinks_and_saves(tmp_path, kind, tied):
    model = build(kind, tie_word_embeddings=tied)
    old = model.get_input_embeddings().weight.detach().clone()
    model.resize_token_embeddings(80, mean_resizing=False)
    assert model.config.vocab_size == 80
    assert model.get_input_embeddings().weight.shape == model.get_output_embeddings().weight.shape == (80, 32)
    assert torch.equal(model.get_input_embeddings().weight[:64], old)  # the old rows are kept
    shared = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert shared == tied
    assert model(**batch(kind, vocab=80)).logits.shape[-1] == 80
    model.save_pretrained(tmp_path)
    loaded = KINDS[kind][1].from_pretrained(tmp_path)
    assert loaded.config.vocab_size == 80
    torch.testing.assert_close(loaded(**batch(kind, vocab=80)).logits, model(**batch(kind, vocab=80)).logits)
    model.resize_token_embeddings(50, pad_to_multiple_of=8)  # shrinks, rounded up to 56
    assert model.config.vocab_size == 56 and model(**batch(kind, vocab=50)).logits.shape[-1] == 56


@pytest.mark.parametrize("kind", list(KINDS))
def test_set_input_embeddings_is_what_the_model_reads(kind):
    model = build(kind)
    inputs = batch(kind)
    before = model(**inputs).logits
    replacement = torch.nn.Embedding(64, 32)
    model.set_input_embeddings(replacement)
    assert model.get_input_embeddings() is replacement
    assert isinstance(model.get_output_embeddings(), torch.nn.Linear)
    after = model(**inputs).logits
    assert not torch.allclose(before, after)
    with torch.no_grad():
        replacement.weight.zero_()
    zeroed = model(**inputs).logits
    assert not torch.allclose(after, zeroed)  # the decoder of an encoder-decoder reads it too


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_round_trip_loads_with_nothing_missing_or_unexpected(tmp_path, kind, tied):
    model = build(kind, tie_word_embeddings=tied)
    assert not model._keys_to_ignore_on_save  # nothing is left out of a checkpoint on purpose
    model.save_pretrained(tmp_path)
    loaded, info = KINDS[kind][1].from_pretrained(tmp_path, output_loading_info=True)
    assert info == {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []}
    assert (loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight) == tied


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_weights_missing_from_a_checkpoint_are_initialised(tmp_path, kind, position):
    model = build(kind, position_embedding_type=position)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    dropped = sorted(name for name in weights if name.endswith("q_proj.weight"))
    save_file({k: v for k, v in weights.items() if k not in dropped}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    loaded, info = KINDS[kind][1].from_pretrained(tmp_path, output_loading_info=True)
    assert sorted(info["missing_keys"]) == dropped
    tensors = {**dict(loaded.named_parameters()), **dict(loaded.named_buffers())}
    assert all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point())
    for name in dropped:
        assert abs(tensors[name].std().item() - 0.02) < 0.01, name  # initializer_range, not leftover memory
    for name, buffer in model.named_buffers():  # non-persistent tables (sinusoidal, rotary) are rebuilt
        assert torch.equal(tensors[name], buffer), name


def test_mismatched_sizes_are_reinitialised_when_asked(tmp_path):
    build("causal").save_pretrained(tmp_path)
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, vocab_size=80, ignore_mismatched_sizes=True,
                                                        output_loading_info=True)
    assert [key for key, *_ in info["mismatched_keys"]] == ["model.decoder.embed_tokens.weight"]
    assert loaded.lm_head.weight.shape == (80, 32) and loaded.lm_head.weight is loaded.get_input_embeddings().weight


@pytest.mark.parametrize("kind", list(KINDS))
def test_num_parameters_counts_each_tensor_once(kind):
    model = build(kind)
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    assert model.num_parameters() == sum(unique.values())
    tables = 1 if kind == "causal" else 2  # learned position tables: the decoder's, and a seq2seq encoder's
    # as GPT-2 (wte and wpe): the token table and the learned position tables, 64 rows of 32 each
    assert model.num_parameters(exclude_embeddings=True) == model.num_parameters() - 64 * 32 * (1 + tables)
    assert build(kind, position_embedding_type="rope").num_parameters(exclude_embeddings=True) == (
        model.num_parameters(exclude_embeddings=True))  # rotary positions have no parameters
    model.get_input_embeddings().weight.requires_grad_(False)
    assert model.num_parameters(only_trainable=True) == model.num_parameters() - 64 * 32


@pytest.mark.parametrize("kind", list(KINDS))
def test_eval_is_deterministic_and_training_dropout_is_seeded(kind):
    model = build(kind, hidden_dropout=0.3, attention_dropout=0.3)
    inputs = batch(kind)
    assert torch.equal(model(**inputs).logits, model(**inputs).logits)
    model.train()
    torch.manual_seed(1)
    first = model(**inputs).logits
    torch.manual_seed(1)
    assert torch.equal(model(**inputs).logits, first)
    assert not torch.equal(model(**inputs).logits, first)


@pytest.mark.parametrize("kind", list(KINDS))
def test_hidden_state_and_attention_shapes(kind):
    model = build(kind, num_encoder_layers=3 if kind == "seq2seq" else None)
    model.config._attn_implementation = "eager"
    source, target = random_ids(2, 7), random_ids(2, 5, seed=1)
    if kind == "seq2seq":
        out = model(source, decoder_input_ids=target, output_hidden_states=True, output_attentions=True)
        assert [s.shape for s in out.encoder_hidden_states] == [(2, 7, 32)] * 4
        assert [a.shape for a in out.encoder_attentions] == [(2, 4, 7, 7)] * 3
        assert [s.shape for s in out.decoder_hidden_states] == [(2, 5, 32)] * 3
        assert [a.shape for a in out.decoder_attentions] == [(2, 4, 5, 5)] * 2
        assert [a.shape for a in out.cross_attentions] == [(2, 4, 5, 7)] * 2
    else:
        out = model(source, output_hidden_states=True, output_attentions=True)
        assert [s.shape for s in out.hidden_states] == [(2, 7, 32)] * 3
        assert [a.shape for a in out.attentions] == [(2, 4, 7, 7)] * 2


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_seq2seq_activation_checkpointing_gives_the_same_gradients(reentrant):
    model = build("seq2seq").train()
    inputs = {**batch("seq2seq"), "labels": random_ids(2, 6, seed=2)}
    model(**inputs).loss.backward()
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": reentrant})
    layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    assert layers and all(m.gradient_checkpointing for m in layers)
    model(**inputs).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)
    model.activation_checkpointing_disable()
    assert not any(m.gradient_checkpointing for m in layers) and not model.is_activation_checkpointing


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_use_cache_under_activation_checkpointing_trains_without_a_cache(kind, attention):
    """As transformers' models: a training call that asks for a cache under checkpointing runs without one (the
    recompute would write every key and value a second time), with the gradients of a call without checkpointing."""
    model = build(kind, attn_implementation=attention).train()
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, :2] = 0  # a padded row: the doubled cache gave keys twice as long as the mask
    inputs = {**batch(kind), "attention_mask": mask, "labels": random_ids(2, 6, seed=2)}
    model(**inputs).loss.backward()
    plain = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.activation_checkpointing_enable()
    out = model(**inputs, use_cache=True)
    out.loss.backward()
    assert out.past_key_values is None
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], atol=1e-6, rtol=1e-5, msg=name)
    model.eval()  # evaluation keeps its cache
    assert model(**batch(kind), use_cache=True).past_key_values.get_seq_length() == 6


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope"])
def test_built_on_the_meta_device_holds_no_memory(position):
    with torch.device("meta"):
        model = MiniTxForConditionalGeneration(tiny_config(is_encoder_decoder=True, position_embedding_type=position))
    assert {t.device.type for t in [*model.parameters(), *model.buffers()]} == {"meta"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_saved_dtype_is_recorded_and_used_on_load(tmp_path, kind):
    build(kind).to(torch.bfloat16).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    auto = KINDS[kind][1]
    assert auto.from_pretrained(tmp_path).dtype == torch.bfloat16  # transformers 5 loads the saved dtype
    assert auto.from_pretrained(tmp_path, dtype=torch.float32).dtype == torch.float32
    assert auto.from_pretrained(tmp_path, torch_dtype=torch.float16).dtype == torch.float16  # the older name
