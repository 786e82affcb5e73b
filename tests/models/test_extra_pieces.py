"""The optional pieces of the data-limited recipes (config.EXTRA_PIECES): the attention output gate, values from the
token embeddings and the U-net skips. Each one's exact meaning against the model without it, its parameters, its
config errors, the card and the export refusal. (Parity, cached == full, padded == alone, eager == sdpa and the
contracts run on them through conftest.ALL_OPTIONS.)"""

import pytest
import torch
from conftest import random_ids, tiny_causal, tiny_config, tiny_seq2seq

from hf_minitx.hub.export import mapping_problems
from hf_minitx.models.configuration_minitx import BOOL_FIELDS, EXTRA_PIECES

PIECE_PARAMETERS = {"attention_gate": "head_gate", "value_embeddings": "value_embed_proj", "unet_skips": "unet_skips"}


def transplant(source, target) -> None:
    """Copy every weight `target` shares with `source` (by name), so the two differ only in the piece."""
    shared = {name: value for name, value in source.state_dict().items() if name in target.state_dict()}
    missing, _ = target.load_state_dict(shared, strict=False)
    assert missing == [] or all(any(part in name for part in PIECE_PARAMETERS.values()) for name in missing)


def with_piece(piece: str, **overrides):
    """(the model with `piece`, the same model without it): both decoder-only, 4 layers, equal shared weights."""
    plain = tiny_causal(num_hidden_layers=4, **overrides)
    model = tiny_causal(num_hidden_layers=4, **{piece: True}, **overrides)
    transplant(plain, model)
    return model, plain


def test_every_piece_is_a_bool_field_off_by_default_that_adds_only_its_parameters():
    default = set(tiny_causal().state_dict())
    assert not {n for n in default if any(p in n for p in PIECE_PARAMETERS.values())}
    assert set(EXTRA_PIECES) == set(PIECE_PARAMETERS) and set(EXTRA_PIECES) <= set(BOOL_FIELDS)
    for piece, part in PIECE_PARAMETERS.items():
        added = set(tiny_causal(num_hidden_layers=4, **{piece: True}).state_dict()) - default
        added = {name for name in added if ".layers.2." not in name and ".layers.3." not in name}
        assert added and all(part in name for name in added), (piece, added)
        with pytest.raises(ValueError, match=f"{piece} must be True or False"):
            tiny_config(**{piece: "yes"})


def test_the_gate_multiplies_each_heads_output_by_the_sigmoid_of_its_projection():
    model, plain = with_piece("attention_gate")
    ids = random_ids(2, 9)
    with torch.no_grad():
        for layer, plain_layer in zip(model.model.decoder.layers, plain.model.decoder.layers, strict=True):
            layer.self_attn.head_gate.weight.zero_()
            layer.self_attn.head_gate.bias.zero_()  # sigmoid(0) = 1/2 on every head
            plain_layer.self_attn.o_proj.weight.mul_(0.5)
        torch.testing.assert_close(model(ids).logits, plain(ids).logits)
        # a gate shut on one head (a large negative bias) is that head's o_proj columns set to zero
        head_dim = model.config.head_dim
        for layer, plain_layer in zip(model.model.decoder.layers, plain.model.decoder.layers, strict=True):
            layer.self_attn.head_gate.bias[1] = -1e4
            plain_layer.self_attn.o_proj.weight[:, head_dim:2 * head_dim] = 0
        torch.testing.assert_close(model(ids).logits, plain(ids).logits)


