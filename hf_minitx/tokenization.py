"""Train and load the byte-level BPE tokenizer used by hf_minitx.

The tokenizer is a stock ``tokenizers`` byte-level BPE wrapped in a transformers fast tokenizer, so
a saved folder loads with ``AutoTokenizer.from_pretrained(folder)`` and needs no custom code.

Special tokens have fixed ids, so model configs can rely on them:
``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
# The order fixes the ids: the trainer gives special tokens the first ids, in this order.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIAL_TOKENS))


def _post_processor(add_bos: bool, add_eos: bool) -> processors.TemplateProcessing:
    """A template that wraps each sequence in the requested bos/eos tokens."""
    single = " ".join(
        ([f"{BOS_TOKEN}:0"] if add_bos else []) + ["$A:0"] + ([f"{EOS_TOKEN}:0"] if add_eos else [])
    )
    pair_b = " ".join(
        ([f"{BOS_TOKEN}:1"] if add_bos else []) + ["$B:1"] + ([f"{EOS_TOKEN}:1"] if add_eos else [])
    )
    return processors.TemplateProcessing(
        single=single,
        pair=f"{single} {pair_b}",
        special_tokens=[(BOS_TOKEN, BOS_ID), (EOS_TOKEN, EOS_ID)],
    )


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    *,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    add_bos_token: bool = False,
    add_eos_token: bool = False,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``texts`` and return it as a transformers fast tokenizer.

    ``texts`` is consumed once, lazily: pass an iterator over a sample of a large corpus to keep
    memory bounded. The 256 byte symbols are always in the vocabulary, so any Unicode text
    round-trips through ``encode``/``decode``; no normalizer is applied for the same reason.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: a byte-level BPE needs at least "
            f"{len(SPECIAL_TOKENS) + 256} entries (256 bytes + {len(SPECIAL_TOKENS)} special tokens)."
        )
    backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    backend.train_from_iterator(iter(texts), trainer=trainer)
    for token, expected in zip(SPECIAL_TOKENS, range(len(SPECIAL_TOKENS)), strict=True):
        if backend.token_to_id(token) != expected:  # pragma: no cover - guards a tokenizers change
            raise RuntimeError(f"special token {token} got id {backend.token_to_id(token)}, expected {expected}")
    backend.post_processor = _post_processor(add_bos_token, add_eos_token)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        add_bos_token=add_bos_token,
        add_eos_token=add_eos_token,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path_or_name: str) -> PreTrainedTokenizerFast:
    """Load a saved tokenizer folder (or a cached Hub id) with ``AutoTokenizer``."""
    return AutoTokenizer.from_pretrained(path_or_name)
