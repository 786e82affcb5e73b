"""The architecture options: RMSNorm, ReLU² and SwiGLU, QK-norm, zero-initialised projections and untied head, a logit
soft cap. Each one's behaviour, its seam, its config errors, generation parity and the clean-environment round trip.
(Forward parity, eager == sdpa, padded == alone, cached == full, runs on them in test_modeling.py; the
common contracts in test_contracts.py.)"""

import json
import math
import textwrap

import pytest
import torch
from conftest import ALL_OPTIONS, random_ids, tiny_causal, tiny_config, tiny_seq2seq
from test_save_load import run_without_hf_minitx

from hf_minitx.models.configuration_minitx import HIDDEN_ACTS, NORM_TYPES, POSITION_KINDS
from hf_minitx.models.layers_minitx import ACTIVATIONS, NORMS, MiniTxMLP, MiniTxRMSNorm, relu_squared
from hf_minitx.models.positions_minitx import POSITION_ENCODINGS
from hf_minitx.training.model_presets import parse_config_overrides

KINDS = [("causal", tiny_causal), ("seq2seq", tiny_seq2seq)]
GREEDY = dict(do_sample=False, max_new_tokens=8, min_new_tokens=8)


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits of `ids` as the prompt (causal) or as source and decoder input (seq2seq)."""
    if model.config.is_encoder_decoder:
        return model(ids, decoder_input_ids=ids[:, :4]).logits
    return model(ids).logits


def test_each_registry_holds_exactly_the_configs_choices():
    assert set(NORMS) == set(NORM_TYPES)
    assert set(ACTIVATIONS) == set(HIDDEN_ACTS)
    assert set(POSITION_ENCODINGS) == set(POSITION_KINDS)
    # the kind the card and inference read agrees with the module the stack builds
    for name, kind in POSITION_KINDS.items():
        assert kind.table == (POSITION_ENCODINGS[name].attribute == "embed_positions"), name


def test_defaults_build_the_same_parameters_as_before():
    """The defaults add no parameter (no q_norm/k_norm/gate_proj) and keep LayerNorm, so old folders load as they
    were."""
    names = set(tiny_causal().state_dict())
    assert not {n for n in names if any(part in n for part in ("q_norm", "k_norm", "gate_proj"))}
    assert "lm_head.weight" in names and "model.decoder.norm.bias" in names


def test_config_without_the_new_fields_loads_with_the_old_behaviour(tmp_path):
    model = tiny_causal()
    model.save_pretrained(tmp_path)
    stored = json.loads((tmp_path / "config.json").read_text())
    for name in ("norm_type", "qk_norm", "zero_init_head", "zero_init_projections", "final_logit_softcap"):
        stored.pop(name)  # a folder written before these options existed
    (tmp_path / "config.json").write_text(json.dumps(stored))
    loaded = type(model).from_pretrained(tmp_path).eval()
    ids = random_ids(2, 7)
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert (loaded.config.norm_type, loaded.config.qk_norm, loaded.config.final_logit_softcap) == ("layernorm", False,
                                                                                                    None)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("norm_type", "batchnorm", "choose one of \\('layernorm', 'rmsnorm'\\)"),
    ("hidden_act", "silu", "choose one of \\('gelu', 'relu', 'relu2', 'swiglu'\\)"),
    ("position_embedding_type", "alibi", "choose one of \\('sinusoidal', 'learned', 'rope'\\)"),
    ("qk_norm", "yes", "qk_norm must be True or False"),
    ("final_logit_softcap", 0.0, "final_logit_softcap must be None"),
    ("final_logit_softcap", float("inf"), "final_logit_softcap must be None"),
    ("final_logit_softcap", "30", "final_logit_softcap must be None"),
])
def test_unknown_or_bad_choices_are_refused_naming_the_valid_ones(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{field: value})


def test_zero_init_head_needs_an_untied_head():
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        tiny_config(zero_init_head=True)


def test_the_options_come_through_config_overrides():
    overrides = parse_config_overrides("norm_type=rmsnorm,hidden_act=relu2,qk_norm=true,tie_word_embeddings=false,"
                                       "zero_init_head=yes,final_logit_softcap=30")
    config = tiny_config(**overrides)
    assert (config.norm_type, config.hidden_act, config.qk_norm, config.zero_init_head) == ("rmsnorm", "relu2", True,
                                                                                            True)
    assert config.final_logit_softcap == 30.0
    assert parse_config_overrides("final_logit_softcap=none") == {"final_logit_softcap": None}


def test_rmsnorm_gives_unit_rms_without_subtracting_the_mean_or_a_bias():
    norm = MiniTxRMSNorm(8, eps=1e-6)
    assert [name for name, _ in norm.named_parameters()] == ["weight"]
    x = torch.randn(3, 8) + 5.0  # a large mean: LayerNorm would remove it
    out = norm(x)
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(3), atol=1e-4, rtol=1e-4)
    assert (out.mean(-1) > 0.8).all()  # the mean is kept (scaled), not subtracted
    torch.testing.assert_close(out, x / x.pow(2).mean(-1, keepdim=True).sqrt(), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        norm.weight.fill_(2.0)
    torch.testing.assert_close(norm(x), 2 * out)
    half = norm(x.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16


def test_rmsnorm_written_out_gradient_equals_autograds():
    from hf_minitx.models.layers_minitx import RMSNormFunction

    def composite(x, weight, eps=1e-6):  # the formula, differentiated by autograd
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    x = (torch.randn(2, 3, 5, dtype=torch.float64) + 1.0).requires_grad_()
    weight = torch.rand(5, dtype=torch.float64).add_(0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, w: RMSNormFunction.apply(a, w, 1e-6)[0], (x, weight))
    grad = torch.randn(2, 3, 5, dtype=torch.float64)
    expected = torch.autograd.grad(composite(x, weight), (x, weight), grad)
    got = torch.autograd.grad(RMSNormFunction.apply(x, weight, 1e-6)[0], (x, weight), grad)
    for a, b in zip(expected, got, strict=True):
        torch.testing.assert_close(a, b)
    # the module takes the function only with gradients; both paths give the same values and dtypes
    norm = MiniTxRMSNorm(5, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(weight.float())
    inputs = x.detach().float().requires_grad_()
    trained = norm(inputs)
    trained.sum().backward()
    assert inputs.grad is not None and norm.weight.grad is not None
    with torch.no_grad():
        torch.testing.assert_close(norm(inputs), trained)
    half = x.detach().to(torch.bfloat16).requires_grad_()
    norm(half).sum().backward()
    assert half.grad.dtype == torch.bfloat16 and norm.weight.grad.dtype == torch.float32
    # torch.func works through it; a second derivative raises rather than being silently wrong
    double = MiniTxRMSNorm(5, eps=1e-6).double()
    func_grad = torch.func.grad(lambda a: double(a).pow(3).sum())(x.detach())
    torch.testing.assert_close(func_grad, torch.autograd.grad(composite(x, double.weight).pow(3).sum(), x)[0])
    first, = torch.autograd.grad(double(x).pow(3).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        first.sum().backward()
    norm.weight.requires_grad_(False)  # frozen weight (e.g. PEFT): no weight gradient is computed
    frozen = x.detach().float().requires_grad_()
    norm(frozen).sum().backward()
    assert frozen.grad is not None and norm.weight.grad.dtype == torch.float32


@pytest.mark.parametrize(("kind", "make"), KINDS)
def test_rmsnorm_replaces_every_layernorm(kind, make):
    model = make(norm_type="rmsnorm", qk_norm=True)
    modules = list(model.modules())
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in modules)
    seq2seq = kind == "seq2seq"
    encoder, decoder = (model.config.num_encoder_layers if seq2seq else 0), model.config.num_decoder_layers or 2
    sublayer_norms = 2 * encoder + (3 if seq2seq else 2) * decoder  # attention, (cross-attention,) mlp
    stack_norms = 2 if seq2seq else 1  # pre-LN: one at the end of each stack
    attentions = encoder + (2 if seq2seq else 1) * decoder  # each with a q_norm and a k_norm
    assert sum(isinstance(m, MiniTxRMSNorm) for m in modules) == sublayer_norms + stack_norms + 2 * attentions


def test_relu2_is_relu_squared_in_the_feed_forward():
    x = torch.linspace(-2, 2, 9)
    torch.testing.assert_close(relu_squared(x), torch.relu(x) ** 2)
    assert relu_squared(torch.tensor([-3.0])).item() == 0.0 and relu_squared(torch.tensor([3.0])).item() == 9.0
    torch.manual_seed(0)
    mlp = MiniTxMLP(tiny_config(hidden_act="relu2"))
    h = torch.randn(2, 3, 32)
    torch.testing.assert_close(mlp(h), mlp.fc2(torch.relu(mlp.fc1(h)) ** 2))
    assert not hasattr(mlp, "gate_proj")


def test_swiglu_gates_the_feed_forward_with_its_own_matrix():
    torch.manual_seed(0)
    mlp = MiniTxMLP(tiny_config(hidden_act="swiglu", intermediate_size=48))
    assert mlp.gate_proj.weight.shape == mlp.fc1.weight.shape == (48, 32)
    assert mlp.fc2.weight.shape == (32, 48)
    h = torch.randn(2, 3, 32)
    torch.testing.assert_close(mlp(h), mlp.fc2(torch.nn.functional.silu(mlp.gate_proj(h)) * mlp.fc1(h)))
    with torch.no_grad():
        mlp.gate_proj.weight.zero_()
        mlp.gate_proj.bias.zero_()
    torch.testing.assert_close(mlp(h), mlp.fc2.bias.expand(2, 3, 32))  # silu(0) = 0 closes the gate


@pytest.mark.parametrize(("kind", "make"), KINDS)
def test_qk_norm_normalises_each_heads_queries_and_keys_and_changes_the_output(kind, make):
    on = make(qk_norm=True, norm_type="rmsnorm")
    with torch.no_grad():  # queries and keys well above the norm's eps, so their RMS comes out 1 to 1e-4
        for name, param in on.named_parameters():
            if "q_proj" in name or "k_proj" in name:
                param.mul_(10.0)
    off = make(norm_type="rmsnorm")
    missing, unexpected = off.load_state_dict(on.state_dict(), strict=False)[:2]
    assert not missing and unexpected and all("q_norm" in n or "k_norm" in n for n in unexpected)
    seen = []
    for module in on.modules():
        if hasattr(module, "q_norm"):
            assert module.q_norm.weight.shape == (on.config.head_dim,)
            for norm in (module.q_norm, module.k_norm):
                norm.register_forward_hook(lambda m, args, out: seen.append(out))
    ids = random_ids(2, 6)
    with_norm = logits_of(on, ids)
    attentions = on.config.num_hidden_layers * (3 if kind == "seq2seq" else 1)  # + encoder layers + cross
    assert len(seen) == 2 * attentions
    for out in seen:  # (batch, seq, heads, head_dim): unit RMS per head
        torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(out.shape[:-1]), atol=1e-3, rtol=1e-3)
    assert not torch.allclose(with_norm, logits_of(off, ids), atol=1e-4)


@pytest.mark.parametrize(("kind", "make"), KINDS)
def test_zero_init_head_starts_uniform_and_learns(kind, make):
    model = make(tie_word_embeddings=False, zero_init_head=True)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert model.get_input_embeddings().weight.abs().sum() > 0  # the embeddings keep their random start
    ids = random_ids(2, 6)
    labels = ids[:, :4] if kind == "seq2seq" else ids  # a non-contiguous slice, as users pass them
    out = model(ids, labels=labels)
    assert torch.equal(out.logits, torch.zeros_like(out.logits))
    assert math.isclose(out.loss.item(), math.log(model.config.vocab_size), rel_tol=1e-6)
    out.loss.backward()
    assert model.lm_head.weight.grad.abs().sum() > 0


@pytest.mark.parametrize(("kind", "make"), KINDS)
def test_zero_init_projections_start_every_block_as_the_identity(kind, make):
    model = make(zero_init_projections=True, hidden_act="swiglu")
    outputs = [m for m in model.modules() if getattr(m, "residual_output", False)]
    attentions = sum(hasattr(m, "o_proj") for m in model.modules())
    assert len(outputs) == attentions + model.config.num_hidden_layers * (2 if kind == "seq2seq" else 1)
    assert all(torch.equal(m.weight, torch.zeros_like(m.weight)) for m in outputs)
    assert all(m.bias is None or not m.bias.any() for m in outputs)
    assert model.model.decoder.layers[0].mlp.fc1.weight.abs().sum() > 0  # the inputs stay random
    ids = random_ids(2, 6)
    states = (model(ids, output_hidden_states=True).hidden_states if kind == "causal"
              else model(ids, decoder_input_ids=ids, output_hidden_states=True).encoder_hidden_states)
    for layer_output in states[1:-1]:  # unchanged by every block (the last one also passes the final norm)
        torch.testing.assert_close(layer_output, states[0])
    out = model(ids, labels=ids[:, :4] if kind == "seq2seq" else ids)
    out.loss.backward()
    decoder = [m for m in model.model.decoder.modules() if getattr(m, "residual_output", False)]
    # the decoder's learn from the first step (an encoder waits one step: the cross-attention output is zero)
    assert decoder and all(m.weight.grad.abs().sum() > 0 for m in decoder)


@pytest.mark.parametrize(("kind", "make"), KINDS)
def test_softcap_bounds_the_logits_by_the_cap(kind, make):
    model = make(tie_word_embeddings=False, final_logit_softcap=2.0)
    with torch.no_grad():
        model.lm_head.weight.mul_(500.0)  # raw logits far beyond the cap
    raw = {}
    model.lm_head.register_forward_hook(lambda m, args, out: raw.setdefault("logits", out))
    logits = logits_of(model, random_ids(2, 6))
    assert raw["logits"].abs().max() > 10
    assert logits.abs().max() <= 2.0  # tanh reaches ±1 only by rounding
    torch.testing.assert_close(logits, 2.0 * torch.tanh(raw["logits"] / 2.0))
    small = raw["logits"].abs() < 0.05
    torch.testing.assert_close(logits[small], raw["logits"][small], atol=1e-4, rtol=1e-3)  # near 0: unchanged


@pytest.mark.parametrize("options", [ALL_OPTIONS,
                                     dict(ALL_OPTIONS, hidden_act="relu2", position_embedding_type="rope")],
                         ids=["swiglu-learned", "relu2-rope"])
def test_cached_and_uncached_generation_agree_with_every_option(options):
    for model in (tiny_causal(**options), tiny_seq2seq(**options)):
        ids = random_ids(2, 6)
        assert torch.equal(model.generate(ids, use_cache=True, **GREEDY),
                           model.generate(ids, use_cache=False, **GREEDY))


def test_left_padded_generation_equals_each_prompt_alone_with_every_option():
    model = tiny_causal(**ALL_OPTIONS, position_embedding_type="rope")
    prompts = [random_ids(1, 3, seed=1), random_ids(1, 7, seed=2)]
    batch = torch.cat([torch.cat([torch.zeros(1, 7 - p.size(1), dtype=torch.long), p], 1) for p in prompts])
    mask = (torch.arange(7)[None] >= torch.tensor([[4], [0]])).long()
    out = model.generate(batch, attention_mask=mask, **GREEDY)
    for row, prompt in enumerate(prompts):
        assert torch.equal(out[row, 7:], model.generate(prompt, **GREEDY)[0, prompt.size(1):])


def test_padded_seq2seq_sources_generate_what_each_generates_alone_with_every_option():
    model = tiny_seq2seq(**ALL_OPTIONS)
    sources = [random_ids(1, 4, seed=3), random_ids(1, 8, seed=4)]
    batch = torch.cat([torch.cat([s, torch.zeros(1, 8 - s.size(1), dtype=torch.long)], 1) for s in sources])
    mask = (torch.arange(8)[None] < torch.tensor([[4], [8]])).long()
    out = model.generate(batch, attention_mask=mask, **GREEDY)
    for row, source in enumerate(sources):
        assert torch.equal(out[row], model.generate(source, **GREEDY)[0])


ROUND_TRIP_OPTIONS = {
    "rmsnorm": dict(norm_type="rmsnorm"),
    "rmsnorm-post": dict(norm_type="rmsnorm", norm_position="post"),
    "swiglu": dict(hidden_act="swiglu"),
    "relu2": dict(hidden_act="relu2"),
    "qk-norm": dict(qk_norm=True),
    "zero-head": dict(tie_word_embeddings=False, zero_init_head=True),
    "softcap": dict(final_logit_softcap=0.5),
    "zero-projections": dict(zero_init_projections=True),
    "all": dict(ALL_OPTIONS, zero_init_head=True, zero_init_projections=True, position_embedding_type="rope"),
}

CLEAN_LOGITS_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_minitx"] = None  # only the folders' own code may be used
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    ids = torch.tensor(json.loads(sys.argv[1]))
    logits = {}
    for folder in sys.argv[2:]:
        seq2seq = folder.endswith("seq2seq")
        auto = AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM
        model = auto.from_pretrained(folder, trust_remote_code=True).eval()
        assert "hf_minitx" not in type(model).__module__, type(model).__module__
        with torch.no_grad():
            out = model(ids, decoder_input_ids=ids[:, :4]) if seq2seq else model(ids)
        logits[folder] = out.logits.tolist()
    print(json.dumps(logits))
    """
)


