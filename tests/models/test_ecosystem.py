"""MiniTx inside the rest of the ecosystem: Trainer, Seq2SeqTrainer, pipeline, PEFT LoRA."""

import pytest
import torch
from conftest import tiny_config
from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainingArguments,
    pipeline,
)
from transformers.utils import find_labels

from hf_minitx import MiniTxForCausalLM, MiniTxForConditionalGeneration
from hf_minitx.data.tokenizer import train_bpe_tokenizer

TEXTS = [
    "the cat sat on the mat and the dog sat on the log",
    "in the beginning was the word and the word was with the cat",
    "a quick brown fox jumps over the lazy dog near the mat",
] * 4


@pytest.fixture(scope="module")
def tokenizer():
    return train_bpe_tokenizer(TEXTS, vocab_size=300, min_frequency=1)


def _lm_dataset(tokenizer, length=16):
    ids = [tokenizer(t)["input_ids"][:length] for t in TEXTS]
    ids = [x + [tokenizer.pad_token_id] * (length - len(x)) for x in ids]
    labels = [[tok if tok != tokenizer.pad_token_id else -100 for tok in x] for x in ids]
    return Dataset.from_dict({"input_ids": ids, "labels": labels})


def _train_args(tmp_path, cls=TrainingArguments, **extra):
    return cls(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=30, learning_rate=3e-3,
               logging_steps=10, report_to=[], save_strategy="no", use_cpu=True, seed=0, **extra)


def _losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_trainer_trains_causal_lm_with_falling_loss(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = MiniTxForCausalLM(tiny_config(vocab_size=len(tokenizer)))
    trainer = Trainer(model=model, args=_train_args(tmp_path), train_dataset=_lm_dataset(tokenizer))
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.8


def test_trainer_evaluates_a_loss_with_its_default_label_names(tmp_path, tokenizer):
    # Trainer takes every forward argument named like a label for one it must be given before it computes an
    # evaluation loss: shift_labels is a keyword of **kwargs, as in transformers' own models
    for model_class in (MiniTxForCausalLM, MiniTxForConditionalGeneration):
        assert find_labels(model_class) == ["labels"], model_class
    model = MiniTxForCausalLM(tiny_config(vocab_size=len(tokenizer)))
    args = _train_args(tmp_path, eval_strategy="steps", eval_steps=10, metric_for_best_model="eval_loss")
    trainer = Trainer(model=model, args=args, train_dataset=_lm_dataset(tokenizer), eval_dataset=_lm_dataset(tokenizer))
    trainer.train()
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] > 0 and trainer.predict(_lm_dataset(tokenizer)).label_ids is not None


def test_seq2seq_trainer_trains_and_generates(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = MiniTxForConditionalGeneration(tiny_config(vocab_size=len(tokenizer), is_encoder_decoder=True))
    tokenizer.padding_side = "right"
    rows = [{"input_ids": tokenizer(t)["input_ids"][:10],
             "labels": tokenizer(t.upper())["input_ids"][:8] + [tokenizer.eos_token_id]} for t in TEXTS]
    args = _train_args(tmp_path, Seq2SeqTrainingArguments, predict_with_generate=True)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             data_collator=DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100))
    trainer.train()
    losses = _losses(trainer)
    assert len(losses) == 3 and losses[-1] < losses[0] * 0.8
    predictions = trainer.predict(Dataset.from_list(rows[:2]), max_new_tokens=5)
    assert predictions.predictions.shape[0] == 2


def test_text_generation_pipeline_from_a_saved_folder(tmp_path, tokenizer):
    torch.manual_seed(0)
    MiniTxForCausalLM(tiny_config(vocab_size=len(tokenizer))).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path), device="cpu")
    out = generator("the cat", max_new_tokens=5, min_new_tokens=5, do_sample=False)
    text = out[0]["generated_text"]
    assert text.startswith("the cat") and len(text) > len("the cat")


def test_peft_lora_on_q_and_v_trains_and_reloads(tmp_path, tokenizer):
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    base_dir = tmp_path / "base"
    MiniTxForCausalLM(tiny_config(vocab_size=len(tokenizer))).save_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ("q_proj" in n or "v_proj" in n) for n in trainable)
    trainer = Trainer(model=lora, args=_train_args(tmp_path / "out"), train_dataset=_lm_dataset(tokenizer))
    trainer.train()
    losses = _losses(trainer)
    assert losses[-1] < losses[0]
    lora.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([tokenizer("the cat sat")["input_ids"]])
    lora.eval()
    expected = lora(ids).logits
    reloaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), tmp_path / "adapter")
    reloaded.eval()
    torch.testing.assert_close(reloaded(ids).logits, expected)
    assert not torch.allclose(AutoModelForCausalLM.from_pretrained(base_dir)(ids).logits, expected)
