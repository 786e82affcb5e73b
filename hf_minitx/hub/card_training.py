"""The model card's training table: rows from training_summary.json (the run, its budget's plan and phases,
the recipe), and the number and text formats the card shares (``human``, ``duration``, ``sanitize``)."""

from __future__ import annotations

import math


def human(count: float, unit: str = "") -> str:
    """12_345_678 -> '12.3M'."""
    for threshold, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if count >= threshold:
            return f"{count / threshold:.1f}{suffix}{unit}"
    return f"{count:.4g}{unit}"  # 333.283 -> '333.3', as the larger counts keep one decimal


def duration(seconds: float) -> str:
    """3725.2 -> '1 h 2 min 5 s'."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours} h"] if hours else []
    if hours or minutes:
        parts.append(f"{minutes} min")
    parts.append(f"{secs} s")
    return " ".join(parts)


def training_rows(summary: dict) -> list[tuple[str, str]]:
    """(name, value) rows with the recorded training figures."""
    rows = []
    if summary.get("preset"):
        rows.append(("Preset", f"`{summary['preset']}`"))
    if summary.get("config_overrides"):
        rows.append(("Config overrides", f"`{sanitize(summary['config_overrides'])}`"))
    rows += _shape_plan_rows(summary.get("shape_plan"))
    rows += _phases_rows(summary.get("phases"))
    kept, both = _kept_phase(summary), ""  # two phases: the steps are the kept model's, tokens and time the run's
    if kept:
        phases, both = summary["phases"], " (both phases)"
        steps = sum(int((phases.get(name) or {}).get("steps") or 0) for name in ("teacher", "student"))
    if summary.get("steps") is not None:
        rows.append(("Optimizer steps", f"{int(summary['steps']):,}"
                     + (f" (the {kept}'s; both phases: {steps:,})" if kept else "")))
    if summary.get("tokens_seen") is not None:
        rows.append(("Training tokens", f"{int(summary['tokens_seen']):,} ({human(summary['tokens_seen'])}){both}"))
    if summary.get("train_seconds") is not None:
        rows.append(("Training time", duration(float(summary["train_seconds"])) + both))
        if summary.get("tokens_seen"):
            rate = summary.get("tokens_per_second") or summary["tokens_seen"] / max(float(summary["train_seconds"]),
                                                                                    1e-9)
            rows.append(("Throughput", f"{human(rate)} tokens/s"))
    rows += _budget_rows(summary)
    if summary.get("hardware"):
        rows.append(("Hardware", str(summary["hardware"])))
    if summary.get("num_processes"):
        rows.append(("Processes", str(summary["num_processes"])))
    if summary.get("mixed_precision"):
        precision = str(summary["mixed_precision"])  # what the steps ran in, not what was asked
        text = "none (fp32)" if precision == "no" else precision
        if summary.get("mixed_precision_asked"):
            text += f"; {summary['mixed_precision_asked']} was asked, which the device does not run"
        rows.append(("Mixed precision", text))
    if summary.get("seed") is not None:
        rows.append(("Seed", str(summary["seed"])))
    teacher = summary.get("distilled_from")
    if isinstance(teacher, dict):
        rows.append(("Distilled from", f"`{sanitize(str(teacher.get('path')))}` (weights sha256 "
                     f"{str(teacher.get('weights_digest'))[:12]}): KL weight {teacher.get('weight')} at "
                     f"temperature {teacher.get('temperature')}"))
    return rows + _recipe_rows(summary.get("recipe") or {}, summary.get("steps"))


def _kept_phase(summary: dict) -> str | None:
    """"teacher" or "student": the model a run in two phases kept (None for a run of one model)."""
    phases = summary.get("phases")
    return phases.get("model_kept") if isinstance(phases, dict) and isinstance(phases.get("teacher"), dict) else None


def _shape_plan_rows(shape_plan: dict | None) -> list[tuple[str, str]]:
    """The shape a time budget chose, the candidates it timed and the rule (none for a shape given by hand)."""
    if not isinstance(shape_plan, dict):
        return []
    timed = describe_shape_candidates(shape_plan.get("candidates", []))
    return [("Shape", f"{shape_plan.get('chosen')}, chosen by the time budget: {shape_plan.get('rule')} ({timed})")]


def _phases_rows(phases: dict | None) -> list[tuple[str, str]]:
    """A row for a budget spent on two models: the teacher's and the student's figures, and the one kept."""
    if not isinstance(phases, dict) or not isinstance(phases.get("teacher"), dict):
        return []

    def phase(name: str) -> str:
        figures = phases.get(name) or {}
        return (f"{name} {figures.get('steps')} steps, {figures.get('passes'):.1f} passes, validation loss "
                f"{figures.get('eval_loss', float('nan')):.4f}")

    return [("Two models", f"one model would have passed over the data {phases.get('passes_of_one_model'):g} times "
             f"(more than {phases.get('passes_per_model'):g}): a teacher, then a student learning from it (KL term); "
             f"{phase('teacher')}; {phase('student')}; this folder holds the {phases.get('model_kept')}")]


def describe_shape_candidates(candidates: list[dict]) -> str:
    """One line of the shapes a time budget timed: step time, planned passes, effective tokens per parameter."""
    return "; ".join(f"{c['shape']}: {c['seconds_per_step'] * 1000:.0f} ms a step, {c['planned_passes']:g} passes, "
                     f"{c['tokens_per_parameter']:g} tokens per parameter" for c in candidates)


def _listed(steps: list[int]) -> str:
    """``[92]`` -> "92"; ``[92, 154, 1200]`` -> "92, 154 and 1,200"."""
    shown = [f"{step:,}" for step in steps]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def _budget_rows(summary: dict) -> list[tuple[str, str]]:
    """Rows of the budget's plan and what ran, the passes over the data, the weights kept and the temperature."""
    rows, phase = [], _kept_phase(summary)  # two phases: the model the folder holds
    budget = summary.get("time_budget") or {}
    if budget.get("planned_steps"):
        ended = "the plan ran to its end" if budget.get("ended_by") == "plan" else "the clock stopped it first"
        if budget.get("replanned_at_steps"):
            ended += f"; laid again at the steps' pace at step {_listed(budget['replanned_at_steps'])}"
        planned_for = (f" (planned for {budget['planned_for_minutes']:g} min before a resume)"
                       if budget.get("planned_for_minutes") else "")
        minutes = f"{budget['budget_minutes']:g} min"
        if phase:  # the kept model's own budget is its share of the split (a resume may have moved its clock)
            phases = summary["phases"]
            share = phases[f"{phase}_minutes"]
            minutes = f"{phases['minutes']:g} min in two phases, the {phase}'s {share:.3g} min"
            if not budget.get("planned_for_minutes") and not math.isclose(budget["budget_minutes"], share,
                                                                         rel_tol=1e-3):
                minutes += f" ({budget['budget_minutes']:g} min given to a resume)"
        how = (f"after a {budget['probe_steps']}-step timed probe" if budget.get("seconds_per_step") is not None
               else f"without a timed probe (no more than its {budget['probe_steps']} steps were asked)")
        rows.append(("Time budget", f"{minutes}: {budget['planned_steps']:,} steps planned{planned_for} {how}; "
                     f"{budget['steps_run']:,} ran ({ended})"))
    if summary.get("epochs") is not None:
        whose = f" (the {phase}'s)" if phase else ""
        rows.append(("Passes over the training data", f"{float(summary['epochs']):.2f}{whose}"))
    kept = summary.get("kept") or {}
    if kept and kept.get("step") != kept.get("last_step"):
        rows.append(("Weights kept", f"step {kept['step']:,} (best validation loss {kept['eval_loss']:.4f}; the last "
                     f"step, {kept['last_step']:,}, scored {kept['last_eval_loss']:.4f})"))
    elif kept.get("not_chosen"):  # an earlier evaluation scored better, on too few tokens to choose by
        rows.append(("Weights kept", f"the last step's, {kept['last_step']:,}: {kept['not_chosen']}"))
    fit = summary.get("calibration") or {}
    if fit.get("logit_scale", 1.0) != 1.0:
        rows.append(("Temperature", f"the logits divided by {fit['temperature']:g}, folded into the final norm: fitted "
                     f"on {fit['fitted_on_tokens']:,} validation tokens, loss {fit['fitted_loss_before']:.4f} → "
                     f"{fit['fitted_loss_after']:.4f}"))
    return rows


