"""Forward-pass parity of the models: eager vs sdpa, batched vs single, cached vs full, losses, checkpointing."""

import warnings

import pytest
import torch
from conftest import ALL_OPTIONS, random_ids, tiny_causal, tiny_seq2seq

from hf_minitx import MiniTxModel
from hf_minitx.models.modeling_minitx import CACHE_NAME, shift_tokens_right

VARIANTS = [
    dict(position_embedding_type="learned", norm_position="pre"),
    dict(position_embedding_type="sinusoidal", norm_position="post", hidden_act="relu", scale_embeddings=True),
    dict(position_embedding_type="rope", norm_position="pre", num_key_value_heads=2),
    dict(ALL_OPTIONS, position_embedding_type="rope", num_key_value_heads=2),
    dict(ALL_OPTIONS, position_embedding_type="learned", norm_position="post", hidden_act="relu2"),
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_causal_eager_equals_sdpa(variant):
    model = tiny_causal(**variant)
    ids = random_ids(2, 12)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    model.set_attn_implementation("sdpa")
    sdpa = model(ids, attention_mask=mask).logits
    model.set_attn_implementation("eager")
    eager = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_seq2seq_eager_equals_sdpa(variant):
    model = tiny_seq2seq(**variant)
    src, tgt = random_ids(2, 9), random_ids(2, 6, seed=1)
    mask = torch.ones_like(src)
    mask[1, 6:] = 0
    model.set_attn_implementation("sdpa")
    sdpa = model(src, attention_mask=mask, decoder_input_ids=tgt).logits
    model.set_attn_implementation("eager")
    eager = model(src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_left_padded_batch_equals_each_sequence_alone(variant):
    model = tiny_causal(**variant)
    short, long = random_ids(1, 5, seed=1), random_ids(1, 9, seed=2)
    batch = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1), long])
    mask = (torch.arange(9)[None] >= torch.tensor([[4], [0]])).long()
    logits = model(batch, attention_mask=mask).logits
    torch.testing.assert_close(logits[0, 4:], model(short).logits[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits[1], model(long).logits[0], atol=1e-5, rtol=1e-5)


def test_right_padded_seq2seq_source_equals_unpadded():
    model = tiny_seq2seq()
    src, tgt = random_ids(1, 5), random_ids(1, 4, seed=3)
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    torch.testing.assert_close(
        model(padded, attention_mask=mask, decoder_input_ids=tgt).logits,
        model(src, decoder_input_ids=tgt).logits, atol=1e-5, rtol=1e-5,
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_forward_equals_full_forward(variant):
    model = tiny_causal(**variant)
    ids = random_ids(2, 10)
    full = model(ids).logits
    first = model(ids[:, :6], use_cache=True)
    step = model(ids[:, 6:], cache=getattr(first, CACHE_NAME), use_cache=True)  # 4 tokens after a cache
    torch.testing.assert_close(step.logits, full[:, 6:], atol=1e-5, rtol=1e-5)



@pytest.mark.parametrize("build", [tiny_causal, tiny_seq2seq], ids=["causal", "seq2seq"])
def test_the_cache_goes_by_either_name_and_comes_back_under_the_installed_one(build):
    """transformers 5.24 renamed `past_key_values` to `cache`: a cache passed by either name gives the same logits,
    both at once is refused, and outputs carry it under the installed version's name (generate() reads that)."""
    model = build()
    ids = random_ids(2, 10)
    extra = {"decoder_input_ids": ids[:, :6]} if model.config.is_encoder_decoder else {}
    source = ids if extra else ids[:, :6]

    def first_then_step(**name):
        first = model(source, use_cache=True, **extra)
        cache = getattr(first, CACHE_NAME)
        assert cache is not None and cache.get_seq_length() == 6
        step_ids = {"decoder_input_ids": ids[:, 6:]} if extra else {"input_ids": ids[:, 6:]}
        if extra:
            step_ids["input_ids"] = source
        return model(**step_ids, use_cache=True, **{next(iter(name)): cache}).logits

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        old_name = first_then_step(past_key_values=1)
    torch.testing.assert_close(first_then_step(cache=1), old_name)
    deprecated = [w for w in said if issubclass(w.category, FutureWarning) and "`past_key_values` is deprecated" in
                  str(w.message)]
    assert len(deprecated) == (1 if CACHE_NAME == "cache" else 0)  # the old name is warned about where it is old
    cache = getattr(model(source, use_cache=True, **extra), CACHE_NAME)
    step = {"decoder_input_ids": ids[:, 6:], "input_ids": source} if extra else {"input_ids": ids[:, 6:]}
    with pytest.raises(ValueError, match="not both"):
        model(**step, cache=cache, past_key_values=cache)


def test_causal_loss_is_shifted_and_ignores_minus_100():
    model = tiny_causal()
    ids = random_ids(2, 8)
    logits = model(ids).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(model(ids, labels=ids).loss, expected)
    labels = ids.clone()
    labels[:, 5:] = -100  # padding positions: their loss must not count
    kept = torch.nn.functional.cross_entropy(logits[:, :4].reshape(-1, 64), ids[:, 1:5].reshape(-1))
    torch.testing.assert_close(model(ids, labels=labels).loss, kept)


def test_seq2seq_labels_make_decoder_inputs_and_loss_ignores_padding():
    model = tiny_seq2seq()
    src = random_ids(2, 7)
    labels = torch.tensor([[5, 6, 7, 2], [8, 2, -100, -100]])
    decoder_inputs = shift_tokens_right(labels, model.config.decoder_start_token_id, model.config.pad_token_id)
    assert decoder_inputs.tolist() == [[1, 5, 6, 7], [1, 8, 2, 0]]
    out = model(src, labels=labels)
    logits = model(src, decoder_input_ids=decoder_inputs).logits
    torch.testing.assert_close(out.logits, logits)
    keep = labels != -100
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(logits[keep], labels[keep]))


def test_tied_embeddings_share_storage_and_untied_do_not():
    tied = tiny_causal()
    assert tied.lm_head.weight.data_ptr() == tied.model.decoder.embed_tokens.weight.data_ptr()
    untied = tiny_causal(tie_word_embeddings=False)
    assert untied.lm_head.weight.data_ptr() != untied.model.decoder.embed_tokens.weight.data_ptr()
    s2s = tiny_seq2seq()
    assert s2s.lm_head.weight.data_ptr() == s2s.get_input_embeddings().weight.data_ptr()


def test_gradient_checkpointing_gives_the_same_gradients():
    ids = random_ids(2, 8)

    def grads(checkpointing):
        model = tiny_causal(hidden_dropout=0.0)
        model.train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 10
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)


