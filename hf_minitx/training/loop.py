"""Train a MiniTx model with Accelerate: parse arguments -> accelerator -> data -> model -> loop -> save.

Runs as ``minitx train ...`` or ``accelerate launch --num_processes N -m hf_minitx train ...``.
The loop knows nothing of the model's internals: it feeds batches, takes the logits and computes the
token cross-entropy itself, so that the loss of an optimizer step is the mean over the real (not -100)
label tokens of the whole accumulation window, on every process together.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import DatasetDict
from torch import nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase, get_scheduler

from ..data.corpus import (
    corpus_task,
    iter_training_texts,
    load_corpus,
    preprocess_seq2seq,
    seq2seq_collator,
    tokenize_and_pack,
)
from ..data.preprocessing import block_collator
from ..data.tokenizer import load_tokenizer, train_bpe_tokenizer
from ..device import describe_hardware, pick_device
from ..models import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration
from .arguments import (
    DataArguments,
    ModelArguments,
    TrainArguments,
    load_preset,
    parse_config_overrides,
    parse_training_args,
)
from .checkpoints import (
    CHECKPOINT_PREFIX,
    check_compatible,
    check_output_dir,
    clear_previous_run,
    list_checkpoints,
    read_run_state,
    resolve_checkpoint,
    rotate_checkpoints,
    write_run_state,
)
from .data_order import StepIndexedBatchSampler
from .evaluation import COVERAGE_KEYS, evaluate_generation, evaluate_loss, predicted_bytes, text_bytes
from .loss import count_label_tokens, summed_cross_entropy
from .outputs import append_metrics, save_final_model, truncate_metrics

TRACKERS = ("tensorboard", "trackio", "wandb")


class NonFiniteLossError(RuntimeError):
    """The training loss or the gradients became NaN/inf; training stopped before the optimizer step."""


# --- checks done before any work ------------------------------------------------------------------


def resolve_model_settings(model_args: ModelArguments, data_args: DataArguments) -> dict[str, Any]:
    """MiniTxConfig fields from the preset and the overrides; ``is_encoder_decoder`` follows the task."""
    settings = load_preset(model_args.preset)
    settings.update(parse_config_overrides(model_args.config_overrides))
    wants_seq2seq = data_args.task == "seq2seq"
    if "is_encoder_decoder" in settings and bool(settings["is_encoder_decoder"]) != wants_seq2seq:
        kind = "an encoder-decoder" if settings["is_encoder_decoder"] else "a decoder-only"
        raise ValueError(
            f"preset {model_args.preset!r} describes {kind} model but --task is {data_args.task!r}; "
            f"use --task {'seq2seq' if settings['is_encoder_decoder'] else 'causal-lm'} or another preset"
        )
    settings["is_encoder_decoder"] = wants_seq2seq
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"):
        settings.pop(key, None)  # these come from the tokenizer
    try:
        MiniTxConfig(**settings)
    except (TypeError, ValueError) as err:
        raise ValueError(f"invalid model settings from preset {model_args.preset!r} + overrides: {err}") from err
    return settings


def validate_arguments(
    model_settings: dict[str, Any], data_args: DataArguments, train_args: TrainArguments
) -> Path | None:
    """Raise a clear error for every bad input that can be seen before loading data.

    Returns the checkpoint folder to resume from, if any.
    """
    if not train_args.output_dir:
        raise ValueError("--output_dir is required: the folder for checkpoints and the final model")
    builtin_task = corpus_task(data_args.dataset) if data_args.dataset.startswith("builtin:") else None
    if builtin_task is not None and builtin_task != data_args.task:
        raise ValueError(
            f"task/dataset mismatch: {data_args.dataset} is a {builtin_task} corpus but --task is {data_args.task!r}; "
            f"use --task {builtin_task} or a {data_args.task} dataset"
        )
    max_positions = model_settings.get("max_position_embeddings", MiniTxConfig().max_position_embeddings)
    lengths = {"block_size": data_args.block_size} if data_args.task == "causal-lm" else {
        "max_source_length": data_args.max_source_length, "max_target_length": data_args.max_target_length}
    for name, value in lengths.items():
        if value > max_positions:
            raise ValueError(
                f"--{name} {value} is larger than the model's max_position_embeddings ({max_positions}); lower it, "
                f"or raise the limit with --config_overrides max_position_embeddings={value}"
            )
    positive = {
        "per_device_train_batch_size": train_args.per_device_train_batch_size,
        "per_device_eval_batch_size": train_args.per_device_eval_batch_size,
        "gradient_accumulation_steps": train_args.gradient_accumulation_steps,
        "logging_steps": train_args.logging_steps,
    }
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    if train_args.max_steps is not None and train_args.max_steps < 1:
        raise ValueError(f"--max_steps must be >= 1, got {train_args.max_steps}")
    if train_args.max_steps is None and train_args.num_epochs <= 0:
        raise ValueError(f"--num_epochs must be > 0 (or give --max_steps), got {train_args.num_epochs}")
    if not 0.0 <= train_args.label_smoothing < 1.0:
        raise ValueError(f"--label_smoothing must be in [0, 1), got {train_args.label_smoothing}")
    trackers = [t.strip() for t in train_args.report_to.split(",") if t.strip() and t.strip() != "none"]
    unknown = sorted(set(trackers) - set(TRACKERS))
    if unknown:
        raise ValueError(f"--report_to {unknown} is not supported; choose none or from {TRACKERS}")
    if train_args.push_to_hub and not train_args.hub_model_id:
        raise ValueError("--push_to_hub needs --hub_model_id USER/NAME")
    if data_args.task == "seq2seq":
        try:
            import sacrebleu  # noqa: F401
        except ImportError as err:
            raise ImportError("seq2seq evaluation needs sacrebleu: pip install 'hf_minitx[demo]'") from err
    if data_args.tokenizer and not Path(data_args.tokenizer).is_dir():
        raise FileNotFoundError(
            f"--tokenizer {data_args.tokenizer} is not a folder; give a saved tokenizer folder (e.g. tokenizer/) "
            "or leave it out to train one on the corpus"
        )
    resuming = train_args.resume_from_checkpoint is not None
    check_output_dir(train_args.output_dir, overwrite=train_args.overwrite_output_dir, resuming=resuming)
    if not resuming:
        return None
    checkpoint = resolve_checkpoint(train_args.resume_from_checkpoint, train_args.output_dir)
    stored = read_run_state(checkpoint)
    check_compatible(checkpoint, stored, run_identity(model_settings, data_args))
    return checkpoint


def run_identity(model_settings: dict[str, Any], data_args: DataArguments) -> dict[str, Any]:
    """What a checkpoint must share with the run that resumes it."""
    return {
        "model_settings": model_settings, "task": data_args.task, "dataset": data_args.dataset,
        "dataset_config": data_args.dataset_config, "block_size": data_args.block_size,
        "sample_by": data_args.sample_by,
    }


# --- data -----------------------------------------------------------------------------------------


def get_tokenizer(
    data_args: DataArguments, corpus: Any, output_dir: Path, max_length: int, accelerator: Accelerator,
    reuse_saved: bool, seed: int,
) -> PreTrainedTokenizerBase:
    """The given tokenizer folder, or a byte-level BPE trained on the training split (saved in output_dir)."""
    if data_args.tokenizer:
        return load_tokenizer(data_args.tokenizer)
    if not (reuse_saved and (output_dir / "tokenizer.json").is_file()):
        if accelerator.is_main_process:
            accelerator.print(f"training a {data_args.tokenizer_vocab_size}-token BPE tokenizer on {data_args.dataset}")
            tokenizer = train_bpe_tokenizer(
                iter_training_texts(corpus["train"], max_texts=data_args.tokenizer_max_texts, seed=seed),
                data_args.tokenizer_vocab_size, model_max_length=max_length,
                add_eos_token=data_args.task == "seq2seq",  # sources end with EOS, in training and in use
            )
            tokenizer.save_pretrained(output_dir)
        accelerator.wait_for_everyone()
    return load_tokenizer(str(output_dir))


def _first_rows(split: Any, limit: int | None) -> Any:
    return split if limit is None or limit >= len(split) else split.select(range(limit))


def prepare_data(
    corpus: Any, tokenizer: PreTrainedTokenizerBase, data_args: DataArguments, train_args: TrainArguments
) -> dict[str, Any]:
    """Model-ready train/validation sets, the collator and the texts used by generation metrics."""
    if data_args.task == "causal-lm":
        collate = block_collator(tokenizer)
        train = tokenize_and_pack(DatasetDict(train=corpus["train"]), tokenizer, data_args.block_size,
                                  num_proc=data_args.num_proc)["train"]
        validation = tokenize_and_pack(DatasetDict(validation=corpus["validation"]), tokenizer, data_args.block_size,
                                       num_proc=data_args.num_proc, for_evaluation=True)["validation"]
        if data_args.max_eval_samples is None:  # the whole validation text, as it stands in the corpus
            num_bytes = text_bytes(t for batch in corpus["validation"].iter(1000) for t in batch["text"])
        else:  # opt-in subset: the bytes of the tokens it scores
            validation = _first_rows(validation, data_args.max_eval_samples)
            num_bytes = predicted_bytes(collate(list(validation))["labels"].tolist(), tokenizer)
        prompts = [" ".join(text.split()[:6]) for text in corpus["validation"]["text"][:8] if text.strip()]
        return {"train": train, "validation": validation, "collate": collate, "prompts": prompts,
                "num_bytes": num_bytes}
    features = preprocess_seq2seq(
        corpus, tokenizer, max_source_length=data_args.max_source_length,
        max_target_length=data_args.max_target_length, num_proc=data_args.num_proc,
    )
    pairs = _first_rows(corpus["validation"], train_args.generation_eval_samples)
    return {
        "train": features["train"],
        "validation": _first_rows(features["validation"], data_args.max_eval_samples),
        "collate": seq2seq_collator(tokenizer),
        "sources": list(pairs["source"]),
        "references": list(pairs["target"]),
        "prompts": list(corpus["validation"]["source"][:8]),
        "num_bytes": None,
    }


# --- model and optimizer --------------------------------------------------------------------------


def build_model(settings: dict[str, Any], tokenizer: PreTrainedTokenizerBase) -> nn.Module:
    """A fresh MiniTx model whose vocabulary and special ids come from the tokenizer."""
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    missing = [name for name, value in ids.items() if value is None]
    if missing:
        raise ValueError(f"the tokenizer lacks {missing}; use a tokenizer with <pad>, <bos> and <eos> tokens")
    config = MiniTxConfig(**settings, vocab_size=len(tokenizer), **ids, decoder_start_token_id=ids["bos_token_id"])
    cls = MiniTxForConditionalGeneration if config.is_encoder_decoder else MiniTxForCausalLM
    return cls(config)


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices, none on biases, norms and embeddings."""
    decay, no_decay, seen = [], [], set()
    for module in model.modules():
        kind = type(module).__name__.lower()
        exempt = isinstance(module, (nn.Embedding, nn.LayerNorm)) or "embed" in kind or "norm" in kind
        for param in module.parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            (no_decay if exempt or param.ndim < 2 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_accelerator(train_args: TrainArguments) -> Accelerator:
    """An Accelerator with the requested mixed precision (auto: bf16 on CUDA, none elsewhere)."""
    precision = train_args.mixed_precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    trackers = [t.strip() for t in train_args.report_to.split(",") if t.strip() and t.strip() != "none"]
    return Accelerator(
        # Without an accelerator device, cpu=True lets a torchrun-style launch (accelerate launch --multi_gpu
        # --num_processes N) become a multi-CPU (gloo) job instead of N unrelated single-process runs.
        cpu=pick_device().type == "cpu",
        mixed_precision=precision,
        gradient_accumulation_steps=train_args.gradient_accumulation_steps,
        log_with=trackers or None,
        project_dir=train_args.output_dir,
        dynamo_backend="inductor" if train_args.compile else None,
    )


def _set_threads(accelerator: Accelerator, requested: int | None) -> None:
    if accelerator.device.type != "cpu":
        return
    threads = requested or max(1, (os.cpu_count() or 1) // max(1, accelerator.num_processes))
    torch.set_num_threads(threads)


# --- the loop -------------------------------------------------------------------------------------


def _window(batches: Iterator[dict], size: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    return [{k: v.to(device) for k, v in next(batches).items()} for _ in range(size)]


def model_inputs(batch: dict[str, torch.Tensor], seq2seq: bool) -> dict[str, torch.Tensor]:
    """What the model is called with: the whole batch for seq2seq (the model builds its decoder inputs
    from the labels), the batch without labels for causal LM (the loss is computed here, not twice)."""
    return batch if seq2seq else {key: value for key, value in batch.items() if key != "labels"}


def _input_tokens(batch: dict[str, torch.Tensor], shift: bool) -> torch.Tensor:
    """Real tokens the model read: labelled causal positions, or source + target tokens for seq2seq."""
    if shift:
        return (batch["labels"] != -100).sum()
    return batch["attention_mask"].sum() + (batch["labels"] != -100).sum()


@torch.no_grad()
def sample_generations(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, prompts: list[str], *, seq2seq: bool, seed: int,
    max_new_tokens: int,
) -> list[dict[str, str]]:
    """A few generations for a human to look at; the global RNG state is left untouched."""
    if not prompts:
        return []
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        if seq2seq:
            from .evaluation import generate_texts

            outputs = generate_texts(model, tokenizer, prompts, max_new_tokens=max_new_tokens, do_sample=False)
        else:
            encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            if model.config.position_embedding_type != "rope":  # stay inside the position table
                room = model.config.max_position_embeddings - encoded["input_ids"].shape[1]
                max_new_tokens = max(1, min(max_new_tokens, room))
            generated = model.generate(
                **encoded, max_new_tokens=max_new_tokens, do_sample=True, top_k=40, temperature=0.8,
            )  # (batch, prompt + new)
            new_tokens = generated[:, encoded["input_ids"].shape[1]:]  # (batch, new)
            outputs = [text.strip() for text in tokenizer.batch_decode(new_tokens, skip_special_tokens=True)]
    model.train(was_training)
    return [{"prompt": p, "output": o} for p, o in zip(prompts, outputs, strict=True)]


def train(model_args: ModelArguments, data_args: DataArguments, train_args: TrainArguments) -> Path:
    """Run one training job end to end; returns the output folder holding the final model."""
    # 1. arguments: every check that needs no data happens here
    model_settings = resolve_model_settings(model_args, data_args)
    checkpoint = validate_arguments(model_settings, data_args, train_args)
    output_dir = Path(train_args.output_dir)
    seq2seq = data_args.task == "seq2seq"
    shift = not seq2seq

    # 2. accelerator
    accelerator = make_accelerator(train_args)
    _set_threads(accelerator, train_args.num_threads)
    k = train_args.gradient_accumulation_steps
    global_batch = train_args.per_device_train_batch_size * accelerator.num_processes
    if checkpoint is not None:
        stored = read_run_state(checkpoint)
        if stored.get("global_batch_size") != global_batch * k:
            raise ValueError(
                f"checkpoint {checkpoint} was trained with a global batch of {stored.get('global_batch_size')} rows "
                f"per step, this run uses {global_batch * k} (batch x processes x accumulation); keep them equal to "
                "resume at the exact data position"
            )
    if accelerator.is_main_process:
        if train_args.overwrite_output_dir and checkpoint is None:
            clear_previous_run(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()
    set_seed(train_args.seed)

    # 3. data
    with accelerator.main_process_first():
        corpus = load_corpus(
            data_args.dataset, task=data_args.task, dataset_config=data_args.dataset_config,
            text_column=data_args.text_column, source_column=data_args.source_column,
            target_column=data_args.target_column, validation_split=data_args.validation_split,
            seed=train_args.seed, num_examples=data_args.num_examples, sample_by=data_args.sample_by,
        )
    max_length = model_settings.get("max_position_embeddings", MiniTxConfig().max_position_embeddings)
    tokenizer = get_tokenizer(data_args, corpus, output_dir, max_length, accelerator,
                              reuse_saved=checkpoint is not None, seed=train_args.seed)
    with accelerator.main_process_first():
        data = prepare_data(corpus, tokenizer, data_args, train_args)
    if train_args.sample_prompts:
        data["prompts"] = [p.strip() for p in train_args.sample_prompts.split("|") if p.strip()]
    data["prompts"] = data["prompts"][: train_args.num_sample_generations]

    # 4. model, optimizer, schedule
    set_seed(train_args.seed)
    model = build_model(model_settings, tokenizer)
    num_parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(
        parameter_groups(model, train_args.weight_decay), lr=train_args.learning_rate,
        betas=(train_args.adam_beta1, train_args.adam_beta2), eps=train_args.adam_epsilon,
    )
    sampler_probe = StepIndexedBatchSampler(len(data["train"]), train_args.per_device_train_batch_size,
                                            num_processes=accelerator.num_processes, seed=train_args.seed)
    batches_per_epoch = sampler_probe.batches_per_epoch
    total_steps = train_args.max_steps or max(1, math.ceil(train_args.num_epochs * batches_per_epoch / k))
    scheduler = get_scheduler(
        train_args.lr_scheduler_type, optimizer, num_warmup_steps=train_args.warmup_steps,
        num_training_steps=total_steps,
    )
    eval_loader = DataLoader(data["validation"], batch_size=train_args.per_device_eval_batch_size,
                             collate_fn=data["collate"])
    model, optimizer, eval_loader = accelerator.prepare(model, optimizer, eval_loader)
    accelerator.register_for_checkpointing(scheduler)  # stepped by us, once per optimizer step

    # 5. resume
    global_step, tokens_seen, train_seconds = 0, 0, 0.0
    if checkpoint is not None:
        accelerator.load_state(str(checkpoint))
        state = read_run_state(checkpoint)
        global_step, tokens_seen, train_seconds = state["step"], state["tokens_seen"], state["train_seconds"]
        if accelerator.is_main_process:
            truncate_metrics(output_dir, global_step)
        accelerator.print(f"resumed from {checkpoint} at step {global_step}")
    train_loader = DataLoader(  # its own generator: iterating must not draw from the global (dropout) RNG
        data["train"], collate_fn=data["collate"], generator=torch.Generator().manual_seed(train_args.seed),
        batch_sampler=StepIndexedBatchSampler(
            len(data["train"]), train_args.per_device_train_batch_size, num_processes=accelerator.num_processes,
            process_index=accelerator.process_index, seed=train_args.seed, start=global_step * k,
        ),
    )
    if accelerator.trackers:
        config = {**asdict(model_args), **asdict(data_args), **asdict(train_args)}
        accelerator.init_trackers("hf_minitx", config={k_: v for k_, v in config.items() if v is not None})

    identity = run_identity(model_settings, data_args)
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    generation_kwargs = {"max_new_tokens": data_args.max_target_length, "num_beams": train_args.generation_num_beams,
                         "do_sample": False,
                         "max_source_length": data_args.max_source_length,
                         "batch_size": train_args.per_device_eval_batch_size * 4}
    last_samples: list[dict[str, str]] = []
    coverage: dict[str, Any] = {}

    def evaluate(step: int) -> dict[str, float]:
        nonlocal last_samples
        metrics = evaluate_loss(model, eval_loader, accelerator, shift=shift, num_bytes=data["num_bytes"],
                                inputs=lambda batch: model_inputs(batch, seq2seq))
        coverage.update(evaluation_coverage(metrics, data, data_args))
        if seq2seq and data["sources"]:
            gen_metrics, predictions = evaluate_generation(
                unwrapped, tokenizer, data["sources"], data["references"], accelerator, **generation_kwargs)
            metrics.update(gen_metrics)
            n = train_args.num_sample_generations
            last_samples = [{"prompt": s, "output": p, "reference": r} for s, p, r in
                            zip(data["sources"][:n], predictions[:n], data["references"][:n], strict=True)]
        elif accelerator.is_main_process:
            last_samples = sample_generations(unwrapped, tokenizer, data["prompts"], seq2seq=seq2seq,
                                              seed=train_args.seed, max_new_tokens=48)
        if accelerator.is_main_process:
            append_metrics(output_dir, {"type": "eval", "step": step, **metrics})
            shown = ", ".join(f"{k_.removeprefix('eval_')} {v:.4g}" for k_, v in metrics.items())
            tqdm.write(f"[eval step {step}] {shown}")
            for sample in last_samples:
                tqdm.write(f"  {sample['prompt']!r} -> {sample['output']!r}")
        accelerator.log(metrics, step=step)
        return metrics

    def save_checkpoint(step: int) -> None:
        path = output_dir / f"{CHECKPOINT_PREFIX}{step}"
        accelerator.save_state(str(path), safe_serialization=False)  # every process saves its RNG state
        if accelerator.is_main_process:
            write_run_state(path, {**identity, "step": step, "tokens_seen": tokens_seen,
                                   "train_seconds": train_seconds, "global_batch_size": global_batch * k,
                                   "seed": train_args.seed})
            rotate_checkpoints(output_dir, train_args.save_total_limit)
        accelerator.wait_for_everyone()

    # 6. the loop
    model.train()
    batches = iter(train_loader)
    progress = tqdm(total=total_steps, initial=global_step, desc=f"training {output_dir.name}",
                    disable=not accelerator.is_local_main_process or train_args.disable_tqdm, unit="step")
    budget = train_args.max_minutes * 60 if train_args.max_minutes else None
    start = time.perf_counter() - train_seconds
    cpu_start = time.process_time()
    interval = {"nats": 0.0, "tokens": 0, "input_tokens": 0, "start": time.perf_counter()}
    metrics: dict[str, float] = {}
    last_eval_step = -1
    stopped_early = False
    while global_step < total_steps:
        window = _window(batches, k, accelerator.device)
        time_up = budget is not None and accelerator.is_main_process and time.perf_counter() - start > budget
        counts = torch.stack([
            sum(count_label_tokens(b["labels"], shift) for b in window),
            sum(_input_tokens(b, shift) for b in window),
            torch.tensor(int(time_up), device=accelerator.device),
        ]).long()
        label_tokens, input_tokens, time_flag = accelerator.reduce(counts, "sum").tolist()
        if time_flag:
            stopped_early = True
            accelerator.print(f"time budget of {train_args.max_minutes} min reached at step {global_step}")
            break
        # Each micro-batch's summed loss is divided by the window's global token count; backward divides by
        # k and DDP averages over processes, so both factors are put back here.
        scale = accelerator.num_processes * k / max(label_tokens, 1)
        window_nats = torch.zeros((), dtype=torch.float64, device=accelerator.device)
        for batch in window:
            with accelerator.accumulate(model):
                logits = model(**model_inputs(batch, seq2seq)).logits  # (batch, seq, vocab)
                summed = summed_cross_entropy(logits, batch["labels"], shift=shift,
                                              label_smoothing=train_args.label_smoothing)
                accelerator.backward(summed * scale)
            window_nats += summed.detach().double()
        step_loss = accelerator.reduce(window_nats, "sum").item() / max(label_tokens, 1)
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), train_args.max_grad_norm or float("inf"))
        if not math.isfinite(step_loss) or (accelerator.scaler is None and not math.isfinite(float(grad_norm))):
            last = list_checkpoints(output_dir)
            where = f"the last good checkpoint is {last[-1]}" if last else "no checkpoint was saved"
            raise NonFiniteLossError(
                f"training stopped at step {global_step + 1}: the loss is {step_loss} and the gradient norm "
                f"{float(grad_norm)}; the weights were not updated and {where}. Try a lower --learning_rate, a "
                "longer --warmup_steps, --max_grad_norm 1.0 or --mixed_precision no, then resume with "
                "--resume_from_checkpoint latest."
            )
        learning_rate = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        global_step += 1
        tokens_seen += input_tokens
        interval["nats"] += step_loss * label_tokens
        interval["tokens"] += label_tokens
        interval["input_tokens"] += input_tokens
        train_seconds = time.perf_counter() - start
        progress.update(1)

        if global_step % train_args.logging_steps == 0 or global_step == total_steps:
            seconds = max(time.perf_counter() - interval["start"], 1e-9)
            loss = interval["nats"] / max(interval["tokens"], 1)
            record = {"type": "train", "step": global_step,
                      "epoch": global_step * k / batches_per_epoch, "loss": loss, "learning_rate": learning_rate,
                      "tokens_per_second": interval["input_tokens"] / seconds, "tokens_seen": tokens_seen,
                      "elapsed_seconds": train_seconds}
            if accelerator.is_main_process:
                append_metrics(output_dir, record)
                progress.set_postfix(loss=f"{loss:.3f}", lr=f"{learning_rate:.2e}",
                                     tok_s=f"{record['tokens_per_second']:.0f}")
            accelerator.log({"train_loss": loss, "learning_rate": learning_rate}, step=global_step)
            interval.update(nats=0.0, tokens=0, input_tokens=0, start=time.perf_counter())
        if train_args.eval_steps and global_step % train_args.eval_steps == 0:
            metrics, last_eval_step = evaluate(global_step), global_step
        if train_args.checkpointing_steps and global_step % train_args.checkpointing_steps == 0:
            save_checkpoint(global_step)
    progress.close()

    # 7. final evaluation and save
    if last_eval_step != global_step:
        metrics = evaluate(global_step)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        summary = {
            "task": data_args.task, "dataset": data_args.dataset, "dataset_config": data_args.dataset_config,
            "hub_dataset": is_hub_dataset(data_args.dataset), "steps": global_step, "tokens_seen": tokens_seen,
            "train_seconds": round(train_seconds, 2), "hardware": describe_hardware(accelerator.device,
                                                                                    accelerator.num_processes),
            "mixed_precision": accelerator.mixed_precision, "num_processes": accelerator.num_processes,
            "final_metrics": metrics, "evaluation": coverage, "sample_generations": [
                {"prompt": s["prompt"], "output": s["output"]} for s in last_samples],
            "preset": model_args.preset, "seed": train_args.seed, "num_parameters": num_parameters,
            "config_overrides": model_args.config_overrides, "stopped_by_time_budget": stopped_early,
            "tokens_per_second": round(tokens_seen / max(train_seconds, 1e-9), 1),
            "train_cpu_seconds": round(time.process_time() - cpu_start, 2),  # this process, this session
        }
        save_final_model(unwrapped, tokenizer, output_dir, summary,
                         max_new_tokens=data_args.max_target_length if seq2seq else 128,
                         push_to=train_args.hub_model_id if train_args.push_to_hub else None)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return output_dir


def evaluation_coverage(metrics: dict[str, float], data: dict[str, Any], data_args: DataArguments) -> dict[str, Any]:
    """What the validation figures cover (popped from ``metrics``): rows, scored tokens, text bytes."""
    counts = {key.removeprefix("eval_"): metrics.pop(key) for key in COVERAGE_KEYS if key in metrics}
    coverage = {"split": "validation", "rows": len(data["validation"]), **counts,
                "whole_split": data_args.max_eval_samples is None}
    if "sources" in data:
        coverage["generation_pairs"] = len(data["sources"])
    return coverage


def is_hub_dataset(dataset: str) -> bool:
    """Whether ``--dataset`` names a Hub dataset (not a builtin, not local files)."""
    if dataset.startswith("builtin:") or any(ch in dataset for ch in "*?,"):
        return False
    return not Path(dataset).expanduser().exists()


def main(argv: list[str] | None = None) -> Path:
    """`minitx train [ARGS.json|yaml] --name value ...`."""
    model_args, data_args, train_args = parse_training_args(argv)
    return train(model_args, data_args, train_args)

