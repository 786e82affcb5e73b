"""The model contracts transformers' common tests check, written for MiniTx (both kinds, headless and heads).

Each test names the contract it holds; the list is in docs/models.md and in issue 12.
"""

import inspect
import sys

import pytest
import torch
from conftest import ALL_OPTIONS, random_ids, tiny_config
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BartModel,
    CompileConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
)
from transformers.cache_utils import Cache

from hf_minitx import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration, MiniTxModel

LAYERS = 2


ARCHITECTURES = {"default": {}, "all-options": ALL_OPTIONS}  # every contract holds for both
ARCHITECTURE = ARCHITECTURES["default"]


@pytest.fixture(autouse=True, params=list(ARCHITECTURES))
def architecture(request, monkeypatch):
    """Run each contract test on the default architecture and on one with every new option on."""
    monkeypatch.setattr(sys.modules[__name__], "ARCHITECTURE", ARCHITECTURES[request.param])


def build(cls, seq2seq: bool, **overrides):
    torch.manual_seed(0)
    config = tiny_config(is_encoder_decoder=seq2seq, **{**ARCHITECTURE, **overrides})
    config._attn_implementation = "eager"  # the implementation that returns attention weights
    return cls(config).eval()


def inputs(seq2seq: bool, labels: bool = False) -> dict:
    ids = random_ids(2, 5)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if seq2seq:
        batch["decoder_input_ids"] = random_ids(2, 4, seed=1)
    if labels:
        batch["labels"] = batch.get("decoder_input_ids", ids)
    return batch


KINDS = [(MiniTxModel, False), (MiniTxModel, True), (MiniTxForCausalLM, False), (MiniTxForConditionalGeneration, True)]
KIND_IDS = ["model-causal", "model-seq2seq", "causal-lm", "seq2seq-lm"]


def hidden_and_attention_fields(out, seq2seq: bool) -> dict:
    if seq2seq:
        return {name: getattr(out, name) for name in (
            "encoder_hidden_states", "decoder_hidden_states", "encoder_attentions", "decoder_attentions",
            "cross_attentions")}
    return {"hidden_states": out.hidden_states, "attentions": out.attentions}


@pytest.mark.parametrize(("cls", "seq2seq"), KINDS, ids=KIND_IDS)
def test_output_flags_set_on_the_config_are_the_defaults(cls, seq2seq):
    model = build(cls, seq2seq)
    plain = hidden_and_attention_fields(model(**inputs(seq2seq)), seq2seq)
    assert all(value is None for value in plain.values())
    model.config.output_hidden_states = True
    model.config.output_attentions = True
    out = model(**inputs(seq2seq))
    for name, value in hidden_and_attention_fields(out, seq2seq).items():
        expected = LAYERS + 1 if "hidden" in name else LAYERS  # embeddings + one per layer
        assert isinstance(value, tuple) and len(value) == expected, name
    weights = out.decoder_attentions[0] if seq2seq else out.attentions[0]
    assert weights.shape == (2, 4, 4 if seq2seq else 5, 4 if seq2seq else 5)  # (batch, heads, q_len, kv_len)
    if seq2seq:
        assert out.cross_attentions[0].shape == (2, 4, 4, 5)
    # an explicit argument still wins over the config
    overridden = model(**inputs(seq2seq), output_hidden_states=False, output_attentions=False)
    assert all(value is None for value in hidden_and_attention_fields(overridden, seq2seq).values())


def assert_same_tree(left, right) -> None:
    assert type(left) is type(right), (type(left), type(right))
    if isinstance(left, tuple):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            assert_same_tree(a, b)
    elif isinstance(left, torch.Tensor):
        torch.testing.assert_close(left, right)