def test_output_attentions_shapes_and_rows_sum_to_one():
    model = tiny_seq2seq(num_key_value_heads=2)
    model.set_attn_implementation("eager")
    out = model(random_ids(2, 7), decoder_input_ids=random_ids(2, 5), output_attentions=True, output_hidden_states=True)
    assert len(out.encoder_attentions) == 2 and out.encoder_attentions[0].shape == (2, 4, 7, 7)
    assert out.decoder_attentions[0].shape == (2, 4, 5, 5) and out.cross_attentions[0].shape == (2, 4, 5, 7)
    torch.testing.assert_close(out.cross_attentions[1].sum(-1), torch.ones(2, 4, 5))
    assert torch.all(out.decoder_attentions[0].triu(1) == 0)
    assert len(out.decoder_hidden_states) == 3 and len(out.encoder_hidden_states) == 3


def test_auto_model_gives_the_headless_model_of_either_kind(tmp_path):
    from transformers import AutoModel

    for model in (tiny_causal(), tiny_seq2seq()):
        model.save_pretrained(tmp_path / model.__class__.__name__)
        base = AutoModel.from_pretrained(tmp_path / model.__class__.__name__)
        assert isinstance(base, MiniTxModel)
        assert base.config.is_encoder_decoder == model.config.is_encoder_decoder
        torch.testing.assert_close(base.get_input_embeddings().weight, model.get_input_embeddings().weight)


def test_dropout_only_in_training_mode():
    model = tiny_causal(hidden_dropout=0.5, attention_dropout=0.5)
    ids = random_ids(1, 8)
    torch.testing.assert_close(model(ids).logits, model(ids).logits)
    model.train()
    assert not torch.allclose(model(ids).logits, model(ids).logits)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_scale_output_logits_multiplies_lm_head_output_in_the_weights(variant, kind):
    """Temperature calibration's fold: `lm_head`'s output times the scale, before the soft cap (which ALL_OPTIONS
    sets), with pre- and post-LN, LayerNorm and RMSNorm; a tied head stays tied to an unchanged embedding."""
    from hf_minitx.models.lm_head_minitx import soft_cap

    model = (tiny_causal if kind == "causal" else tiny_seq2seq)(**variant)
    ids = random_ids(2, 10)
    inputs = {"input_ids": ids} if kind == "causal" else {"input_ids": ids, "decoder_input_ids": ids[:, :6]}
    caught = []
    model.lm_head.register_forward_hook(lambda _m, _i, out: caught.append(out))
    with torch.no_grad():
        model(**inputs)
        embedding = model.get_input_embeddings().weight.clone()
        model.scale_output_logits(0.8)
        logits = model(**inputs).logits
    assert torch.allclose(caught[1], 0.8 * caught[0], atol=1e-5)
    assert torch.allclose(logits, soft_cap(0.8 * caught[0], model.config.final_logit_softcap), atol=1e-5)
    assert not torch.allclose(caught[1], caught[0], atol=1e-3)  # it did change them
    assert torch.equal(model.get_input_embeddings().weight, embedding)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.get_input_embeddings().weight
