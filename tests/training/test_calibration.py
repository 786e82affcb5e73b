"""Temperature calibration at the end of a run (hf_minitx/training/calibration.py): the search, the fit, the fold."""

import pytest
import torch
from accelerate import Accelerator
from conftest import random_ids, tiny_causal

from hf_minitx.training.calibration import cached_logits, calibrate, golden_section
from hf_minitx.training.loss import Objective, sequence_cross_entropy


def test_golden_section_finds_the_minimum_or_the_end_of_the_bracket():
    assert golden_section(lambda x: (x - 0.3) ** 2, -1.0, 1.0, 30) == pytest.approx(0.3, abs=1e-4)
    assert golden_section(lambda x: abs(x + 0.71), -1.0, 1.0, 30) == pytest.approx(-0.71, abs=1e-4)
    assert golden_section(lambda x: x, -1.0, 1.0, 30) == pytest.approx(-1.0, abs=1e-3)
    assert golden_section(lambda x: -x, -1.0, 1.0, 30) == pytest.approx(1.0, abs=1e-3)


def sampled_text(model, temperature: float) -> list[dict[str, torch.Tensor]]:
    """Batches of text the model itself wrote, each token drawn from softmax(logits / temperature)."""
    torch.manual_seed(1)
    ids = model.generate(input_ids=random_ids(96, 1), do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                         max_new_tokens=40, min_new_tokens=40)  # (96, 41)
    return [{"input_ids": ids[i:i + 8], "labels": ids[i:i + 8]} for i in range(0, len(ids), 8)]


def model_nats(model, loader) -> tuple[float, int]:
    with torch.no_grad():
        rows = [sequence_cross_entropy(model(input_ids=b["input_ids"]).logits, b["labels"], shift=True)
                for b in loader]
    return sum(n.sum().item() for n, _ in rows), sum(c.sum().item() for _, c in rows)


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.6])
def test_calibration_finds_the_temperature_the_text_was_sampled_at_and_folds_it(temperature):
    """Text sampled from the model at temperature T is best predicted by the model at T: the fit recovers T,
    and the saved weights give the loss the fit reported."""
    model = tiny_causal()
    model.scale_output_logits(4.0)  # a random model's logits are nearly flat: give them a spread to calibrate
    loader = sampled_text(model, temperature)
    before = model_nats(model, loader)
    record = calibrate(model, loader, Objective(shift=True), Accelerator(cpu=True))
    assert record["temperature"] == pytest.approx(temperature, rel=0.08)
    assert record["fitted_on_tokens"] == before[1] == 96 * 40
    assert record["fitted_loss_before"] == pytest.approx(before[0] / before[1], rel=1e-6)
    after = model_nats(model, loader)
    assert after[0] / after[1] == pytest.approx(record["fitted_loss_after"], rel=1e-5)
    if temperature != 1.0:
        assert record["fitted_loss_after"] < record["fitted_loss_before"] * 0.999
    assert not model.training  # left as it was found


def test_a_fit_that_gains_less_than_min_gain_leaves_the_weights_alone(monkeypatch):
    from hf_minitx.training import calibration

    model = tiny_causal()
    model.scale_output_logits(4.0)
    loader = sampled_text(model, 1.3)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(calibration, "MIN_GAIN", 0.5)  # more than any temperature can give
    record = calibrate(model, loader, Objective(shift=True), Accelerator(cpu=True))
    assert (record["logit_scale"], record["fitted_loss_after"]) == (1.0, record["fitted_loss_before"])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in weights.items())
    monkeypatch.setattr(calibration, "MIN_GAIN", 0.0)
    calibrate(model, loader, Objective(shift=True), Accelerator(cpu=True))
    changed = [k for k, v in weights.items() if not torch.equal(v, model.state_dict()[k])]
    assert changed == ["model.decoder.norm.weight"]  # the fold touches the final norm alone


def test_the_cache_holds_the_first_batches_that_fit_and_at_least_one():
    model = tiny_causal()
    loader = [{"input_ids": random_ids(4, 8, seed=i), "labels": random_ids(4, 8, seed=i)} for i in range(5)]
    accelerator = Accelerator(cpu=True)
    assert len(cached_logits(model, loader, Objective(shift=True), accelerator, max_elements=1)) == 1
    two = cached_logits(model, loader, Objective(shift=True), accelerator, max_elements=2 * 4 * 8 * 64 + 100)
    assert len(two) == 2 and two[0][0].shape == (4, 8, 64)
    assert torch.equal(two[1][1], loader[1]["labels"])
    assert not model.lm_head._forward_hooks  # the hook is gone


def test_the_fit_reads_clean_inputs_whatever_the_training_noise():
    """--input_noise replaces input tokens in training; the temperature is fitted on the text as inference reads it
    (noisy contexts would ask for a higher one, and draw from the random generator a resume must not depend on)."""
    model = tiny_causal()
    model.scale_output_logits(4.0)
    loader = sampled_text(model, 1.3)
    clean = calibrate(model, loader, Objective(shift=True), Accelerator(cpu=True))
    model.scale_output_logits(1.0 / clean["logit_scale"])  # back to the weights before the fit
    torch.manual_seed(5)
    noisy = calibrate(model, loader, Objective(shift=True, input_noise=0.5), Accelerator(cpu=True))
    assert noisy["temperature"] == clean["temperature"]
    assert noisy["fitted_loss_before"] == pytest.approx(clean["fitted_loss_before"], rel=1e-6)
