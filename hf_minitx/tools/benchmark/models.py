"""The implementations every speed benchmark builds, at one shared shape, and their inputs.

`speed` and `memory` build their training steps from here and `generation` their `generate()` steps, so every
section measures the very same models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class BenchmarkShape:
    """The one shape every implementation is built at (all overridable from the command line)."""

    vocab_size: int = 8192
    context: int = 256
    layers: int = 6
    hidden: int = 384
    heads: int = 6
    ffn_mult: int = 4
    batch: int = 8
    seq2seq_len: int = 64
    prompt_len: int = 32
    new_tokens: int = 256

    def check(self) -> None:
        """Raise ValueError for a shape no model can be built from."""
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Benchmark shape: {name} must be a positive integer, got {value!r}.")
        if self.hidden % self.heads:
            raise ValueError(f"Benchmark shape: hidden ({self.hidden}) must be divisible by heads ({self.heads}).")
        if self.layers < 2:
            raise ValueError("Benchmark shape: layers must be at least 2 (seq2seq models split them encoder/decoder).")
        if self.vocab_size < 8:
            raise ValueError("Benchmark shape: vocab_size must be at least 8 (ids 0-3 are special tokens).")

    @property
    def positions(self) -> int:
        """Position table size: long enough for training and for prompt + generated tokens."""
        return max(self.context, self.seq2seq_len, self.prompt_len + self.new_tokens)


QUICK_SHAPE = BenchmarkShape(vocab_size=2048, context=128, layers=2, hidden=128, heads=4, batch=4,
                             seq2seq_len=32, prompt_len=16, new_tokens=64)


# ----------------------------------------------------------------------------------------------- models


def minitx_causal(shape: BenchmarkShape, attn: str = "sdpa") -> nn.Module:
    """hf_minitx decoder-only model configured like GPT-2: learned positions, pre-LN, gelu, tied, biases."""
    from ...models.configuration_minitx import MiniTxConfig
    from ...models.modeling_minitx import MiniTxForCausalLM

    config = MiniTxConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, intermediate_size=shape.ffn_mult * shape.hidden,
        max_position_embeddings=shape.positions, hidden_act="gelu", norm_position="pre",
        position_embedding_type="learned", attention_bias=True, tie_word_embeddings=True,
        hidden_dropout=0.0, attention_dropout=0.0, attn_implementation=attn,
    )
    return MiniTxForCausalLM(config)


def gpt2(shape: BenchmarkShape, activation: str = "gelu_new") -> nn.Module:
    """transformers' GPT2LMHeadModel (sdpa) at the shared shape; `activation` "gelu_new" is GPT-2's default."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=shape.vocab_size, n_positions=shape.positions, n_embd=shape.hidden, n_layer=shape.layers,
        n_head=shape.heads, n_inner=shape.ffn_mult * shape.hidden, activation_function=activation,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        attn_implementation="sdpa",
    )
    return GPT2LMHeadModel(config)


def minitx_seq2seq(shape: BenchmarkShape) -> nn.Module:
    """hf_minitx encoder-decoder like BART: post-LN, learned positions, gelu, tied, layers split evenly."""
    from ...models.configuration_minitx import MiniTxConfig
    from ...models.modeling_minitx import MiniTxForConditionalGeneration

    config = MiniTxConfig(
        vocab_size=shape.vocab_size, hidden_size=shape.hidden, num_attention_heads=shape.heads,
        intermediate_size=shape.ffn_mult * shape.hidden, max_position_embeddings=shape.positions,
        is_encoder_decoder=True, num_encoder_layers=shape.layers // 2, num_decoder_layers=shape.layers // 2,
        num_hidden_layers=shape.layers // 2, hidden_act="gelu", norm_position="post",
        position_embedding_type="learned", attention_bias=True, tie_word_embeddings=True,
        hidden_dropout=0.0, attention_dropout=0.0, attn_implementation="sdpa",
    )
    return MiniTxForConditionalGeneration(config)


def bart(shape: BenchmarkShape) -> nn.Module:
    """transformers' BartForConditionalGeneration (sdpa) at the shared shape."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=shape.vocab_size, max_position_embeddings=shape.positions, d_model=shape.hidden,
        encoder_layers=shape.layers // 2, decoder_layers=shape.layers // 2, encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads, encoder_ffn_dim=shape.ffn_mult * shape.hidden,
        decoder_ffn_dim=shape.ffn_mult * shape.hidden, activation_function="gelu", dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, forced_eos_token_id=None, attn_implementation="sdpa",
    )
    return BartForConditionalGeneration(config)


class TorchTransformerSeq2Seq(nn.Module):
    """`torch.nn.Transformer` with token + learned position embeddings and a tied output layer."""

    def __init__(self, shape: BenchmarkShape):
        super().__init__()
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden)
        self.positions = nn.Embedding(shape.positions, shape.hidden)
        self.transformer = nn.Transformer(
            d_model=shape.hidden, nhead=shape.heads, num_encoder_layers=shape.layers // 2,
            num_decoder_layers=shape.layers // 2, dim_feedforward=shape.ffn_mult * shape.hidden, dropout=0.0,
            activation="gelu", batch_first=True,
        )
        # GPT-style 0.02 init, as the other models: nn.Embedding's N(0, 1) gives saturated softmax outputs whose
        # denormal gradients slow the output-layer matmuls down 100-fold on CPU.
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.positions.weight, std=0.02)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) + self.positions.weight[: ids.size(1)]  # (batch, seq, hidden)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Source (batch, src) and labels (batch, tgt) -> mean cross-entropy (teacher forcing, start id 1)."""
        decoder_ids = torch.cat([torch.ones_like(labels[:, :1]), labels[:, :-1]], dim=1)  # (batch, tgt)
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(labels.size(1), device=labels.device)
        states = self.transformer(self._embed(input_ids), self._embed(decoder_ids), tgt_mask=tgt_mask,
                                  tgt_is_causal=True)  # (batch, tgt, hidden)
        logits = nn.functional.linear(states, self.embed.weight)  # (batch, tgt, vocab)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


def build(name: str, shape: BenchmarkShape) -> nn.Module:
    """Build one implementation by its benchmark name, seeded so every run starts from the same weights."""
    torch.manual_seed(0)
    builders: dict[str, Callable[[], nn.Module]] = {
        "gpt2": lambda: gpt2(shape),
        "gpt2-gelu": lambda: gpt2(shape, activation="gelu"),
        "gpt2-no-cache": lambda: gpt2(shape),
        "minitx-sdpa": lambda: minitx_causal(shape, "sdpa"),
        "minitx-eager": lambda: minitx_causal(shape, "eager"),
        "minitx": lambda: minitx_causal(shape, "sdpa"),
        "minitx-no-cache": lambda: minitx_causal(shape, "sdpa"),
        "bart": lambda: bart(shape),
        "minitx-seq2seq": lambda: minitx_seq2seq(shape),
        "torch-transformer": lambda: TorchTransformerSeq2Seq(shape),
    }
    if name not in builders:
        raise ValueError(f"Unknown implementation {name!r}; choose one of {sorted(builders)}.")
    return builders[name]()


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def random_ids(batch: int, seq: int, vocab: int, generator: torch.Generator, device: str) -> torch.Tensor:
    """(batch, seq) token ids avoiding the special ids 0-3."""
    return torch.randint(4, vocab, (batch, seq), generator=generator).to(device)