@pytest.mark.parametrize("flags", [{}, {"output_hidden_states": True, "output_attentions": True}])
@pytest.mark.parametrize(("cls", "seq2seq"), KINDS, ids=KIND_IDS)
def test_return_dict_false_gives_the_plain_tuple_of_to_tuple(cls, seq2seq, flags):
    model = build(cls, seq2seq)
    batch = {**inputs(seq2seq, labels=cls is not MiniTxModel), **flags}
    as_dict = model(**batch)
    as_tuple = model(**batch, return_dict=False)
    assert type(as_tuple) is tuple
    assert not any(hasattr(item, "to_tuple") for item in as_tuple)  # no ModelOutput nested inside
    assert_same_tree(as_tuple, as_dict.to_tuple())
    if flags:
        hidden = as_tuple[[i for i, key in enumerate(as_dict.keys()) if "hidden_states" in key][0]]
        assert type(hidden) is tuple and len(hidden) == LAYERS + 1
    model.config.return_dict = False  # the config default, used when the call does not say
    assert_same_tree(model(**batch), as_tuple)
    assert hasattr(model(**batch, return_dict=True), "to_tuple")


def test_return_dict_false_from_the_constructor_survives_save_and_load(tmp_path):
    config = tiny_config(return_dict=False, output_hidden_states=True)
    config.save_pretrained(tmp_path)
    loaded = MiniTxConfig.from_pretrained(tmp_path)
    assert loaded.return_dict is False and loaded.output_hidden_states is True
    out = MiniTxForCausalLM(loaded).eval()(random_ids(1, 4))
    assert type(out) is tuple and len(out[2]) == LAYERS + 1  # (logits, cache, hidden_states)


def test_shift_labels_are_used_as_given_and_match_labels():
    model = build(MiniTxForCausalLM, False)
    ids = random_ids(2, 6)
    shifted = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)  # (batch, seq): next token of each position
    from_labels = model(ids, labels=ids).loss
    from_shift = model(ids, shift_labels=shifted).loss
    torch.testing.assert_close(from_shift, from_labels)
    # shift_labels are not shifted again: targets equal to the inputs score each position against itself
    logits = model(ids).logits
    own = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids.reshape(-1))  # (batch * seq, vocab)
    torch.testing.assert_close(model(ids, shift_labels=ids).loss, own)
    assert not torch.allclose(own, from_labels)


def test_num_items_in_batch_makes_the_loss_a_sum_over_that_count():
    model = build(MiniTxForCausalLM, False)
    ids = random_ids(2, 6)
    mean = model(ids, labels=ids).loss  # over 2 * 5 predicted positions
    torch.testing.assert_close(model(ids, labels=ids, num_items_in_batch=torch.tensor(20)).loss, mean * 10 / 20)


def test_causal_loss_does_not_copy_the_logits():
    """The shift moves the (batch, seq) labels, never the (batch, seq, vocab) logits."""
    model = build(MiniTxForCausalLM, False)
    seen = []
    original = torch.nn.functional.cross_entropy

    def spy(logits, *args, **kwargs):
        seen.append(logits)
        return original(logits, *args, **kwargs)

    ids = random_ids(2, 6)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.functional, "cross_entropy", spy)
        out = model(ids, labels=ids)
    assert seen[0].data_ptr() == out.logits.data_ptr()  # the returned logits themselves, not a shifted copy


@pytest.mark.parametrize("cls", [MiniTxForCausalLM, MiniTxForConditionalGeneration])
def test_forward_compiles_with_fullgraph_and_matches_eager(cls):
    seq2seq = cls is MiniTxForConditionalGeneration
    assert cls._can_compile_fullgraph
    model = build(cls, seq2seq)
    batch = inputs(seq2seq, labels=True)
    batch["attention_mask"][0, :2] = 0  # padding exercises the mask path
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, fullgraph=True, backend="eager")  # fullgraph: any graph break raises
    for extra in ({}, {"use_cache": False, "output_hidden_states": True}):
        got, want = compiled(**batch, **extra), model(**batch, **extra)
        torch.testing.assert_close(got.logits, want.logits)
        torch.testing.assert_close(got.loss, want.loss)


