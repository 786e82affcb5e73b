"""A stock Qwen3 or Llama model (from `export.to_stock_model`) written as one GGUF file with the `gguf` package.

GGUF names its tensors after llama.cpp (`blk.N.attn_q.weight`); the names come from the `gguf` package's own
table, so nothing is spelled here. Llama's query and key rows are stored in llama.cpp's rotary order (each
head's two halves interleaved, which transformers' reader undoes); Qwen3 keeps the half-split order. The
byte-level BPE tokenizer goes in as llama.cpp's `gpt2` tokenizer (vocabulary, merges, special ids).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

GGUF_ARCHITECTURES = ("qwen3", "llama")
GGUF_TYPES = ("f32", "f16")
GGUF_FILE = "model-{tensor_type}.gguf"
MISSING = "the gguf package is missing; pip install 'hf_minitx[export]' (or pip install gguf)"


def gguf_architecture(config: PretrainedConfig, asked: str) -> str:
    """The GGUF architecture a MiniTx config is written as: `asked`, or with "auto" qwen3 for QK-norm, else llama."""
    if asked != "auto":
        return asked
    return "qwen3" if config.qk_norm else "llama"


def gguf_problems(config: PretrainedConfig, architecture: str) -> dict[str, str]:
    """Field -> line for the fields that the stock architecture takes but its GGUF form loses (transformers'
    reader sets no biases). An encoder-decoder maps onto no architecture at all: nothing to add."""
    if config.attention_bias and not config.is_encoder_decoder:
        return {"attention_bias": f"attention_bias true: the {architecture} GGUF form has no biases; train with "
                                  "--config_overrides attention_bias=false"}
    return {}


def reader_keywords(config: PretrainedConfig, architecture: str) -> dict[str, int]:
    """Config values transformers' GGUF reader needs passed to `from_pretrained` because it reads them from no
    key: Qwen3's head size, taken as 128 (llama.cpp reads it from attention.key_length)."""
    return {"head_dim": config.head_dim} if architecture == "qwen3" and config.head_dim != 128 else {}


def interleave_rotary_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """(heads * head_dim, in) rows of a query or key projection in llama.cpp's rotary order: each head's two halves
    (i, i + head_dim / 2) become neighbours (2i, 2i + 1). transformers' GGUF reader undoes this for Llama."""
    rows = weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])  # (heads, 2, half, in)
    return rows.transpose(1, 2).reshape(weight.shape)


def _tensors(stock: PreTrainedModel, target: str, tensor_type: str) -> dict[str, np.ndarray]:
    """GGUF tensor name -> array: matrices in `tensor_type`, 1-D tensors (norms, biases) in float32."""
    from gguf import MODEL_ARCH, get_tensor_name_map

    config = stock.config
    names = get_tensor_name_map(MODEL_ARCH.QWEN3 if target == "qwen3" else MODEL_ARCH.LLAMA, config.num_hidden_layers)
    out = {}
    for key, tensor in stock.state_dict().items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue  # a file without `output.weight` is read as a tied head
        base, suffix = key.rsplit(".", 1)
        name = names.get_name(base)
        if name is None:
            raise ValueError(f"no GGUF name for the {target} tensor {key}; please report this")
        tensor = tensor.detach().float()
        if target == "llama" and base.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if base.endswith("q_proj") else config.num_key_value_heads
            tensor = interleave_rotary_rows(tensor, heads)
        array = tensor.numpy()
        out[f"{name}.{suffix}"] = array.astype(np.float16) if tensor_type == "f16" and array.ndim > 1 else array
    return out


def _add_tokenizer(writer, tokenizer: PreTrainedTokenizerBase) -> None:
    """The byte-level BPE as llama.cpp's `gpt2` tokenizer: tokens by id, merges, types and special ids."""
    from gguf import TokenType

    model = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    tokens = [token for token, _ in by_id]
    if [index for _, index in by_id] != list(range(len(tokens))):
        raise ValueError("the tokenizer's ids are not 0..n-1 without gaps; GGUF lists tokens by position")
    special = set(tokenizer.all_special_ids)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")  # GPT-2's split pattern, the one the tokenizer's ByteLevel step uses
    writer.add_token_list(tokens)
    writer.add_token_merges([" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]])
    writer.add_token_types([TokenType.CONTROL if index in special else TokenType.NORMAL
                            for index in range(len(tokens))])
    for name in ("bos", "eos", "unk", "pad"):
        token_id = getattr(tokenizer, f"{name}_token_id")
        if token_id is not None:
            getattr(writer, f"add_{name}_token_id" if name != "unk" else "add_unk_token_id")(token_id)
    writer.add_add_bos_token(False)  # the tokenizer adds no special token to a text (as in training)
    writer.add_add_eos_token(False)


def _add_hyperparameters(writer, config: PretrainedConfig, name: str, tensor_type: str) -> None:
    """The architecture's shape, norms and rotary settings, under llama.cpp's keys."""
    from gguf import LlamaFileType

    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(LlamaFileType.MOSTLY_F16 if tensor_type == "f16" else LlamaFileType.ALL_F32)


def write_gguf(stock: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path, *, target: str,
               tensor_type: str = "f32", name: str = "hf_minitx") -> str:
    """Write `stock` (a transformers Qwen3 or Llama model) and `tokenizer` as `folder/model-<type>.gguf`; returns
    the file name."""
    try:
        from gguf import GGUFWriter
    except ImportError:
        raise ImportError(MISSING) from None
    file_name = GGUF_FILE.format(tensor_type=tensor_type)
    writer = GGUFWriter(folder / file_name, target)
    _add_hyperparameters(writer, stock.config, name, tensor_type)
    _add_tokenizer(writer, tokenizer)
    for tensor_name, array in _tensors(stock, target, tensor_type).items():
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return file_name
