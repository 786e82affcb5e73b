"""Model-level bad input (issue 12): each case raises one ValueError naming the argument and the fix."""

from unittest import mock

import pytest
import torch
from conftest import random_ids, tiny_causal, tiny_config, tiny_seq2seq

from hf_minitx import MiniTxConfig
from hf_minitx.models import lm_head_minitx
from hf_minitx.training.model_presets import parse_config_overrides


@pytest.fixture(scope="module")
def causal():
    return tiny_causal()


@pytest.fixture(scope="module")
def seq2seq():
    return tiny_seq2seq()


@pytest.mark.parametrize("shape", [(1, 0), (0, 4)])
def test_empty_input_ids(causal, seq2seq, shape):
    empty = torch.zeros(shape, dtype=torch.long)
    with pytest.raises(ValueError, match=r"input_ids has shape .*at least one"):
        causal(empty)
    with pytest.raises(ValueError, match=r"^input_ids has shape"):
        seq2seq(empty, decoder_input_ids=torch.ones(max(shape[0], 1), 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"decoder_input_ids has shape"):
        seq2seq(torch.ones(1, 3, dtype=torch.long), decoder_input_ids=torch.zeros(1, 0, dtype=torch.long))


def test_empty_prompt_in_generate(causal, seq2seq):
    for model in (causal, seq2seq):
        with pytest.raises(ValueError, match="input_ids has shape .*empty prompt"):
            model.generate(torch.zeros(1, 0, dtype=torch.long), max_new_tokens=2)


def test_one_dimensional_or_float_input_ids(causal):
    with pytest.raises(ValueError, match=r"input_ids must be 2-D .*input_ids\[None\]"):
        causal(torch.tensor([5, 6, 7]))
    with pytest.raises(ValueError, match="integer token ids.*long"):
        causal(torch.tensor([[5.0, 6.0]]))


@pytest.mark.parametrize("beams", [0, -1])
def test_generate_with_no_beams(causal, seq2seq, beams):
    for model in (causal, seq2seq):
        with pytest.raises(ValueError, match=f"num_beams={beams}.*>= 1"):
            model.generate(random_ids(1, 3), max_new_tokens=2, num_beams=beams)


@pytest.mark.parametrize("bad", [2, 0.5, -1])
def test_attention_mask_values_other_than_zero_and_one(causal, seq2seq, bad):
    ids = random_ids(1, 4)
    mask = torch.tensor([[1, 1, 1, bad]], dtype=torch.float if bad == 0.5 else torch.long)
    with pytest.raises(ValueError, match=r"^attention_mask must hold only 0 .*and 1"):
        causal(ids, attention_mask=mask)
    with pytest.raises(ValueError, match=r"^attention_mask must hold only 0"):
        seq2seq(ids, attention_mask=mask, decoder_input_ids=ids)
    with pytest.raises(ValueError, match=r"^decoder_attention_mask must hold only 0"):
        seq2seq(ids, decoder_input_ids=ids, decoder_attention_mask=mask)


def test_boolean_and_float_zero_one_masks_are_accepted(causal):
    ids = random_ids(1, 4)
    reference = causal(ids, attention_mask=torch.tensor([[0, 1, 1, 1]])).logits
    for mask in (torch.tensor([[False, True, True, True]]), torch.tensor([[0.0, 1.0, 1.0, 1.0]])):
        torch.testing.assert_close(causal(ids, attention_mask=mask).logits, reference)


def test_mask_and_ids_are_checked_with_one_host_sync(causal):
    """The value checks of a call share one device-to-host copy (none per check)."""
    calls = []
    original = torch.Tensor.tolist

    def counting(self):
        calls.append(self.shape)
        return original(self)

    with mock.patch.object(torch.Tensor, "tolist", counting):
        causal(random_ids(2, 4), attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    assert calls == [(3,)]  # ids range, mask values, padding: one stacked copy


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"layer_norm_eps": -1.0}, "layer_norm_eps must be a finite number > 0"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"initializer_range": -0.02}, "initializer_range must be a finite number >= 0"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be True or False"),
        ({"scale_embeddings": "false"}, "scale_embeddings must be True or False"),
        ({"layer_norm_eps": "x"}, "layer_norm_eps must be a number"),
        ({"hidden_dropout": "0.1"}, "hidden_dropout must be a number"),
        ({"is_encoder_decoder": True, "num_encoder_layers": 0}, "num_encoder_layers must be a positive integer"),
        ({"num_decoder_layers": -1}, "num_decoder_layers must be a positive integer"),
        ({"pad_token_id": "0"}, "pad_token_id must be an integer"),
    ],
)
def test_config_values_of_the_wrong_type_or_range(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**overrides)


def test_explicit_encoder_layer_count_is_kept():
    config = tiny_config(is_encoder_decoder=True, num_encoder_layers=3)
    assert (config.num_encoder_layers, config.num_decoder_layers) == (3, 2)
    assert MiniTxConfig(rope_theta=500).rope_theta == 500  # an int is a fine float


