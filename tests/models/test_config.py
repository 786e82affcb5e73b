"""MiniTxConfig: defaults, derived fields, round trip, and the errors for impossible settings.

Also the contracts transformers' common configuration tests hold every config to: extra keys are kept, JSON and
folder round trips give the same dict, num_labels, the common keywords, `update`.
"""

import json
from unittest import mock

import pytest
import torch
from transformers import AutoConfig

from hf_minitx import MiniTxConfig
from hf_minitx.models import configuration_minitx


def test_derived_defaults():
    config = MiniTxConfig(hidden_size=64, num_attention_heads=4)
    assert config.num_key_value_heads == 4
    assert config.intermediate_size == 256
    assert config.head_dim == 16
    assert config.decoder_start_token_id == config.bos_token_id


def test_seq2seq_layer_counts_feed_the_cache_layer_count():
    config = MiniTxConfig(is_encoder_decoder=True, num_hidden_layers=2, num_encoder_layers=3, num_decoder_layers=5)
    assert (config.num_encoder_layers, config.num_decoder_layers, config.num_hidden_layers) == (3, 5, 5)
    default = MiniTxConfig(is_encoder_decoder=True, num_hidden_layers=2)
    assert (default.num_encoder_layers, default.num_decoder_layers) == (2, 2)


def test_round_trip_through_auto_config(tmp_path):
    config = MiniTxConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, hidden_act="relu",
                          norm_position="post", position_embedding_type="rope", is_encoder_decoder=True)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, MiniTxConfig)
    for name in ("hidden_size", "num_key_value_heads", "hidden_act", "norm_position", "position_embedding_type",
                 "num_encoder_layers", "num_decoder_layers", "is_encoder_decoder", "tie_word_embeddings"):
        assert getattr(loaded, name) == getattr(config, name), name


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size"),
        ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads"),
        ({"hidden_act": "swish"}, "hidden_act"),
        ({"norm_position": "middle"}, "norm_position"),
        ({"position_embedding_type": "alibi"}, "position_embedding_type"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"hidden_dropout": 1.5}, "hidden_dropout"),
        ({"pad_token_id": 9000, "vocab_size": 100}, "pad_token_id"),
        ({"num_encoder_layers": 2}, "num_encoder_layers"),
        ({"hidden_size": 36, "num_attention_heads": 4, "position_embedding_type": "rope"}, "rotary"),
    ],
)
def test_impossible_settings_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        MiniTxConfig(**overrides)


def test_unknown_activation_lists_the_allowed_values():
    with pytest.raises(ValueError, match="gelu.*relu"):
        MiniTxConfig(hidden_act="tanh")


def test_a_near_miss_keyword_is_kept_with_one_warning_naming_the_field(tmp_path):
    with mock.patch.object(configuration_minitx.logger, "warning") as warn:
        config = MiniTxConfig(hiden_size=32, layer_norm_epsilon=1.0, foo=3)
    assert warn.call_count == 1  # one line, whatever the number of near misses
    line = warn.call_args[0][0]
    assert "'hiden_size' (did you mean 'hidden_size'?)" in line and "'layer_norm_epsilon' (did you mean " \
        "'layer_norm_eps'?)" in line and "foo" not in line and "\n" not in line
    assert (config.hiden_size, config.hidden_size, config.layer_norm_eps) == (32, 256, 1e-5)  # kept, not applied
    with mock.patch.object(configuration_minitx.logger, "warning") as warn:
        MiniTxConfig(sep_token_id=5, id2label={0: "a"}, tie_encoder_decoder=False, output_attentions=True)
        config.save_pretrained(tmp_path)
        loaded = MiniTxConfig.from_pretrained(tmp_path)  # saved keys were set on purpose: no warning again
    warn.assert_not_called()
    assert (loaded.hiden_size, loaded.layer_norm_epsilon, loaded.foo) == (32, 1.0, 3)


def test_another_architectures_names_are_warned_about_with_ours():
    with mock.patch.object(configuration_minitx.logger, "warning") as warn:
        config = MiniTxConfig(n_layer=2, num_layers=3, n_head=8, d_model=64)
    (line,) = [call[0][0] for call in warn.call_args_list]
    for theirs, ours in (("n_layer", "num_hidden_layers"), ("num_layers", "num_hidden_layers"),
                         ("n_head", "num_attention_heads"), ("d_model", "hidden_size")):
        assert f"{theirs!r} (did you mean {ours!r}?)" in line
    assert (config.num_hidden_layers, config.n_layer) == (4, 2)  # kept as given, not applied


