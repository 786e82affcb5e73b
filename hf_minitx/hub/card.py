"""Render the Hub model card (README.md) of a saved model folder from the packaged `model_card.md` template.

The card is built from what the folder holds: config.json (architecture), the safetensors header
(parameter count), training_summary.json (data, training figures, validation metrics), and the
tokenizer files. `check_model_card` runs huggingface_hub's offline metadata parsing on the result.
"""

from __future__ import annotations

import json
import math
import re
from importlib import resources
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results

from ..folders import SUMMARY_FILE, write_file
from ..model_files import model_kind
from ..models.configuration_minitx import EXTRA_PIECES, NORM_TYPES, POSITION_KINDS, PositionKind
from .card_training import human, sanitize, training_rows
from .folder import (
    AUTO_CLASSES,
    WEIGHTS_FILE,
    WEIGHTS_INDEX_FILE,
    ModelFolderError,
    count_parameters,
    read_safetensors_header,
)

TEMPLATE_NAME = "model_card.md"
CARD_FILE = "README.md"
EXPLORER_FILE = "explore.html"  # `minitx explore`'s page, shared with `minitx push --explorer`
PIPELINE_TAGS = {"causal-lm": "text-generation", "seq2seq": "text2text-generation"}
TASK_NAMES = {"causal-lm": "Causal language modeling", "seq2seq": "Sequence-to-sequence generation"}
BUILTIN_LANGUAGES = {
    "builtin:kjv": ["en"], "builtin:pydocs": ["en"], "builtin:numbers-en-fr": ["en", "fr"],
    "builtin:numbers-en-de": ["en", "de"],
}
# final_metrics key -> (model-index metric type, pretty name, display format)
KNOWN_METRICS = {
    "eval_loss": ("loss", "Validation loss (nats per token)", "{:.4f}"),
    "eval_perplexity": ("perplexity", "Validation perplexity", "{:.2f}"),
    "eval_bits_per_byte": ("bits_per_byte", "Validation bits per byte", "{:.4f}"),
    "eval_exact_match": ("exact_match", "Validation exact match (%)", "{:.2f}"),
    "eval_bleu": ("bleu", "Validation BLEU (sacreBLEU)", "{:.2f}"),
}
REQUIRED_TAGS = ("hf_minitx", "custom_code")


def find_template() -> Path:
    """The `model_card.md` template shipped inside this package (the repository's top-level
    `model_card.md` is a link to the same file, so there is one text to edit)."""
    path = Path(str(resources.files(__package__) / TEMPLATE_NAME))
    if not path.is_file():
        raise FileNotFoundError(f"model card template {path} is missing from the installed package; "
                                "reinstall hf_minitx or pass template_path=... explicitly.")
    return path


def _read_json(path: Path) -> dict | None:
    """A JSON object from `path`, or None when the file is absent."""
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ModelFolderError(f"{path} is not valid JSON ({error}).") from None
    if not isinstance(value, dict):
        raise ModelFolderError(f"{path} holds a JSON {type(value).__name__}, not the object minitx writes; "
                               "remove it or train the model again.")
    return value


def _count_parameters(folder: Path) -> int | None:
    """Parameter count from the safetensors header(s); None when there are no readable weights."""
    index = _read_json(folder / WEIGHTS_INDEX_FILE)
    shards = sorted(set(index["weight_map"].values())) if index else [WEIGHTS_FILE]
    total = 0
    for shard in shards:
        if not (folder / shard).is_file():
            return None
        total += count_parameters(read_safetensors_header(folder / shard))
    return total


def _position_kind(config: dict) -> PositionKind:
    """The kind of the config's position encoding; an unknown name is described by itself, as a table."""
    name = str(config.get("position_embedding_type"))
    return POSITION_KINDS.get(name, PositionKind(name, table=True))


