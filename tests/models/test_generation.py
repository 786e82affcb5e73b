"""generate() through transformers: cache parity, padding, beams, sampling, EOS, streaming, static cache."""

import pytest
import torch
from conftest import random_ids, tiny_causal, tiny_seq2seq
from transformers import TextStreamer

GREEDY = dict(do_sample=False, max_new_tokens=12, min_new_tokens=12)


@pytest.mark.parametrize("pe", ["learned", "sinusoidal", "rope"])
def test_cached_and_uncached_greedy_give_identical_tokens(pe):
    for model in (tiny_causal(position_embedding_type=pe), tiny_seq2seq(position_embedding_type=pe)):
        ids = random_ids(2, 6)
        cached = model.generate(ids, use_cache=True, **GREEDY)
        uncached = model.generate(ids, use_cache=False, **GREEDY)
        assert torch.equal(cached, uncached)


@pytest.mark.parametrize("pe", ["learned", "rope"])
def test_left_padded_batch_generates_what_each_prompt_generates_alone(pe):
    model = tiny_causal(position_embedding_type=pe)
    prompts = [random_ids(1, 3, seed=1), random_ids(1, 7, seed=2)]
    width = 7
    batch = torch.cat([torch.cat([torch.zeros(1, width - p.size(1), dtype=torch.long), p], 1) for p in prompts])
    mask = torch.cat([torch.cat([torch.zeros(1, width - p.size(1)), torch.ones(1, p.size(1))], 1) for p in prompts])
    out = model.generate(batch, attention_mask=mask.long(), **GREEDY)
    for row, prompt in enumerate(prompts):
        alone = model.generate(prompt, **GREEDY)
        assert torch.equal(out[row, width:], alone[0, prompt.size(1):])


def test_seq2seq_padded_batch_generates_what_each_source_generates_alone():
    model = tiny_seq2seq()
    sources = [random_ids(1, 4, seed=3), random_ids(1, 8, seed=4)]
    batch = torch.cat([torch.cat([s, torch.zeros(1, 8 - s.size(1), dtype=torch.long)], 1) for s in sources])
    mask = (batch != 0).long()
    mask[1] = 1
    out = model.generate(batch, attention_mask=mask, **GREEDY)
    for row, source in enumerate(sources):
        assert torch.equal(out[row], model.generate(source, **GREEDY)[0])


def test_one_beam_equals_greedy_and_beams_score_at_least_as_well():
    for model in (tiny_causal(), tiny_seq2seq()):
        ids = random_ids(2, 5)
        greedy = model.generate(ids, **GREEDY)
        assert torch.equal(model.generate(ids, num_beams=1, **GREEDY), greedy)
        beams = model.generate(ids, num_beams=4, early_stopping=True, **GREEDY)
        assert beams.shape == greedy.shape


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy():
    model = tiny_causal()
    ids = random_ids(1, 5)

    def log_prob(sequence):
        logits = model(sequence).logits[0, ids.size(1) - 1 : -1].log_softmax(-1)
        return logits.gather(-1, sequence[0, ids.size(1):, None]).sum()

    greedy = model.generate(ids, do_sample=False, max_new_tokens=6, min_new_tokens=6)
    beams = model.generate(ids, do_sample=False, num_beams=5, max_new_tokens=6, min_new_tokens=6, length_penalty=0.0)
    assert log_prob(beams) >= log_prob(greedy) - 1e-4


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = tiny_causal()
    ids = random_ids(1, 4)
    torch.manual_seed(1)
    a = model.generate(ids, do_sample=True, temperature=0.9, top_p=0.9, top_k=20, max_new_tokens=10)
    torch.manual_seed(1)
    b = model.generate(ids, do_sample=True, temperature=0.9, top_p=0.9, top_k=20, max_new_tokens=10)
    assert torch.equal(a, b)
    top1 = model.generate(ids, do_sample=True, top_k=1, max_new_tokens=10, min_new_tokens=10)
    assert torch.equal(top1, model.generate(ids, do_sample=False, max_new_tokens=10, min_new_tokens=10))


def test_generation_stops_at_eos():
    model = tiny_causal()
    ids = random_ids(1, 4)
    free = model.generate(ids, do_sample=False, max_new_tokens=8, min_new_tokens=8)
    eos = int(free[0, 6])  # make the third generated token the end-of-sequence token
    stopped = model.generate(ids, do_sample=False, max_new_tokens=8, eos_token_id=eos, pad_token_id=0)
    assert stopped.size(1) <= 7 and int(stopped[0, -1]) == eos