def test_config_overrides_reject_typos_and_parse_by_field_type():
    with pytest.raises(ValueError, match="'hiden_size' is not a MiniTxConfig field; did you mean hidden_size"):
        parse_config_overrides("hiden_size=32")
    assert parse_config_overrides("tie_word_embeddings=False,scale_embeddings=yes,layer_norm_eps=1e-6") == {
        "tie_word_embeddings": False, "scale_embeddings": True, "layer_norm_eps": 1e-6}
    assert parse_config_overrides("num_key_value_heads=none,rope_theta=500") == {
        "num_key_value_heads": None, "rope_theta": 500.0}
    with pytest.raises(ValueError, match=r"tie_word_embeddings='maybe': expected bool"):
        parse_config_overrides("tie_word_embeddings=maybe")
    with pytest.raises(ValueError, match=r"hidden_size='3.5': expected int"):
        parse_config_overrides("hidden_size=3.5")


@pytest.mark.parametrize("name", ["return_dict", "output_hidden_states", "dtype", "architectures"])
def test_config_overrides_refuse_runtime_fields(name):
    """PretrainedConfig's runtime fields are not a recipe: return_dict=false would hand the training loop tuples,
    dtype would be undone by --mixed_precision. is_encoder_decoder, --task's twin, is still taken."""
    with pytest.raises(ValueError, match=f"'{name}' is how transformers runs or files a model"):
        parse_config_overrides(f"{name}=false")
    assert parse_config_overrides("is_encoder_decoder=true") == {"is_encoder_decoder": True}


@pytest.mark.parametrize("bad", [64, 1000, -5])
def test_label_ids_outside_the_vocabulary(causal, seq2seq, bad):
    ids = random_ids(1, 4)
    labels = ids.clone()
    labels[0, 2] = bad
    with pytest.raises(ValueError, match=rf"^labels must hold token ids in \[0, 64\).*-100.*{bad}"):
        causal(ids, labels=labels)
    with pytest.raises(ValueError, match=r"^labels must hold token ids"):
        seq2seq(ids, labels=labels)
    with pytest.raises(ValueError, match=r"^shift_labels must hold token ids"):
        causal(ids, shift_labels=labels)


def test_labels_of_the_wrong_shape_or_dtype(causal, seq2seq):
    ids = random_ids(2, 4)
    for labels in (ids[:, :3], ids[0], ids.float()):
        with pytest.raises(ValueError, match=r"^labels must be integer ids shaped like .*\(2, 4\)"):
            causal(ids, labels=labels)
    with pytest.raises(ValueError, match=r"^labels must be integer ids shaped like .*\(2, 3\)"):
        seq2seq(ids, decoder_input_ids=ids[:, :3], labels=ids)
    with pytest.raises(ValueError, match=r"^labels must be integer ids shaped like .*\(4,\)"):
        seq2seq(ids, labels=ids[0])
    with pytest.raises(ValueError, match="shift_labels is for MiniTxForCausalLM"):
        seq2seq(ids, labels=ids, shift_labels=ids)


@pytest.mark.parametrize("kind", ["causal", "seq2seq", "only-first-labelled"])
def test_all_labels_ignored_gives_zero_loss_and_a_warning(kind):
    model = tiny_seq2seq() if kind == "seq2seq" else tiny_causal()
    ids = random_ids(2, 4)
    labels = torch.full_like(ids, -100)
    if kind == "only-first-labelled":  # position 0 has no predecessor: nothing is left after the shift
        labels[:, 0] = ids[:, 0]
    with mock.patch.object(lm_head_minitx.logger, "warning_once") as warn:
        loss = model.train()(ids, labels=labels).loss
    assert loss.item() == 0.0 and loss.requires_grad
    assert "loss is 0" in warn.call_args[0][0]
    loss.backward()  # a zero gradient, no NaN
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_meta_device_inputs_with_real_weights_are_refused():
    ids = random_ids(2, 5)
    with pytest.raises(ValueError, match="inputs are on the meta device .* weights are on cpu"):
        tiny_causal()(ids.to("meta"))
    with pytest.raises(ValueError, match="inputs are on the meta device"):
        tiny_seq2seq()(input_ids=ids, decoder_input_ids=ids.to("meta"))


def test_meta_device_inputs_trace_shapes_without_reading_values():
    model = tiny_causal().to("meta")
    ids = random_ids(2, 5).to("meta")
    out = model(ids, attention_mask=torch.ones(2, 5, dtype=torch.long, device="meta"), labels=ids)
    assert out.logits.shape == (2, 5, 64) and out.logits.device.type == "meta"


@pytest.mark.parametrize("shape", [(2, 1, 5, 9), (3, 1, 5, 5), (2, 1, 4, 5), (2, 3, 5, 5)])
def test_four_d_mask_of_the_wrong_shape_is_named(shape):
    with pytest.raises(ValueError, match=r"4-D attention_mask must be .* = \(2, 1, 5, 5\)"):
        tiny_causal()(random_ids(2, 5), attention_mask=torch.ones(shape, dtype=torch.bool))


def test_inputs_embeds_of_the_wrong_width_are_named():
    with pytest.raises(ValueError, match=r"inputs_embeds must be \(batch, seq, hidden_size=32\)"):
        tiny_causal()(inputs_embeds=torch.zeros(1, 2, 31))
