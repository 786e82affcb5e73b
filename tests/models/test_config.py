"""MiniTxConfig: defaults, derived fields, round trip, and the errors for impossible settings."""

import pytest
from transformers import AutoConfig

from hf_minitx import MiniTxConfig


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
