"""A tiny saved model of each task, with a tokenizer and training records, for the sharing tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest
import torch

from hf_minitx import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration
from hf_minitx.data.tokenizer import train_bpe_tokenizer

SENTENCES = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "seven hundred and twelve", "sept cent douze", "one thousand and one", "mille un",
]


CAUSAL_METRICS = {"eval_loss": 3.2188, "eval_perplexity": 24.99, "eval_bits_per_byte": 1.1834}


SEQ2SEQ_METRICS = {"eval_loss": 0.0412, "eval_exact_match": 99.25, "eval_bleu": 98.76}


def write_records(folder: Path, task: str, metrics: dict, **summary_overrides) -> dict:
    """training_summary.json + metrics.jsonl in the training format."""
    summary = {
        "task": task, "dataset": "builtin:kjv" if task == "causal-lm" else "builtin:numbers-en-fr",
        "dataset_config": None, "hub_dataset": False, "steps": 120, "tokens_seen": 245_760,
        "train_seconds": 75.5, "hardware": "1 x cpu (2 cores)", "mixed_precision": "no", "num_processes": 1,
        "final_metrics": metrics,
        "sample_generations": [{"prompt": SENTENCES[0][:16] if task == "causal-lm" else SENTENCES[2],
                                "output": "and the `earth`\nwas"}],
        "preset": "tiny", "seed": 7,
    }
    summary.update(summary_overrides)
    (folder / "training_summary.json").write_text(json.dumps(summary))
    records = [
        {"type": "train", "step": 60, "epoch": 0.5, "loss": 4.1, "learning_rate": 1e-3, "tokens_per_second": 3200.0,
         "tokens_seen": 122_880, "elapsed_seconds": 38.0},
        {"type": "eval", "step": 120, **metrics},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return summary


def build_folder(root: Path, kind: str) -> Path:
    """A tiny saved model of `kind` with a tokenizer and training records."""
    torch.manual_seed(0)
    tokenizer = train_bpe_tokenizer(SENTENCES * 3, vocab_size=300, add_eos_token=kind == "seq2seq")
    config = MiniTxConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=64, max_position_embeddings=64, is_encoder_decoder=kind == "seq2seq",
                          position_embedding_type="rope" if kind == "seq2seq" else "learned")
    model = (MiniTxForConditionalGeneration if kind == "seq2seq" else MiniTxForCausalLM)(config)
    folder = root / f"tiny-{kind}"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_records(folder, kind, SEQ2SEQ_METRICS if kind == "seq2seq" else CAUSAL_METRICS)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {kind: build_folder(root, kind) for kind in ("causal-lm", "seq2seq")}


@pytest.fixture
def causal_copy(folders, tmp_path) -> Path:
    """A private copy of the causal folder that a test may break."""
    return Path(shutil.copytree(folders["causal-lm"], tmp_path / "model"))


def card_metadata(text: str) -> dict:
    return huggingface_hub.ModelCard(text).data.to_dict()
