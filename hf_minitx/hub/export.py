"""`minitx export`: a decoder-only MiniTx folder as a stock transformers architecture (Qwen3, Llama, GPT-2) or GGUF.

The building blocks map one to one: Qwen3 is pre-norm RMSNorm, a SwiGLU feed-forward, rotary positions (the
half-split rotation, as ours) and per-head QK-norm before the rotation; Llama is the same without QK-norm;
GPT-2 is pre-norm LayerNorm, learned positions and a plain feed-forward, its linear maps stored transposed
(`Conv1D`, (in, out)). A config that does not map is refused with one line per field, naming the change that
makes it map. The exported folder loads with `AutoModelForCausalLM.from_pretrained(out)` without
`trust_remote_code` and without hf_minitx; its logits are checked against ours before it is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel

from ..folders import output_folder, write_folder, write_marker
from ..models.configuration_minitx import EXTRA_PIECES

GPT2_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "relu2": "relu2"}  # ours -> transformers' ACT2FN name
CHECK_TOLERANCE = 1e-4  # largest |logit difference| / max(1, largest |logit|) accepted by the export's own check


class ExportRefused(ValueError):
    """A model whose config does not map onto the target; the message has one line per field."""


class Requirement(NamedTuple):
    """A config field a target can express only with some values: ``accepted``, the first of them the one a
    refusal advises; ``advice`` is added where the whole model maps onto the target's ``sibling``."""

    field: str
    accepted: tuple[object, ...]
    why: str
    advice: str = ""


def override(field_name: str, value: object) -> str:
    """The training flag that sets one config field."""
    return f"train with --config_overrides {field_name}={str(value).lower() if isinstance(value, bool) else value}"


def _field_problems(config: PretrainedConfig, target: str, advise: bool = True) -> list[tuple[str, object, str]]:
    """(field, value, why and how) for each field of `config` that the target's architecture cannot express; with
    ``advise``, a field that the target's sibling takes names it, where the whole model maps onto that one."""
    spec = STOCK_TARGETS[target]
    sibling_fits = advise and spec.sibling is not None and not _field_problems(config, spec.sibling, advise=False)
    wanted = [Requirement("norm_position", ("pre",), f"{spec.name} normalises before each sub-layer"),
              *spec.requirements, Requirement("final_logit_softcap", (None,), f"{spec.name} does not cap its logits")]
    problems = [(field_name, getattr(config, field_name),
                 f"{why}{f' {advice}' if advice and sibling_fits else ''}; {override(field_name, accepted[0])}")
                for field_name, accepted, why, advice in wanted if getattr(config, field_name) not in accepted]
    problems += [(key, True, f"{spec.name} cannot carry {what}; {override(key, False)}")
                 for key, what in EXTRA_PIECES.items() if getattr(config, key, False)]
    if config.scale_embeddings and config.tie_word_embeddings:
        problems.append(("scale_embeddings", True, f"{spec.name} does not scale embeddings, and with a tied head the "
                         "scale cannot be folded into them; " + override("scale_embeddings", False)))
    return problems


def mapping_problems(config: PretrainedConfig, target: str, skip: Iterable[str] = ()) -> list[str]:
    """One line per field of a MiniTx `config` that keeps it from mapping onto `target` (empty: it maps); the
    fields in `skip` are left to the caller, which says them its own way."""
    if target not in STOCK_TARGETS:
        raise ValueError(f"--to {target!r} is not a stock architecture; choose one of {', '.join(STOCK_TARGETS)}")
    if config.is_encoder_decoder:
        return [f"is_encoder_decoder true: {STOCK_TARGETS[target].name} is decoder-only; "
                "export a model trained with --task causal-lm"]
    return [f"{key} {str(value).lower() if isinstance(value, bool) else value}: {how}"
            for key, value, how in _field_problems(config, target) if key not in set(skip)]


def check_maps(config: PretrainedConfig, target: str) -> None:
    """Refuse a config that does not map onto `target`: ExportRefused, one line per field."""
    problems = mapping_problems(config, target)
    if problems:
        raise refusal(STOCK_TARGETS[target].name, problems)


def refusal(target_name: str, problems: list[str]) -> ExportRefused:
    """The refusal of a config that does not map onto `target_name`: one numbered line per field, so that the
    command line's one error line (the lines joined with "; ") still tells the fields apart, then, for several, the
    one flag that sets them all."""
    lines = [f"({number}) {problem}" for number, problem in enumerate(problems, 1)]
    fixes = [found.rstrip(")") for problem in problems for found in re.findall(r"--config_overrides (\S+)", problem)]
    if len(fixes) > 1:
        lines.append(f"all at once: train with --config_overrides {','.join(fixes)}")
    return ExportRefused(f"the model does not map onto {target_name} ({len(problems)} field"
                         f"{'s' if len(problems) > 1 else ''} to change):\n" + "\n".join(lines))