def test_value_embeddings_add_a_projection_of_the_normalised_token_embeddings_to_the_values():
    model, plain = with_piece("value_embeddings", layer_norm_eps=0.25)  # an epsilon far from torch's default
    ids = random_ids(2, 9)
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, plain(ids).logits)
        for layer in model.model.decoder.layers:
            layer.self_attn.value_embed_proj.weight.zero_()
        torch.testing.assert_close(model(ids).logits, plain(ids).logits)
        seen = []  # what each layer is given: the token embeddings scaled to unit root mean square
        for layer in model.model.decoder.layers:
            layer.self_attn.register_forward_pre_hook(
                lambda module, args, kwargs: seen.append(kwargs["token_embeddings"]), with_kwargs=True)
        model(ids)
        embeddings = model.model.decoder.embed_tokens(ids)
        assert len(seen) == 4
        for given in seen:
            eps = model.config.layer_norm_eps  # the config's, as every other norm of the model
            torch.testing.assert_close(given, embeddings * (embeddings.pow(2).mean(-1, keepdim=True) + eps).rsqrt())
        # a projection equal to v_proj, fed the layer's own input as the token embeddings, doubles the values
        model, plain = with_piece("value_embeddings", num_key_value_heads=2)
        attention, plain_attention = model.model.decoder.layers[0].self_attn, plain.model.decoder.layers[0].self_attn
        attention.value_embed_proj.weight.copy_(attention.v_proj.weight)
        for linear in (attention.v_proj, plain_attention.v_proj):
            linear.bias.zero_()
        plain_attention.v_proj.weight.mul_(2)
        states = torch.randn(2, 5, 32)
        torch.testing.assert_close(attention(states, token_embeddings=states)[0], plain_attention(states)[0])


def test_unet_skips_add_each_first_half_output_to_its_mirrors_input():
    model, plain = with_piece("unet_skips")
    ids = random_ids(2, 9)
    with torch.no_grad():
        model.model.decoder.unet_skips.weight.copy_(torch.tensor([0.5, 2.0]))
        stack = plain.model.decoder
        hidden, _ = stack.embed_positions.add_positions(stack.embed(ids), torch.arange(9)[None])
        outputs = []
        for layer_idx, layer in enumerate(stack.layers):
            if layer_idx == 2:  # layer 1's output, times the second weight
                hidden = hidden + 2.0 * outputs[1]
            if layer_idx == 3:  # layer 0's output, times the first
                hidden = hidden + 0.5 * outputs[0]
            hidden = layer(hidden)[0]
            outputs.append(hidden)
        torch.testing.assert_close(model(ids).logits, plain.lm_head(stack.norm(hidden)))
        model.model.decoder.unet_skips.weight.zero_()
        torch.testing.assert_close(model(ids).logits, plain(ids).logits)
    assert torch.equal(tiny_causal(num_hidden_layers=5, unet_skips=True).model.decoder.unet_skips.weight,
                       torch.ones(2))  # an odd middle layer has no mirror


@pytest.mark.parametrize("piece", list(EXTRA_PIECES))
def test_each_piece_learns_in_both_kinds_and_gets_gradients(piece):
    for model in (tiny_causal(**{piece: True}), tiny_seq2seq(**{piece: True})):
        model.train()
        ids = random_ids(2, 7)
        extra = {"decoder_input_ids": ids} if model.config.is_encoder_decoder else {}
        model(ids, labels=ids, **extra).loss.backward()
        grads = {name: p.grad for name, p in model.named_parameters() if PIECE_PARAMETERS[piece] in name}
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values()), piece


def test_the_card_names_the_pieces_and_export_refuses_each_naming_its_flag():
    from hf_minitx.hub.card import _architecture_rows

    every = tiny_config(**dict.fromkeys(EXTRA_PIECES, True)).to_dict()
    rows = dict(_architecture_rows(every, "causal-lm", 1000))
    assert rows["Extra pieces"] == "; ".join(EXTRA_PIECES.values())
    assert "Extra pieces" not in dict(_architecture_rows(tiny_config().to_dict(), "causal-lm", 1000))
    for target in ("qwen3", "llama", "gpt2"):
        problems = mapping_problems(tiny_config(**dict.fromkeys(EXTRA_PIECES, True)), target)
        for piece in EXTRA_PIECES:
            assert any(line.startswith(f"{piece} true") and f"--config_overrides {piece}=false" in line
                       and f"cannot carry {EXTRA_PIECES[piece]};" in line
                       for line in problems), (target, piece, problems)