def _momentum_text(group: dict) -> str:
    """", momentum 0.85" (Muon) or ", betas (0.9, 0.98)" (AdamW) of a recorded group; "" for older records."""
    if "momentum" in group:
        return f", momentum {group['momentum']:g}"
    if "betas" in group:
        return ", betas ({:g}, {:g})".format(*group["betas"])
    return ""


def _recipe_rows(recipe: dict, steps: int | None = None) -> list[tuple[str, str]]:
    """(name, value) rows of the recorded recipe: optimizer and its groups, schedule, batch, lengths, clipping,
    late dropout (``steps``: the steps that ran)."""
    rows = []
    if recipe.get("optimizer"):
        rows.append(("Optimizer", f"`{recipe['optimizer']}`"))
    for group in recipe.get("parameter_groups") or []:
        rows.append((f"Group `{group['name']}`", f"{group['optimizer']}, peak lr {group['learning_rate']:g}, "
                     f"weight decay {group['weight_decay']:g}{_momentum_text(group)}, {group['tensors']} tensors, "
                     f"{int(group['parameters']):,} parameters"))
    schedule = recipe.get("schedule") or {}
    if schedule.get("unplanned"):
        rows.append(("Schedule", f"`{schedule['type']}`, {schedule['warmup_steps']} warmup steps; "
                                 f"{schedule['unplanned']}"))
    elif schedule:
        text = f"`{schedule['type']}`, {schedule['warmup_steps']} warmup steps, {schedule['total_steps']:,} steps"
        if "decay_steps" in schedule:
            text += f", linear decay over the last {schedule['decay_steps']:,} to {schedule['min_lr_ratio']:g} x peak"
        if schedule.get("peak_reached") is False:
            text += " (the warmup outlasted the run: the peak rate was never reached)"
        for change in schedule.get("schedule_changes") or []:
            text += (f"; from step {change['step']:,} laid over {change['total_steps']:,} steps instead of "
                     f"{change['total_steps_before']:,} (a resume)")
        rows.append(("Schedule", text))
    if recipe.get("global_batch_size"):
        rows.append(("Batch", f"{recipe['global_batch_size']} rows per optimizer step "
                     f"({recipe.get('per_device_train_batch_size')} per process x "
                     f"{recipe.get('gradient_accumulation_steps', 1)} accumulation)"))
    for key, name in (("block_size", "Block size"), ("max_source_length", "Source length"),
                      ("max_target_length", "Target length")):
        if recipe.get(key):
            rows.append((name, f"{recipe[key]} tokens"))
    if recipe.get("max_grad_norm"):
        rows.append(("Gradient clipping", f"{recipe['max_grad_norm']:g}"))
    late = recipe.get("late_dropout")
    if late:
        text = (f"{late['probability']:g} on the embeddings and sub-layer outputs from step {late['from_step']:,}, "
                f"after {late['after_passes']:g} passes over the training data")
        reached = steps is None or steps > late["from_step"]
        rows.append(("Late dropout", text if reached else f"none: the run ended before step {late['from_step']:,}, "
                     f"where {late['probability']:g} would have started"))
    return rows


def sanitize(text: str, limit: int = 300) -> str:
    """One line, no backticks or pipes, at most `limit` characters: safe inside inline code in a table cell."""
    flat = " ".join(str(text).replace("`", "'").replace("|", "/").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


__all__ = ["describe_shape_candidates", "duration", "human", "sanitize", "training_rows"]