def _common_config(config: PretrainedConfig) -> dict[str, object]:
    """The config fields every target shares with ours: the vocabulary, the tied head and the special tokens."""
    ids = {key: getattr(config, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return dict(vocab_size=config.vocab_size, tie_word_embeddings=config.tie_word_embeddings, **ids)


def _gpt2_config(config: PretrainedConfig) -> PretrainedConfig:
    """GPT-2's config for the MiniTx `config`."""
    return AutoConfig.for_model(
        "gpt2", n_embd=config.hidden_size, n_layer=config.num_hidden_layers, n_head=config.num_attention_heads,
        n_inner=config.intermediate_size, n_positions=config.max_position_embeddings,
        activation_function=GPT2_ACTIVATIONS[config.hidden_act], layer_norm_epsilon=config.layer_norm_eps,
        resid_pdrop=config.hidden_dropout, embd_pdrop=config.hidden_dropout, attn_pdrop=config.attention_dropout,
        initializer_range=config.initializer_range, **_common_config(config))


def _rotary_config(model_type: str, config: PretrainedConfig, **extra: object) -> PretrainedConfig:
    """Qwen3's or Llama's config (``model_type``) for the MiniTx `config`."""
    return AutoConfig.for_model(
        model_type, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim, hidden_act="silu",
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.layer_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        attention_bias=config.attention_bias, attention_dropout=config.attention_dropout,
        initializer_range=config.initializer_range, **extra, **_common_config(config))


def _llama_config(config: PretrainedConfig) -> PretrainedConfig:
    """Llama's config: Qwen3's fields, and the feed-forward's biases with the attention's (Qwen3 takes none)."""
    return _rotary_config("llama", config, mlp_bias=config.attention_bias)


def _embeddings(model: PreTrainedModel) -> torch.Tensor:
    """(vocab, hidden) token embeddings with the model's embedding scale folded in (untied heads only)."""
    decoder = model.model.decoder
    return decoder.embed_tokens.weight.detach() * decoder.embed_tokens.embed_scale


def _rotary_state_dict(model: PreTrainedModel, qk_norm: bool = False) -> dict[str, torch.Tensor]:
    """Llama's weight names -> our tensors (the SwiGLU's fc1 is `up_proj`, gate_proj the gate, fc2 `down_proj`);
    with ``qk_norm``, Qwen3's (Llama's and the per-head query and key norms)."""
    decoder, out = model.model.decoder, {}
    for index, layer in enumerate(decoder.layers):
        prefix, attention = f"model.layers.{index}.", layer.self_attn
        pieces = {"self_attn.q_proj": attention.q_proj, "self_attn.k_proj": attention.k_proj,
                  "self_attn.v_proj": attention.v_proj, "self_attn.o_proj": attention.o_proj,
                  "mlp.gate_proj": layer.mlp.gate_proj, "mlp.up_proj": layer.mlp.fc1, "mlp.down_proj": layer.mlp.fc2,
                  "input_layernorm": layer.self_attn_layer_norm, "post_attention_layernorm": layer.mlp_layer_norm}
        if qk_norm:
            pieces |= {"self_attn.q_norm": attention.q_norm, "self_attn.k_norm": attention.k_norm}
        for name, module in pieces.items():
            out |= {f"{prefix}{name}.{key}": value for key, value in module.state_dict().items()}
    out["model.norm.weight"] = decoder.norm.weight
    out["model.embed_tokens.weight"] = _embeddings(model)
    return out


def _conv1d(linear: torch.nn.Linear, size: int | None = None) -> dict[str, torch.Tensor]:
    """A Linear as GPT-2's Conv1D: weight (in, out), and a bias (zeros where the Linear has none)."""
    bias = linear.bias.detach() if linear.bias is not None else torch.zeros(size or linear.out_features)
    return {"weight": linear.weight.detach().t().contiguous(), "bias": bias}


def _repeat_heads(weight: torch.Tensor, groups: int, head_dim: int) -> torch.Tensor:
    """(kv_heads * head_dim, ...) key or value rows, each head repeated for its `groups` query heads (as GQA reads)."""
    return weight.unflatten(0, (-1, head_dim)).repeat_interleave(groups, dim=0).flatten(0, 1)


def _gpt2_attention(attention: torch.nn.Module) -> dict[str, torch.Tensor]:
    """GPT-2's fused c_attn (in, 3 * hidden) and c_proj; grouped key/value heads are repeated per query head."""
    groups, head_dim = attention.num_key_value_groups, attention.head_dim
    parts = []
    for linear, repeat in ((attention.q_proj, 1), (attention.k_proj, groups), (attention.v_proj, groups)):
        bias = linear.bias.detach() if linear.bias is not None else torch.zeros(linear.out_features)
        parts.append((_repeat_heads(linear.weight.detach(), repeat, head_dim), _repeat_heads(bias, repeat, head_dim)))
    weight, bias = torch.cat([w for w, _ in parts]), torch.cat([b for _, b in parts])  # (3 * hidden, in), (3 * hidden,)
    fused = {"c_attn.weight": weight.t().contiguous(), "c_attn.bias": bias}
    return fused | {f"c_proj.{key}": value for key, value in _conv1d(attention.o_proj).items()}


def _gpt2_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """GPT-2 weight names -> our tensors; the sinusoidal table becomes the (fixed) position table `wpe`."""
    decoder, out = model.model.decoder, {}
    for index, layer in enumerate(decoder.layers):
        prefix = f"transformer.h.{index}."
        out |= {f"{prefix}attn.{key}": value for key, value in _gpt2_attention(layer.self_attn).items()}
        for name, linear in (("c_fc", layer.mlp.fc1), ("c_proj", layer.mlp.fc2)):
            out |= {f"{prefix}mlp.{name}.{key}": value for key, value in _conv1d(linear).items()}
        for name, norm in (("ln_1", layer.self_attn_layer_norm), ("ln_2", layer.mlp_layer_norm)):
            out |= {f"{prefix}{name}.{key}": value for key, value in norm.state_dict().items()}
    out |= {f"transformer.ln_f.{key}": value for key, value in decoder.norm.state_dict().items()}
    out["transformer.wte.weight"] = _embeddings(model)
    out["transformer.wpe.weight"] = decoder.embed_positions.weight.detach()
    return out


@dataclass(frozen=True)
class StockTarget:
    """A stock transformers architecture that `minitx export --to` writes: what it asks of our config (beyond the
    pre-norm, uncapped, plain blocks every target asks), its config, and our tensors under its weight names. A new
    target is one entry of STOCK_TARGETS and its functions."""

    name: str  # as refusals and cards say it
    requirements: tuple[Requirement, ...]
    config: Callable[[PretrainedConfig], PretrainedConfig]
    state_dict: Callable[[PreTrainedModel], dict[str, torch.Tensor]]  # the head apart
    embeddings_key: str  # the token table's name, which a tied head shares
    sibling: str | None = None  # the target a refusal may name instead, where the model maps onto it


def _rotary(name: str, qk_norm: bool) -> tuple[Requirement, ...]:
    """What Qwen3 (``qk_norm``) and Llama ask: rotary positions, RMSNorm, SwiGLU, QK-norm or none; Qwen3 no biases."""
    return (Requirement("position_embedding_type", ("rope",), f"{name} uses rotary positions"),
            Requirement("norm_type", ("rmsnorm",), f"{name} uses RMSNorm"),
            Requirement("hidden_act", ("swiglu",), f"{name} uses swiglu"),
            Requirement("qk_norm", (True,), "Qwen3 normalises queries and keys") if qk_norm else
            Requirement("qk_norm", (False,), "Llama has no QK-norm",
                        "(export with --to qwen3, or to GGUF with --gguf_architecture qwen3 or auto)"),
            *([Requirement("attention_bias", (False,), "Qwen3's feed-forward has no biases (attention_bias sets them "
                           "here too)", "(export with --to llama)")] if qk_norm else []))


STOCK_TARGETS = {
    "qwen3": StockTarget("Qwen3", _rotary("Qwen3", qk_norm=True), partial(_rotary_config, "qwen3"),
                         partial(_rotary_state_dict, qk_norm=True), "model.embed_tokens.weight", sibling="llama"),
    "llama": StockTarget("Llama", _rotary("Llama", qk_norm=False), _llama_config, _rotary_state_dict,
                         "model.embed_tokens.weight", sibling="qwen3"),
    "gpt2": StockTarget("GPT-2", (
        Requirement("norm_type", ("layernorm",), "GPT-2 uses LayerNorm"),
        Requirement("qk_norm", (False,), "GPT-2 has no QK-norm"),
        Requirement("position_embedding_type", ("learned", "sinusoidal"), "GPT-2 adds a position table"),
        Requirement("hidden_act", tuple(GPT2_ACTIVATIONS), "GPT-2 has no gated feed-forward")),
        _gpt2_config, _gpt2_state_dict, "transformer.wte.weight"),
}
TARGETS = (*STOCK_TARGETS, "gguf")


def stock_config(config: PretrainedConfig, target: str) -> PretrainedConfig:
    """The transformers config of `target` that describes the same network as the MiniTx `config`."""
    return STOCK_TARGETS[target].config(config)


def stock_state_dict(model: PreTrainedModel, target: str) -> dict[str, torch.Tensor]:
    """Our causal LM's tensors under the target's weight names (the head included, tied or not)."""
    spec = STOCK_TARGETS[target]
    out = spec.state_dict(model)
    out["lm_head.weight"] = (out[spec.embeddings_key] if model.config.tie_word_embeddings
                             else model.lm_head.weight.detach())
    return {key: value.detach().clone().contiguous() for key, value in out.items()}


def to_stock_model(model: PreTrainedModel, target: str) -> PreTrainedModel:
    """The target's transformers model holding our weights (refused first when the config does not map)."""
    check_maps(model.config, target)
    stock = AutoModelForCausalLM.from_config(stock_config(model.config, target))
    stock.load_state_dict(stock_state_dict(model, target), strict=True)
    stock.tie_weights()
    return stock.eval()


@torch.no_grad()
def logit_difference(ours: PreTrainedModel, stock: PreTrainedModel, length: int = 16) -> float:
    """Largest |logit difference| / max(1, largest |logit|) of the two models on one fixed (1, length) sequence."""
    length = min(length, ours.config.max_position_embeddings)
    ids = (torch.arange(length) * 7919 % ours.config.vocab_size)[None]  # (1, length)
    expected = ours(ids, use_cache=False).logits.float()
    found = stock(ids, use_cache=False).logits.float()
    return float((found - expected).abs().max() / max(1.0, float(expected.abs().max())))


def check_same_logits(ours: PreTrainedModel, stock: PreTrainedModel, what: str) -> None:
    """Refuse an export whose logits differ from ours beyond float32 rounding (a mapping error, never expected)."""
    difference = logit_difference(ours, stock)
    if not math.isfinite(difference) or difference > CHECK_TOLERANCE:
        raise RuntimeError(f"the {what} gives other logits than the source (relative difference {difference:.2e}); "
                           "nothing was written. Please report this with the model's config.json")


def write_card(folder: Path, *, source: str, target: str, file_name: str, keywords: dict | None = None) -> None:
    """A short model card (README.md) naming the source model and how to load the export. ``base_model`` is a Hub
    repo id on the Hub: a local folder is named in the text only (the Hub would read it as a repo that is not)."""
    from huggingface_hub import ModelCardData

    hub_id = None if Path(source).expanduser().exists() else source
    data = ModelCardData(base_model=hub_id, library_name="transformers", pipeline_tag="text-generation",
                         tags=["hf_minitx", target])
    arguments = "".join(f", {key}={value!r}" for key, value in {
        **({"gguf_file": file_name} if file_name.endswith(".gguf") else {}), **(keywords or {})}.items())
    layout = "GGUF" if file_name.endswith(".gguf") else STOCK_TARGETS[target].name
    text = (f"---\n{data.to_yaml()}\n---\n\n# {Path(source).name or source} ({layout})\n\n"
            f"The hf_minitx model `{source}` exported by `minitx export`: the same weights in the {layout} layout "
            f"(`{file_name}`), with its tokenizer and generation settings. It loads without hf_minitx and without "
            f"`trust_remote_code`, with `AutoModelForCausalLM.from_pretrained(folder{arguments})`"
            + (" or llama.cpp" if layout == "GGUF" else "") + ", and gives the source model's logits"
            + (" to half precision's rounding (its matrices are stored as f16)" if "f16" in file_name else "") + ".\n"
            + ("\ntransformers' GGUF reader does not read `generation_config.json`: sample as the source model does "
               "with `model.generate(..., generation_config=GenerationConfig.from_pretrained(folder))`.\n"
               if layout == "GGUF" else ""))
    (folder / "README.md").write_text(text, encoding="utf-8")


@dataclass
class ExportArguments:
    """`minitx export`: a decoder-only model folder as a stock architecture or a GGUF file."""

    model: str = field(metadata={"help": "a saved hf_minitx decoder-only model folder (the --output_dir of a run)"})
    to: str = field(metadata={"help": "qwen3 (RMSNorm, SwiGLU, rotary, QK-norm), llama (the same without QK-norm), "
                                      "gpt2 (LayerNorm, learned positions, GELU), or gguf (a GGUF file)"})
    output_dir: str = field(metadata={"help": "the folder to write (new or empty; see --overwrite)"})
    gguf_architecture: str | None = field(default=None, metadata={
        "help": "with --to gguf only: qwen3, llama, or auto (the default: qwen3 with QK-norm, else llama)"})
    gguf_type: str | None = field(default=None, metadata={
        "help": "with --to gguf only: f32 (the default, exact) or f16 (half the size)"})
    overwrite: bool = field(default=False, metadata={"help": "replace an --output_dir minitx export made"})


def check_export_arguments(args: ExportArguments) -> None:
    """The choices of `minitx export`, before anything is read or written."""
    from .gguf_export import GGUF_ARCHITECTURES, GGUF_TYPES

    if args.to not in TARGETS:
        raise ValueError(f"--to {args.to!r} is not a target; choose one of {', '.join(TARGETS)}")
    given = [name for name in ("gguf_architecture", "gguf_type") if getattr(args, name) is not None]
    if given and args.to != "gguf":
        raise ValueError(f"--{given[0]} applies to --to gguf, not --to {args.to} (which writes float32 "
                         f"safetensors); drop it, or export with --to gguf")
    args.gguf_architecture, args.gguf_type = args.gguf_architecture or "auto", args.gguf_type or "f32"
    if args.gguf_architecture not in ("auto", *GGUF_ARCHITECTURES):
        raise ValueError(f"--gguf_architecture {args.gguf_architecture!r}: choose auto, "
                         f"{', '.join(GGUF_ARCHITECTURES)}")
    if args.gguf_type not in GGUF_TYPES:
        raise ValueError(f"--gguf_type {args.gguf_type!r}: choose one of {', '.join(GGUF_TYPES)}")


def _saver(model: PreTrainedModel, tokenizer, source: str, args: ExportArguments) -> Callable[[Path], None]:
    """What writes the export into a folder: the stock model or GGUF file, tokenizer, generation config, card."""
    from .gguf_export import gguf_architecture, gguf_problems, reader_keywords, write_gguf

    target = args.to
    if args.to == "gguf":
        target = gguf_architecture(model.config, args.gguf_architecture)
        lost = gguf_problems(model.config, target)  # said once per field: the GGUF form's reason wins
        problems = [*mapping_problems(model.config, target, skip=lost), *lost.values()]
        if problems:
            raise refusal(f"{STOCK_TARGETS[target].name} GGUF", problems)
    stock = to_stock_model(model, target)
    check_same_logits(model, stock, f"{STOCK_TARGETS[target].name} model")

    def save(folder: Path) -> None:
        if args.to == "gguf":  # the file holds the tokenizer: a tokenizer.json beside it would be read instead
            file_name = write_gguf(stock, tokenizer, folder, target=target, tensor_type=args.gguf_type, name=source)
        else:
            stock.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            file_name = "model.safetensors"
        (model.generation_config or GenerationConfig.from_model_config(model.config)).save_pretrained(folder)
        write_card(folder, source=source, target=target, file_name=file_name,
                   keywords=reader_keywords(model.config, target) if args.to == "gguf" else None)
        write_marker(folder, command="export", run_id=target)
    return save


def refuse_quantized(model: PreTrainedModel, source: str) -> None:
    """An export writes full-precision weights: a folder of quantized weights is refused, naming its method."""
    quantized = getattr(model.config, "quantization_config", None)
    if quantized is not None:
        method = (quantized.get("quant_method") if isinstance(quantized, dict)
                  else getattr(quantized, "quant_method", ""))
        method = getattr(method, "value", method)  # transformers' QuantizationMethod enum, or its string
        raise ExportRefused(f"{source} holds quantized weights ({method}): an export writes full-precision "
                            "weights; export the folder the quantized model was made from (a GGUF export can be "
                            "quantized with --gguf_type)")


def main(argv: Sequence[str] | None = None) -> Path:
    """`minitx export`: write the export of `--model` into `--output_dir`; returns the folder."""
    from ..cli import parse_arguments
    from ..inference import load_model_folder

    (args,) = parse_arguments([ExportArguments], argv, prog="minitx export", description=(
        "Export a decoder-only hf_minitx model to a stock transformers architecture (loads without "
        "trust_remote_code) or to a GGUF file (llama.cpp, Ollama)."))
    check_export_arguments(args)
    with output_folder(args.output_dir, command="export", flag="--overwrite", overwrite=args.overwrite,
                       inputs=[("--model", args.model)]) as output_dir:  # held to the end
        model, tokenizer = load_model_folder(args.model, device="cpu", dtype=torch.float32)
        refuse_quantized(model, args.model)
        write_folder(output_dir, _saver(model, tokenizer, args.model, args))
    print(f"exported {args.model} ({args.to}) to {output_dir}")
    return output_dir