@pytest.mark.slow
def test_every_option_round_trips_through_remote_code_with_identical_logits(tmp_path):
    ids = random_ids(2, 6)
    expected = {}
    for name, options in ROUND_TRIP_OPTIONS.items():
        for kind, make in KINDS:
            model = make(**options)
            with torch.no_grad():  # as after training: a weight left at its zero start would hide one not loaded
                for param in model.parameters():
                    param.add_(0.1 * torch.randn_like(param))
            folder = tmp_path / f"{name}-{kind}"
            model.save_pretrained(folder)
            with torch.no_grad():
                expected[str(folder)] = logits_of(model, ids)
    report = run_without_hf_minitx(CLEAN_LOGITS_SCRIPT, [json.dumps(ids.tolist()), *expected], tmp_path)
    assert report.keys() == expected.keys()
    for folder, logits in expected.items():
        assert torch.equal(torch.tensor(report[folder]), logits), folder


def test_card_describes_the_options():
    from hf_minitx.hub.card import _architecture_rows

    config = tiny_config(**ALL_OPTIONS, zero_init_head=True, position_embedding_type="rope").to_dict()
    rows = dict(_architecture_rows(config, "causal-lm", 1000))
    assert rows["Normalisation"].startswith("pre-RMSNorm") and "QK-norm" in rows["Normalisation"]
    assert "swiglu" in rows["Feed-forward size"] and rows["Positions"].startswith("rotary")
    assert rows["Output head"] == "untied, zero at the start of training, logits soft-capped: 0.5·tanh(logits/0.5)"
    plain = dict(_architecture_rows(tiny_config().to_dict(), "causal-lm", 1000))
    assert plain["Normalisation"].startswith("pre-LayerNorm") and "QK" not in plain["Normalisation"]
    assert plain["Output head"] == "tied to the token embeddings"