def _architecture_rows(config: dict, kind: str, num_parameters: int | None) -> list[tuple[str, str]]:
    """(name, value) rows describing the network."""
    norm_type = str(config.get("norm_type") or "layernorm")
    name = NORM_TYPES.get(norm_type, norm_type)
    norm = {"pre": f"pre-{name} (before each sub-layer)", "post": f"post-{name} (after each residual add)"}
    if kind == "seq2seq":
        layers = f"{config.get('num_encoder_layers')} encoder + {config.get('num_decoder_layers')} decoder"
    else:
        layers = f"{config.get('num_hidden_layers')} decoder"
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_text = f"{heads}" + (f" ({kv_heads} key/value heads)" if kv_heads != heads else "")
    rows = [
        ("Model class", f"`{'MiniTxForConditionalGeneration' if kind == 'seq2seq' else 'MiniTxForCausalLM'}`"),
        ("Layers", layers),
        ("Hidden size", str(config.get("hidden_size"))),
        ("Attention heads", head_text),
        ("Feed-forward size", f"{config.get('intermediate_size')} ({config.get('hidden_act')})"),
        ("Positions", f"{_position_kind(config).description}, "
                      f"up to {config.get('max_position_embeddings')}"),
        ("Normalisation", norm.get(config.get("norm_position"), str(config.get("norm_position")))
         + (", QK-norm on each head's queries and keys" if config.get("qk_norm") else "")),
        ("Vocabulary", str(config.get("vocab_size"))),
        ("Output head", ", ".join(filter(None, [
            "untied" if config.get("tie_word_embeddings") is False else "tied to the token embeddings",
            "zero at the start of training" if config.get("zero_init_head") else "",
            f"logits soft-capped: {config['final_logit_softcap']:g}·tanh(logits/{config['final_logit_softcap']:g})"
            if config.get("final_logit_softcap") else ""]))),
        ("Parameters", f"{num_parameters:,} ({human(num_parameters)})" if num_parameters else "unknown"),
        ("Stored dtype", str(config.get("dtype") or config.get("torch_dtype") or "float32")),
    ]
    extras = [what for key, what in EXTRA_PIECES.items() if config.get(key)]  # config.EXTRA_PIECES that are on
    if extras:
        rows.insert(-4, ("Extra pieces", "; ".join(extras)))
    return rows


def _coverage_sentence(summary: dict | None) -> str:
    """What the validation figures were computed on, from the summary's ``evaluation`` record."""
    coverage = (summary or {}).get("evaluation") or {}
    if not coverage:
        return "Measured on the held-out validation split at the end of training."
    if coverage.get("whole_split", True):
        what = "the whole held-out validation split"
    else:
        what = f"a subset of the held-out validation split (its first {coverage.get('rows', 0):,} rows)"
    counts = []
    if coverage.get("tokens"):
        counts.append(f"{int(coverage['tokens']):,} scored tokens")
    if coverage.get("bytes"):
        counts.append(f"{int(coverage['bytes']):,} UTF-8 bytes of text, the denominator of bits per byte")
    if coverage.get("generation_pairs"):
        counts.append(f"exact match and BLEU from `generate()` on {int(coverage['generation_pairs']):,} pairs, "
                      "with sources encoded by the saved tokenizer")
    detail = f" ({'; '.join(counts)})" if counts else ""
    return f"Measured at the end of training on {what}{detail}."


def _finite_metrics(summary: dict | None) -> dict[str, float]:
    """The numeric, finite eval_* values of final_metrics, known metrics first."""
    metrics = (summary or {}).get("final_metrics") or {}
    values = {key: float(value) for key, value in metrics.items()
              if key.startswith("eval_") and isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value)}
    order = [key for key in KNOWN_METRICS if key in values] + sorted(k for k in values if k not in KNOWN_METRICS)
    return {key: values[key] for key in order}


def _metric_meta(key: str) -> tuple[str, str, str]:
    """(metric type, pretty name, format) of an eval_* key."""
    plain = key.removeprefix("eval_")
    return KNOWN_METRICS.get(key, (plain, "Validation " + plain.replace("_", " "), "{:.4g}"))


def _shown_metric(key: str, value: float) -> str:
    """A metric as the card's table shows it: its own format, or 4 significant digits once it is too large to
    read that way (the perplexity of a diverged run, 1e+304, is not printed as 305 digits)."""
    return (_metric_meta(key)[2] if abs(value) < 1e6 else "{:.4g}").format(value)


def _eval_results(metrics: dict[str, float], kind: str, summary: dict) -> list[EvalResult]:
    """One EvalResult per metric, all on the validation split of the training dataset."""
    dataset = str(summary.get("dataset") or "unknown")
    return [
        EvalResult(
            task_type=PIPELINE_TAGS[kind], task_name=TASK_NAMES[kind],
            dataset_type=dataset, dataset_name=dataset, dataset_config=summary.get("dataset_config"),
            dataset_split="validation", metric_type=_metric_meta(key)[0], metric_name=_metric_meta(key)[1],
            metric_value=round(value, 6),
        )
        for key, value in metrics.items()
    ]


