"""Shared test setup: offline Hugging Face, one torch thread, tiny model factories."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


def tiny_config(**overrides):
    """A MiniTxConfig small enough for sub-second tests."""
    from hf_minitx import MiniTxConfig

    values = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64,
    )
    values.update(overrides)
    return MiniTxConfig(**values)


@pytest.fixture
def make_config():
    return tiny_config