@pytest.mark.parametrize("cls", [MiniTxForCausalLM, MiniTxForConditionalGeneration])
def test_static_cache_generation_compiles_the_forward_and_matches_dynamic(cls):
    """What transformers' generate() does on a GPU with cache_implementation="static", forced on CPU."""
    seq2seq = cls is MiniTxForConditionalGeneration
    model = build(cls, seq2seq)
    ids = random_ids(2, 5)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    torch._dynamo.reset()
    compile_config = CompileConfig(fullgraph=True, dynamic=False, backend="eager")
    compile_config._compile_all_devices = True
    dynamic = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    static = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False,
                            cache_implementation="static", compile_config=compile_config)
    assert hasattr(model, "_compiled_call")  # generate() took the compiled route
    assert torch.equal(dynamic, static)


@pytest.mark.parametrize("scaled", [False, True], ids=["unscaled", "scaled"])
@pytest.mark.parametrize(("cls", "seq2seq"), KINDS, ids=KIND_IDS)
def test_inputs_embeds_give_what_input_ids_give(cls, seq2seq, scaled):
    """get_input_embeddings()(ids) is what the model reads for ids, the paper's sqrt(hidden) scale included."""
    model = build(cls, seq2seq, scale_embeddings=scaled, initializer_range=0.2)  # a scale that moves the logits
    by_ids = inputs(seq2seq)
    embed = model.get_input_embeddings()
    by_embeds = {"attention_mask": by_ids["attention_mask"], "inputs_embeds": embed(by_ids["input_ids"])}
    if seq2seq:  # (batch, seq, hidden) each
        by_embeds["decoder_inputs_embeds"] = embed(by_ids["decoder_input_ids"])
    torch.testing.assert_close(model(**by_embeds)[0], model(**by_ids)[0])  # logits or last hidden state


def test_resized_embeddings_keep_the_scale():
    model = build(MiniTxForCausalLM, False, scale_embeddings=True)
    ids = random_ids(1, 5)
    before = model.get_input_embeddings()(ids)
    model.resize_token_embeddings(model.config.vocab_size + 8, mean_resizing=False)
    torch.testing.assert_close(model.get_input_embeddings()(ids), before)
    assert model.get_input_embeddings().embed_scale == model.config.hidden_size ** 0.5


def test_generate_from_inputs_embeds_gives_the_tokens_of_ids_with_scaled_embeddings():
    model = build(MiniTxForCausalLM, False, scale_embeddings=True, initializer_range=0.2)
    ids = random_ids(1, 5)
    new = model.generate(inputs_embeds=model.get_input_embeddings()(ids), max_new_tokens=6, do_sample=False)
    assert torch.equal(new, model.generate(ids, max_new_tokens=6, do_sample=False)[:, ids.shape[1]:])


@pytest.mark.parametrize(("cls", "seq2seq"), [KINDS[2], KINDS[3]], ids=KIND_IDS[2:])
def test_logits_to_keep_takes_a_count_or_the_positions_to_keep(cls, seq2seq):
    model = build(cls, seq2seq)
    batch = inputs(seq2seq)
    full = model(**batch).logits  # (batch, seq, vocab)
    torch.testing.assert_close(model(**batch, logits_to_keep=2).logits, full[:, -2:])
    torch.testing.assert_close(model(**batch, logits_to_keep=torch.tensor([0, 2])).logits, full[:, [0, 2]])
    torch.testing.assert_close(model(**batch, logits_to_keep=torch.tensor([1])).logits, full[:, 1:2])


@pytest.mark.parametrize(("cls", "seq2seq"), KINDS, ids=KIND_IDS)
def test_forward_signature_starts_like_transformers_models(cls, seq2seq):
    names = list(inspect.signature(cls.forward).parameters)[1:]
    assert names[:2] == ["input_ids", "attention_mask"]
    if seq2seq:
        assert names.index("decoder_input_ids") < names.index("encoder_outputs")