def _tokenizer_description(folder: Path, config: dict) -> str:
    """A sentence or two on the tokenizer saved in the folder."""
    data = _read_json(folder / "tokenizer.json")
    if data is None:
        return "No tokenizer is saved in this folder; use the tokenizer the model was trained with."
    settings = _read_json(folder / "tokenizer_config.json") or {}
    model = data.get("model") or {}
    kind = model.get("type", "unknown")
    byte_level = "ByteLevel" in json.dumps(data.get("pre_tokenizer"))
    name = f"{'byte-level ' if byte_level else ''}{kind}"
    size = len(model.get("vocab") or {}) + len([t for t in data.get("added_tokens") or []
                                                if t.get("content") not in (model.get("vocab") or {})])
    specials = ", ".join(f"`{t['content']}` = {t['id']}" for t in data.get("added_tokens") or [] if t.get("special"))
    text = (f"A {name} tokenizer with {size:,} tokens, saved as a standard `tokenizer.json`: the tokenizer "
            "itself runs no custom code.")
    if (folder / "config.json").is_file():  # AutoTokenizer reads config.json first, whose model type is ours
        text += (" In this folder `AutoTokenizer` first reads `config.json`, whose `minitx` model type is defined "
                 "by this repository's code, so without hf_minitx load it with "
                 "`AutoTokenizer.from_pretrained(repo, trust_remote_code=True)` (as below), or with no custom code "
                 "at all with `PreTrainedTokenizerFast.from_pretrained(repo)`.")
    if specials:
        text += f" Special tokens: {specials}."
    extras = []
    if settings.get("padding_side"):
        why = "what batched generation needs" if settings["padding_side"] == "left" else "as labels are padded"
        extras.append(f"pads on the {settings['padding_side']} ({why})")
    if byte_level:
        extras.append("any Unicode text round-trips through it, with no unknown tokens")
    if extras:
        text += " It " + " and ".join(extras) + "."
    return text


def build_card_data(kind: str, summary: dict | None, model_name: str, license: str) -> ModelCardData:
    """The YAML metadata of the card: library, pipeline tag, tags, license, datasets, model-index."""
    summary = summary or {}
    dataset = summary.get("dataset")
    metrics = _finite_metrics(summary)
    eval_results = _eval_results(metrics, kind, summary) if metrics else None
    return ModelCardData(
        library_name="transformers",
        pipeline_tag=PIPELINE_TAGS[kind],
        tags=["hf_minitx", "custom_code", kind],
        license=license,
        language=BUILTIN_LANGUAGES.get(dataset),
        datasets=[dataset] if dataset and summary.get("hub_dataset") else None,
        metrics=[_metric_meta(key)[0] for key in metrics] or None,
        model_name=model_name if eval_results else None,
        eval_results=eval_results,
    )


def code_prompt(prompt: str, default: str) -> str:
    """The prompt of the card's code examples: the first sample's as it was given (a table cell's copy has its pipes
    and backticks replaced), or ``default`` when there is none or it would end the code block."""
    return prompt if prompt.strip() and "```" not in prompt else default