@pytest.mark.parametrize("seq2seq", [False, True], ids=["causal", "seq2seq"])
def test_extra_keys_round_trip_through_json_and_folders(tmp_path, seq2seq):
    config = MiniTxConfig(hidden_size=48, num_attention_heads=6, is_encoder_decoder=seq2seq, hidden_sizes=[64])
    config.layer_norm_epsilon = 1.0  # set by code after construction, as transformers' tests do
    as_json = json.loads(config.to_json_string())
    assert as_json["hidden_sizes"] == [64] and as_json["layer_norm_epsilon"] == 1.0 and as_json["hidden_size"] == 48
    assert {"hidden_sizes", "layer_norm_epsilon"} <= config.to_diff_dict().keys()
    config.to_json_file(tmp_path / "config.json")
    with mock.patch.object(configuration_minitx.logger, "warning") as warn:
        assert MiniTxConfig.from_json_file(tmp_path / "config.json").to_dict() == config.to_dict()
        config.save_pretrained(tmp_path / "folder" / "sub")  # (adds the auto_map of the saved code)
        assert MiniTxConfig.from_pretrained(tmp_path / "folder", subfolder="sub").to_dict() == config.to_dict()
        auto = AutoConfig.from_pretrained(tmp_path / "folder" / "sub").to_dict()
    warn.assert_not_called()
    assert {**auto, "_name_or_path": ""} == config.to_dict()


def test_to_diff_dict_keeps_only_what_differs_from_the_defaults():
    diff = MiniTxConfig(hidden_size=48, num_attention_heads=6).to_diff_dict()
    assert diff["hidden_size"] == 48 and diff["model_type"] == "minitx"
    assert "output_attentions" not in diff and "return_dict" not in diff  # transformers' own defaults are left out


def test_num_labels_sizes_the_label_maps():
    config = MiniTxConfig(num_labels=5)
    assert len(config.id2label) == len(config.label2id) == 5
    config.num_labels = 3
    assert len(config.id2label) == len(config.label2id) == 3


COMMON_KEYWORDS = {  # what every transformers config keeps as given (generation settings excepted)
    "return_dict": False, "output_hidden_states": True, "output_attentions": True, "tie_word_embeddings": False,
    "is_decoder": True, "add_cross_attention": True, "tie_encoder_decoder": True, "chunk_size_feed_forward": 5,
    "architectures": ["MiniTxForCausalLM"], "finetuning_task": "translation", "id2label": {0: "label"},
    "label2id": {"label": "0"}, "tokenizer_class": "PreTrainedTokenizerFast", "prefix": "prefix", "bos_token_id": 6,
    "pad_token_id": 7, "eos_token_id": 8, "sep_token_id": 9, "decoder_start_token_id": 10,
    "task_specific_params": {"translation": "some_params"}, "problem_type": "regression",
}


def test_the_common_keywords_are_kept_as_given(tmp_path):
    with mock.patch.object(configuration_minitx.logger, "warning") as warn:
        config = MiniTxConfig(dtype="float16", **COMMON_KEYWORDS)
    warn.assert_not_called()  # none of transformers' own keywords is taken for a typo
    assert config.dtype == torch.float16
    wrong = {key: getattr(config, key) for key, value in COMMON_KEYWORDS.items() if getattr(config, key) != value}
    assert wrong == {}
    config.save_pretrained(tmp_path)
    loaded = MiniTxConfig.from_pretrained(tmp_path)
    assert {key: getattr(loaded, key) for key in COMMON_KEYWORDS} == COMMON_KEYWORDS


def test_update_and_update_from_string_set_fields_and_extra_keys():
    config = MiniTxConfig()
    config.update({"hidden_size": 128, "note": "kept"})
    config.update_from_string("num_hidden_layers=3,use_cache=false,rope_theta=5.5")
    assert (config.hidden_size, config.note, config.num_hidden_layers, config.use_cache, config.rope_theta) == (
        128, "kept", 3, False, 5.5)


def test_the_common_properties_exist_and_the_config_builds_without_arguments():
    config = MiniTxConfig()
    for name in ("vocab_size", "hidden_size", "num_attention_heads", "num_hidden_layers"):
        assert isinstance(getattr(config, name), int) and getattr(config, name) > 0, name
        setattr(config, name, 8)
        assert getattr(config, name) == 8