def test_hidden_states_and_attentions_keep_their_gradients():
    model = build(MiniTxForCausalLM, False)
    out = model(random_ids(1, 5), output_hidden_states=True, output_attentions=True)
    out.hidden_states[0].retain_grad()
    out.attentions[0].retain_grad()
    out.logits.sum().backward()
    assert out.hidden_states[0].grad is not None and out.attentions[0].grad is not None


def layout(value):
    """A description of an output's structure: tensors by rank, caches by kind, tuples by length and content."""
    if isinstance(value, torch.Tensor):
        return f"tensor{value.dim()}"
    if isinstance(value, Cache):
        return "cache"
    if isinstance(value, tuple):
        return ("tuple", len(value), layout(value[0]) if value else None)
    return type(value).__name__


def gpt2_and_minitx(headless: bool):
    gpt2_config = GPT2Config(vocab_size=64, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64, bos_token_id=1,
                             eos_token_id=2)
    gpt2_config._attn_implementation = "eager"
    torch.manual_seed(0)
    gpt2 = (GPT2Model if headless else GPT2LMHeadModel)(gpt2_config).eval()
    return gpt2, build(MiniTxModel if headless else MiniTxForCausalLM, False)


def bart_and_minitx(headless: bool):
    bart_config = BartConfig(vocab_size=64, d_model=32, encoder_layers=LAYERS, decoder_layers=LAYERS,
                             encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                             decoder_ffn_dim=64, max_position_embeddings=64)
    bart_config._attn_implementation = "eager"
    torch.manual_seed(0)
    bart = (BartModel if headless else BartForConditionalGeneration)(bart_config).eval()
    return bart, build(MiniTxModel if headless else MiniTxForConditionalGeneration, True)


@pytest.mark.parametrize("headless", [True, False], ids=["headless", "lm-head"])
@pytest.mark.parametrize("pair", [gpt2_and_minitx, bart_and_minitx], ids=["gpt2", "bart"])
def test_output_structure_matches_gpt2_and_bart(pair, headless):
    reference, ours = pair(headless)
    seq2seq = ours.config.is_encoder_decoder
    # BART turns the cache off when given labels: left to the defaults there, both sides must agree
    cache = {"use_cache": True} if headless or not seq2seq else {}
    batch = {**inputs(seq2seq, labels=not headless), **cache, "output_hidden_states": True, "output_attentions": True}
    ref_out, our_out = reference(**batch), ours(**batch)
    shared = [key for key in ref_out.keys() if key != "cross_attentions" or seq2seq]  # GPT-2 lists it, empty
    assert list(our_out.keys()) == shared
    for key in shared:
        assert layout(our_out[key]) == layout(ref_out[key]), key
    ref_tuple, our_tuple = reference(**batch, return_dict=False), ours(**batch, return_dict=False)
    ref_items = [item for item in ref_tuple if item != ()]  # GPT-2's empty cross_attentions
    assert [layout(item) for item in our_tuple] == [layout(item) for item in ref_items]


def test_a_seq2seq_decoder_runs_alone_with_the_shared_embedding():
    # as BART's get_decoder(): the decoder reads the encoder's token table, also when called by itself, and a
    # copy of the model embeds with its own table
    import copy

    model = build(MiniTxForConditionalGeneration, True)
    batch = inputs(True, labels=False)
    full = model(**batch, use_cache=False)
    alone = model.get_decoder()(input_ids=batch["decoder_input_ids"],
                                encoder_hidden_states=full.encoder_last_hidden_state,
                                encoder_attention_mask=batch["attention_mask"])
    torch.testing.assert_close(model.output_logits(alone.last_hidden_state, 0), full.logits)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.get_input_embeddings().weight.mul_(2)
    assert twin.model.decoder.embed.__self__ is twin.model.encoder
    assert not torch.allclose(twin(**batch, use_cache=False).logits, full.logits)
    torch.testing.assert_close(model(**batch, use_cache=False).logits, full.logits)