def render_model_card(
    model_dir: str | Path,
    *,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    template_path: str | Path | None = None,
    name: str | None = None,
) -> str:
    """Render the model card of a saved model folder as README.md text (YAML metadata + Markdown).

    Needs config.json; training_summary.json, the weights and the tokenizer files add their parts when
    present. `repo_id` (e.g. "user/name") goes into the usage snippets; `name` (a copy's source folder) or the
    folder's own name otherwise.
    """
    folder = Path(model_dir)
    config = _read_json(folder / "config.json")
    if config is None:
        raise ModelFolderError(f"{folder / 'config.json'} is missing; save the model into {folder} first.")
    kind = model_kind(config)
    summary = _read_json(folder / SUMMARY_FILE)
    if summary is not None and summary.get("task") not in (None, kind):
        raise ModelFolderError(f"{folder / SUMMARY_FILE} says task={summary.get('task')!r} but "
                               f"config.json describes a {kind} model.")
    name = repo_id.split("/")[-1] if repo_id else name or folder.resolve().name
    metrics = _finite_metrics(summary)
    recorded = [s for s in ((summary or {}).get("sample_generations") or [])[:5] if isinstance(s, dict)]
    samples = [{"prompt": sanitize(s.get("prompt", "")), "output": sanitize(s.get("output", ""))} for s in recorded]
    first = str(recorded[0].get("prompt", "")) if recorded else ""  # the code blocks' prompt, as recorded
    dataset = (summary or {}).get("dataset") or "an unrecorded dataset"
    max_positions = config.get("max_position_embeddings")
    if not _position_kind(config).table:
        context_sentence = (f"Rotary positions have no hard length limit, but the model was configured for "
                            f"{max_positions} positions and degrades beyond what it saw in training.")
    else:
        context_sentence = (f"Inputs longer than {max_positions} tokens (max_position_embeddings) are rejected; "
                            "truncate longer texts.")
    if kind == "seq2seq":
        task_sentence = "It reads a source text with its encoder and writes the target text with its decoder."
        limitation = "it only knows the mapping it was trained on and fails on inputs unlike its training sources."
        example_prompt = json.dumps(code_prompt(first, "seven hundred and twelve"))
    else:
        task_sentence = "It continues a text prompt one token at a time."
        limitation = "it imitates the style of its corpus and often produces fluent text that means little."
        example_prompt = json.dumps(code_prompt(first, "In the beginning"))
    card_data = build_card_data(kind, summary, name, license)
    card = ModelCard.from_template(
        card_data,
        template_path=str(template_path or find_template()),
        model_title=name,
        kind_phrase="a decoder-only language model" if kind == "causal-lm" else "an encoder-decoder (seq2seq) model",
        task_sentence=task_sentence,
        architecture_rows=_architecture_rows(config, kind, _count_parameters(folder)),
        has_summary=summary is not None,
        dataset_label=f"`{dataset}`",
        dataset_config=(summary or {}).get("dataset_config"),
        training_rows=training_rows(summary or {}),
        has_loss_curve=(folder / "loss_curve.png").is_file(),
        explorer_file=EXPLORER_FILE if (folder / EXPLORER_FILE).is_file() else None,
        metric_rows=[(_metric_meta(k)[1], _shown_metric(k, v)) for k, v in metrics.items()],
        coverage_sentence=_coverage_sentence(summary),
        warning=sanitize(str((summary or {}).get("warning") or "").removeprefix("warning: "), limit=1000),
        samples=samples,
        tokenizer_description=_tokenizer_description(folder, config),
        auto_class=AUTO_CLASSES[kind],
        repo_id=repo_id or f"your-username/{name}",
        example_prompt=example_prompt,
        limitation_sentence=limitation,
        context_sentence=context_sentence,
    )
    return re.sub(r"\n{3,}", "\n\n", str(card))  # the template's loops leave runs of blank lines


def write_model_card(model_dir: str | Path, **kwargs) -> Path:
    """Render the card (see `render_model_card`) and write it as `model_dir/README.md` (atomically); returns the
    path."""
    text = render_model_card(model_dir, **kwargs)
    check_model_card(text)
    return write_file(Path(model_dir) / CARD_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def check_model_card(text: str) -> ModelCard:
    """Check a card's metadata offline with huggingface_hub's own parsing; raise ValueError on problems.

    Checks: the YAML block parses into ModelCardData (model-index included), library_name, pipeline_tag
    and tags are what the Hub needs to show the widget, and every model-index metric is a finite
    number that survives huggingface_hub's model-index round trip.
    """
    card = ModelCard(text)  # raises ValueError for a non-dict block or an unparsable model-index
    data = card.data.to_dict()
    problems = []
    if data.get("library_name") != "transformers":
        problems.append(f"library_name is {data.get('library_name')!r}, expected 'transformers'")
    if data.get("pipeline_tag") not in PIPELINE_TAGS.values():
        problems.append(f"pipeline_tag is {data.get('pipeline_tag')!r}, "
                        f"expected one of {sorted(PIPELINE_TAGS.values())}")
    missing_tags = [tag for tag in REQUIRED_TAGS if tag not in (data.get("tags") or [])]
    if missing_tags:
        problems.append(f"tags lack {missing_tags}")
    if not data.get("license"):
        problems.append("license is missing")
    model_index = data.get("model-index")
    if model_index is not None:
        name, results = model_index_to_eval_results(model_index)
        for result in results:
            value = result.metric_value
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problems.append(f"model-index metric {result.metric_type!r} has non-numeric value {value!r}")
        if eval_results_to_model_index(name, results) != model_index:
            problems.append("model-index does not survive huggingface_hub's round trip")
    if problems:
        raise ValueError("model card metadata is invalid: " + "; ".join(problems) + ".")
    return card


__all__ = ["find_template", "build_card_data", "render_model_card", "write_model_card", "check_model_card"]
