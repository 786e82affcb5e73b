"""Bad input raises a ValueError that says what was wrong, before anything deep inside fails."""

import pytest
import torch
from conftest import tiny_config

from hf_minitx import MiniTxForCausalLM, MiniTxForConditionalGeneration
from hf_minitx.models.modeling_minitx import CACHE_NAME


@pytest.fixture(scope="module")
def causal():
    return MiniTxForCausalLM(tiny_config()).eval()


@pytest.fixture(scope="module")
def seq2seq():
    return MiniTxForConditionalGeneration(tiny_config(is_encoder_decoder=True)).eval()


@pytest.mark.parametrize("bad", [64, 1000, -1])
def test_token_ids_outside_the_vocabulary(causal, seq2seq, bad):
    ids = torch.tensor([[5, 6, bad]])
    with pytest.raises(ValueError, match=r"\[0, 64\).*vocab_size"):
        causal(ids)
    with pytest.raises(ValueError, match="vocab_size"):
        seq2seq(ids, decoder_input_ids=torch.tensor([[1]]))
    with pytest.raises(ValueError, match="vocab_size"):
        seq2seq(torch.tensor([[5]]), decoder_input_ids=ids)


@pytest.mark.parametrize("pe", ["learned", "sinusoidal"])
def test_input_longer_than_max_position_embeddings(pe):
    model = MiniTxForCausalLM(tiny_config(position_embedding_type=pe, max_position_embeddings=16)).eval()
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        model(torch.ones(1, 17, dtype=torch.long))
    cache = getattr(model(torch.ones(1, 10, dtype=torch.long), use_cache=True), CACHE_NAME)
    with pytest.raises(ValueError, match="17 positions"):  # 10 cached + 7 new
        model(torch.ones(1, 7, dtype=torch.long), cache=cache, use_cache=True)


def test_rotary_positions_have_no_length_limit():
    model = MiniTxForCausalLM(tiny_config(position_embedding_type="rope", max_position_embeddings=16)).eval()
    assert model(torch.ones(1, 40, dtype=torch.long)).logits.shape == (1, 40, 64)


def test_attention_mask_of_the_wrong_shape(causal):
    ids = torch.ones(2, 6, dtype=torch.long)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\).*\(2, 6\)"):
        causal(ids, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        causal(ids, attention_mask=torch.ones(3, 6))


def test_seq2seq_without_decoder_inputs_or_labels(seq2seq):
    with pytest.raises(ValueError, match="labels.*decoder_input_ids"):
        seq2seq(torch.ones(1, 4, dtype=torch.long))


def test_both_ids_and_embeddings(causal):
    with pytest.raises(ValueError, match="exactly one of input_ids or inputs_embeds"):
        causal(torch.ones(1, 3, dtype=torch.long), inputs_embeds=torch.zeros(1, 3, 32))


def test_building_the_wrong_head_for_a_config():
    with pytest.raises(ValueError, match="encoder-decoder.*AutoModelForSeq2SeqLM"):
        MiniTxForCausalLM(tiny_config(is_encoder_decoder=True))
    with pytest.raises(ValueError, match="decoder-only.*AutoModelForCausalLM"):
        MiniTxForConditionalGeneration(tiny_config())