def test_text_streamer_receives_the_generated_tokens():
    class Recorder:
        def __init__(self):
            self.tokens = []

        def decode(self, ids, **kwargs):
            self.tokens.extend(int(i) for i in ids)
            return " ".join(str(int(i)) for i in ids)

    model = tiny_causal()
    ids = random_ids(1, 4)
    recorder = Recorder()
    streamer = TextStreamer(recorder)
    out = model.generate(ids, streamer=streamer, **GREEDY)
    assert recorder.tokens[-12:] == out[0, 4:].tolist()


def test_static_cache_matches_dynamic_cache():
    model = tiny_causal()
    ids = random_ids(2, 5)
    dynamic = model.generate(ids, **GREEDY)
    static = model.generate(ids, cache_implementation="static", **GREEDY)
    assert torch.equal(static, dynamic)


@pytest.mark.parametrize("pe", ["learned", "sinusoidal"])
@pytest.mark.parametrize("seq2seq", [False, True], ids=["causal", "seq2seq"])
def test_too_many_new_tokens_are_refused_before_the_first_forward(pe, seq2seq):
    model = (tiny_seq2seq if seq2seq else tiny_causal)(position_embedding_type=pe, max_position_embeddings=16)
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    ids = random_ids(2, 5)
    used = 1 if seq2seq else 5  # the decoder start token, or the prompt
    fit = 17 - used  # the last new token is never fed back, so it needs no position of its own
    with pytest.raises(ValueError, match=rf"generate\(max_new_tokens=40\) does not fit: the model has "
                                         rf"max_position_embeddings=16 .* {used}, so at most {fit} new tokens "
                                         rf"fit; pass max_new_tokens={fit} or less"):
        model.generate(ids, do_sample=False, max_new_tokens=40)
    with pytest.raises(ValueError, match=r"generate\(max_length=18\) .* pass max_length=17 or less"):
        model.generate(ids, do_sample=False, max_length=18)
    assert calls == []  # refused before any work
    out = model.generate(ids, do_sample=False, max_new_tokens=fit, min_new_tokens=fit)
    assert out.shape[1] == 17  # the largest that fits: every position of the table is fed, then one more token


def test_a_prompt_that_fills_the_table_is_told_to_shorten():
    model = tiny_causal(max_position_embeddings=16)
    assert model.generate(random_ids(1, 16), do_sample=False, max_new_tokens=1).shape == (1, 17)  # one still fits
    with pytest.raises(ValueError, match="at most 0 new tokens fit; shorten the prompt"):
        model.generate(random_ids(1, 17), do_sample=False, max_new_tokens=1)


def test_rotary_positions_have_no_generation_limit():
    model = tiny_causal(position_embedding_type="rope", max_position_embeddings=16)
    out = model.generate(random_ids(1, 5), do_sample=False, max_new_tokens=20, min_new_tokens=20)
    assert out.shape == (1, 25)


@pytest.mark.parametrize("seq2seq", [False, True])
def test_an_asked_max_length_bounds_the_call_over_a_saved_max_new_tokens(seq2seq, monkeypatch):
    # `minitx train` saves max_new_tokens in generation_config.json; a caller's max_length (Seq2SeqTrainer's
    # generation_max_length, a pipeline's) bounds the call as it would a stock model's
    model = (tiny_seq2seq() if seq2seq else tiny_causal()).eval()
    model.generation_config.max_new_tokens, model.generation_config.max_length = 30, None
    model.generation_config.suppress_tokens = [model.config.eos_token_id]  # nothing stops early
    ids = random_ids(1, 4)
    start = 0 if seq2seq else ids.shape[1]
    assert model.generate(ids, do_sample=False, max_length=9).shape[1] == 9
    assert model.generate(ids, do_sample=False).shape[1] == start + 30 + (1 if seq2seq else 0)
    assert model.generate(ids, do_sample=False, max_length=9, max_new_tokens=5).shape[1] == start + 5 + seq2seq
    import transformers.generation.utils
    from transformers import GenerationConfig  # a config of the caller's that asks a length: the same

    warned = []  # a config passed alone is no "generation_config together with generation arguments"
    monkeypatch.setattr(transformers.generation.utils.logger, "warning_once", lambda *a, **k: warned.append(a))
    assert model.generate(ids, generation_config=GenerationConfig(max_length=9, do_sample=False)).shape[1] == 9
    assert not warned and model.generation_config.max_new_tokens == 30  # the saved one is back after the call
    asked = GenerationConfig(max_new_tokens=3, do_sample=False)
    assert model.generate(ids, generation_config=asked).shape[1] == start + 3 + seq2seq
