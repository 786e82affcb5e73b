"""What a saved model reads and holds, without drawing anything: a text as token ids and readable labels,
and the parameters per component. `minitx visualize` (PNG pictures) and `minitx explore` (an HTML page)
both read models through these functions.
"""

from __future__ import annotations

import codecs
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from ..data.tokenizer import checked_texts

PARAM_COMPONENTS = ("embeddings", "attention", "feed-forward", "layer norms", "output head")


def special_names(config: Any) -> dict[int, str]:
    """Names of the special token ids a config declares: {id: "<pad>" / "<bos>" / "<eos>"}."""
    names = {}
    for attribute, name in (("pad_token_id", "<pad>"), ("bos_token_id", "<bos>"), ("eos_token_id", "<eos>")):
        value = getattr(config, attribute, None)
        if value is not None:
            names[value] = name
    return names


def _byte_level_table() -> dict[str, int]:
    """The byte-level BPE alphabet back to bytes: printable Latin-1 bytes stand for themselves, the other bytes
    for the characters from U+0100 on, in byte order (the convention of GPT-2's tokenizer and ``ByteLevel``)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(byte): byte for byte in kept}
    others = [byte for byte in range(256) if byte not in table.values()]
    table.update({chr(256 + n): byte for n, byte in enumerate(others)})
    return table


BYTE_LEVEL = _byte_level_table()


BYTE_TOKENS = "hf_minitx.byte_tokens"  # a decoding error handler: each byte that is no character as <0xC3>
codecs.register_error(BYTE_TOKENS, lambda error: (
    "".join(f"<0x{byte:02X}>" for byte in error.object[error.start:error.end]), error.end))


def token_text(token_id: int, tokenizer: Any) -> str:
    """What a token stands for: its text, or, for a token that holds part of a character's UTF-8 bytes (which
    decodes to U+FFFD alone), those bytes as <0xC3> (Llama's spelling of a byte token), so that "é" split in two
    is not shown as "��", and a byte is not a backslash escape the explorer page would escape again."""
    piece = tokenizer.decode([token_id])
    if "\ufffd" not in piece:
        return piece
    symbol = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(symbol, str) or not symbol or any(char not in BYTE_LEVEL for char in symbol):
        return piece  # not a byte-level token (or a real U+FFFD): as decoded
    return bytes(BYTE_LEVEL[char] for char in symbol).decode("utf-8", errors=BYTE_TOKENS)


def encode_text(text: str, tokenizer: Any | None, config: Any, option: str = "--text") -> list[int]:
    """Token ids of `text` (given with ``option``): through the tokenizer, or whitespace-separated integers
    without one."""
    if not text or not text.strip():
        raise ValueError(f"{option} is empty; pass some words (or token ids for a model without tokenizer).")
    # bytes the shell could not decode are named
    text = next(checked_texts([text], f"the {option} text", option=option))
    if tokenizer is not None:
        # the caller checks length; a "<eos>" written in the text is text, as in training
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True, verbose=False)["input_ids"]
    else:
        try:
            ids = [int(word) for word in text.split()]
        except ValueError as err:
            raise ValueError(
                f"This model has no tokenizer, so the text must be whitespace-separated token ids, got {text!r}."
            ) from err
    bad = [i for i in ids if not 0 <= i < config.vocab_size]
    if bad:
        raise ValueError(f"Token ids {bad} are outside the model's vocabulary [0, {config.vocab_size}).")
    return ids


def token_labels(ids: Sequence[int], tokenizer: Any | None, config: Any) -> list[str]:
    """Short readable labels for axis ticks: special tokens by name, spaces shown as '·' (as the explorer page shows
    them; an underscore would read as the text's own '_'), control characters (no font draws them) as escapes: a
    newline as \\n, a tab as \\t, ESC as \\x1b."""
    special = special_names(config)
    labels = []
    for i in ids:
        if i in special:
            labels.append(special[i])
        elif tokenizer is not None:
            piece = token_text(i, tokenizer)
            labels.append("".join(_label_char(char) for char in piece) or "?")
        else:
            labels.append(str(i))
    return [label if len(label) <= 12 else label[:11] + "…" for label in labels]


def _label_char(char: str) -> str:
    """One character of an axis label: a space as '·', a control character as its Python escape."""
    if char == " ":
        return "\u00b7"
    return repr(char)[1:-1] if unicodedata.category(char) == "Cc" else char


def check_fits_positions(name: str, ids: Sequence[int], config: Any) -> None:
    """Refuse a text of more tokens than the model has positions (a learned table has no row past them, and no
    model was trained there)."""
    limit = config.max_position_embeddings
    if len(ids) > limit:
        raise ValueError(f"{name} takes {len(ids)} tokens but the model has {limit} positions; shorten it")


def parameter_component(name: str) -> str:
    """The component a parameter belongs to, from its name (e.g. 'model.decoder.layers.0.mlp.fc1.weight')."""
    if "embed" in name:
        return "embeddings"
    if "norm" in name:
        return "layer norms"
    if "attn." in name:
        return "attention"
    if ".mlp." in name:
        return "feed-forward"
    if name.startswith("lm_head"):
        return "output head"
    return "other"


def parameter_counts(model: Any) -> dict[str, int]:
    """Parameters per component; shared (tied) tensors count once, so the total is model.num_parameters().

    A tied output head shows 0: it reuses the token embedding matrix.
    """
    counts = dict.fromkeys(PARAM_COMPONENTS, 0)
    for name, param in model.named_parameters():  # yields each shared tensor once
        component = parameter_component(name)
        counts[component] = counts.get(component, 0) + param.numel()
    return counts


def format_param_table(counts: Mapping[str, int]) -> str:
    """A plain-text table of component, parameters and share of the total."""
    total = sum(counts.values()) or 1
    lines = [f"{'component':<14}{'parameters':>14}{'share':>9}"]
    lines += [f"{name:<14}{count:>14,}{100 * count / total:>8.1f}%" for name, count in counts.items()]
    lines.append(f"{'total':<14}{sum(counts.values()):>14,}{100.0:>8.1f}%")
    return "\n".join(lines)
