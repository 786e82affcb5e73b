"""Distillation (``--distill_from``): the step's loss is CE + alpha * T^2 * KL to a frozen teacher, a teacher equal
to the student adds nothing, a distilled run records its teacher and resumes exactly, and a teacher that cannot
serve is refused before anything is written."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from conftest import assert_same_weights, tiny_config
from test_train import (  # noqa: F401  (fixtures)
    _fresh_accelerate_state,
    causal_args,
    records,
    resume_from_copy,
    text_file,
)
from transformers import AutoModelForCausalLM

from hf_minitx import MiniTxForCausalLM
from hf_minitx.data.tokenizer import train_bpe_tokenizer
from hf_minitx.hub.card import render_model_card
from hf_minitx.models.configuration_minitx import IGNORE_INDEX
from hf_minitx.training.distill import Distillation
from hf_minitx.training.loop import main, train_step
from hf_minitx.training.loss import Objective, summed_kl_divergence
from hf_minitx.training.state import LoopSettings, RunState, TrainingRun


def student_and_teacher() -> tuple[MiniTxForCausalLM, MiniTxForCausalLM]:
    torch.manual_seed(0)
    student = MiniTxForCausalLM(tiny_config())
    torch.manual_seed(1)
    teacher = MiniTxForCausalLM(tiny_config()).eval().requires_grad_(False)
    teacher.get_output_embeddings().weight.mul_(30)  # sharper than the student's near-uniform start
    return student, teacher


def a_batch() -> dict[str, torch.Tensor]:
    input_ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(2))
    labels = input_ids.clone()
    labels[2, 8:] = IGNORE_INDEX  # a padded row
    return {"input_ids": input_ids, "attention_mask": (labels != IGNORE_INDEX).long(), "labels": labels}


def one_step(student: torch.nn.Module, distillation: Distillation | None, batch: dict[str, torch.Tensor]) -> float:
    """The loss train_step reports for one window of one micro-batch."""
    accelerator = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(student, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    run = TrainingRun(accelerator, model, optimizer, scheduler, iter(()), Objective(shift=True), None,
                      LoopSettings(total_steps=1, batches_per_epoch=1), None, distillation=distillation)
    label_tokens = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    loss, _ = train_step(run, RunState(), [batch], label_tokens)
    return loss


def expected_loss(student, teacher, batch, alpha: float, temperature: float) -> float:
    """CE + alpha * T^2 * KL(teacher_T || student_T) per labelled token, written out here from the definitions."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        s, t = student(**inputs).logits[:, :-1].double(), teacher(**inputs).logits[:, :-1].double()
    targets = batch["labels"][:, 1:]
    keep = targets != IGNORE_INDEX
    ce = torch.nn.functional.cross_entropy(s[keep], targets[keep], reduction="sum")
    p_t, log_p_s = torch.softmax(t[keep] / temperature, -1), torch.log_softmax(s[keep] / temperature, -1)
    kl = (p_t * (p_t.log() - log_p_s)).sum()
    return float((ce + alpha * temperature ** 2 * kl) / keep.sum())


@pytest.mark.parametrize("alpha", [0.45, 0.0])
def test_the_step_loss_is_the_cross_entropy_plus_the_weighted_kl_to_the_teacher(alpha):
    student, teacher = student_and_teacher()
    batch, temperature = a_batch(), 1.7
    expected = expected_loss(copy.deepcopy(student), teacher, batch, alpha, temperature)
    plain = expected_loss(copy.deepcopy(student), teacher, batch, 0.0, temperature)
    loss = one_step(student, Distillation(teacher, alpha, temperature), batch)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert (loss > plain + 0.1) if alpha else loss == pytest.approx(plain, rel=1e-5)


def test_a_teacher_equal_to_the_student_adds_no_kl():
    student, _ = student_and_teacher()
    batch = a_batch()
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    with torch.no_grad():
        logits = student(**inputs).logits
        other = logits + torch.randn_like(logits)
    assert summed_kl_divergence(logits, logits, batch["labels"], shift=True, temperature=1.2).item() == \
        pytest.approx(0.0, abs=1e-6)
    assert summed_kl_divergence(logits, other, batch["labels"], shift=True, temperature=1.2).item() > 0.1
    distillation = Distillation(copy.deepcopy(student).eval(), 0.45, 1.2)
    assert distillation.summed_loss(inputs, logits, batch["labels"], shift=True).item() == pytest.approx(0, abs=1e-6)


@pytest.fixture(scope="module")
def teacher_folder(text_file, tmp_path_factory) -> Path:  # noqa: F811
    """A finished tiny causal run: the teacher (its folder holds its tokenizer)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    out = tmp_path_factory.mktemp("teacher") / "teacher"
    main(causal_args(text_file, out, "--max_steps", "8", "--learning_rate", "1e-2"))
    return out


def distilled_args(corpus: Path, teacher: Path, output_dir: Path, *extra: str) -> list[str]:
    return causal_args(corpus, output_dir, "--tokenizer", str(teacher), "--distill_from", str(teacher), *extra)


@pytest.mark.slow
def test_a_distilled_run_loads_and_records_its_teacher(text_file, teacher_folder, tmp_path):  # noqa: F811
    from hf_minitx.folders import weights_digest

    out = tmp_path / "student"
    main(distilled_args(text_file, teacher_folder, out, "--max_steps", "3"))
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    assert isinstance(model, MiniTxForCausalLM)
    recorded = json.loads((out / "training_summary.json").read_text())["distilled_from"]
    assert recorded == {"path": str(teacher_folder.resolve()), "weights_digest": weights_digest(teacher_folder),
                        "weight": 0.45, "temperature": 1.2}
    assert f"Distilled from | `{teacher_folder.resolve()}`" in render_model_card(out)


@pytest.mark.slow
def test_a_distilled_run_resumes_to_the_weights_of_a_straight_run(text_file, teacher_folder, tmp_path):  # noqa: F811
    from accelerate.state import AcceleratorState, GradientState

    extra = ("--max_steps", "4", "--checkpointing_steps", "2", "--distill_weight", "0.7")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    main(distilled_args(text_file, teacher_folder, straight, *extra))
    resume_from_copy(straight, resumed)
    main(distilled_args(text_file, teacher_folder, resumed, *extra, "--resume_from_checkpoint", "latest"))
    assert_same_weights(straight, resumed)
    assert [r["loss"] for r in records(straight, "train")] == [r["loss"] for r in records(resumed, "train")]

    other = tmp_path / "other-teacher"  # the same folder with changed weights: refused, nothing written
    shutil.copytree(teacher_folder, other)
    (other / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    before = sorted(p.name for p in resumed.iterdir())
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    with pytest.raises(ValueError, match="another configuration.*distillation.weights_digest"):
        main(causal_args(text_file, resumed, "--tokenizer", str(teacher_folder), "--distill_from", str(other),
                         *extra, "--max_steps", "6", "--resume_from_checkpoint", "latest"))
    assert sorted(p.name for p in resumed.iterdir()) == before


def test_a_missing_teacher_or_one_of_another_vocabulary_is_refused_before_any_write(
        text_file, teacher_folder, tmp_path):  # noqa: F811
    out = tmp_path / "student"
    with pytest.raises(ValueError, match="--distill_from .*nowhere does not exist"):
        main(causal_args(text_file, out, "--distill_from", str(tmp_path / "nowhere"), "--max_steps", "1"))
    with pytest.raises(ValueError, match="--distill_from .* is a file, not a folder"):
        main(causal_args(text_file, out, "--distill_from", str(text_file), "--max_steps", "1"))
    assert not out.exists()
    other = tmp_path / "other-tokenizer"
    train_bpe_tokenizer(iter(text_file.read_text().split("\n\n")), 280).save_pretrained(other)
    with pytest.raises(ValueError, match="uses another vocabulary .*--tokenizer"):
        main(causal_args(text_file, out, "--tokenizer", str(other), "--distill_from", str(teacher_folder),
                         "--max_steps", "1"))
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-tokenizer"]


@pytest.mark.parametrize("flag, value, message", [("--distill_weight", "-0.1", "must be >= 0"),
                                                  ("--distill_temperature", "0", "must be > 0")])
def test_out_of_range_weights_and_temperatures_are_refused(text_file, teacher_folder, tmp_path, flag, value,  # noqa: F811
                                                           message):
    with pytest.raises(ValueError, match=f"{flag} {message}"):
        main(distilled_args(text_file, teacher_folder, tmp_path / "x", flag, value, "--max_steps", "1"))
    assert not (tmp_path / "x").exists()


def test_seq2seq_distils_over_the_target_positions_the_cross_entropy_scores():
    """The teacher reads what the student reads (the decoder input built from the labels); no shift."""
    from hf_minitx import MiniTxForConditionalGeneration

    config = tiny_config(is_encoder_decoder=True, decoder_start_token_id=1, pad_token_id=0)
    torch.manual_seed(0)
    student = MiniTxForConditionalGeneration(config)
    teacher = copy.deepcopy(student).eval()
    teacher.get_output_embeddings().weight.data.mul_(30)
    objective = Objective.for_seq2seq(config)
    batch = a_batch()
    inputs = objective.model_inputs(batch)
    logits = student(**inputs).logits
    term = Distillation(teacher, 0.5, 2.0).summed_loss(inputs, logits, batch["labels"], objective.shift)
    with torch.no_grad():
        keep = batch["labels"] != IGNORE_INDEX
        p_t = torch.softmax(teacher(**inputs).logits[keep].double() / 2.0, -1)
        log_p_s = torch.log_softmax(logits[keep].double() / 2.0, -1)
    assert term.item() == pytest.approx(float(0.5 * 4.0 * (p_t * (p_t.log() - log_p_s)).sum()), rel=1e-5)
    term.backward()
    assert student.get_output_embeddings().weight.grad is not None
    assert all(p.grad is None for p in teacher.parameters())
