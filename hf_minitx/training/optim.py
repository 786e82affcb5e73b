"""The optimizer and the learning-rate schedule of a run, built in one place.

    build_optimizer(model, args)                      -> AdamW, or Muon + AdamW as one optimizer
    build_scheduler(optimizer, args, total_steps)     -> a transformers schedule, stepped once per optimizer step
    relay_schedule(scheduler, args, total_steps)      -> the same schedule laid over another length (a time budget)
    describe_optimizer(optimizer)                     -> the groups (lr, weight decay, parameter count) for the record

Parameters fall into three kinds (``partition_parameters``), each exactly once:

- ``matrices``: the 2-D weights inside the blocks (attention and feed-forward projections);
- ``head``: an untied output head (a tied one *is* the token embedding);
- ``embeddings``: the 2-D embedding tables (tokens, learned positions; a tied head is the token table);
- ``no_decay``: norm weights, every bias and every other 1-D parameter.

``adamw``: AdamW on all of them, weight decay on ``matrices`` and ``head``, ``--embedding_weight_decay`` on
``embeddings``. ``muon``: torch's ``torch.optim.Muon``
(``Muon`` below: float32 orthogonalisation on a CPU) on ``matrices`` (momentum, then the update orthogonalised
by Newton-Schulz iterations), AdamW on the rest. A new optimizer is one entry of ``OPTIMIZERS``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch import nn
from transformers import get_scheduler, get_wsd_schedule


class OptimizerArguments(Protocol):
    """The fields of TrainArguments the optimizer and the schedule read."""

    optimizer: str
    learning_rate: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_epsilon: float
    muon_learning_rate: float
    muon_momentum: float
    muon_weight_decay: float
    cautious_weight_decay: bool
    embedding_weight_decay: float
    lr_scheduler_type: str
    warmup_steps: int
    decay_ratio: float
    min_lr_ratio: float


def partition_parameters(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """{"matrices", "head", "embeddings", "no_decay"}: every trainable parameter of ``model`` in exactly one list.

    Embeddings and norms are recognised by module type (``nn.Embedding``, ``nn.LayerNorm``) or by a class name
    holding "embed" or "norm" (RMSNorm, rotary tables); the head is ``model.get_output_embeddings()`` when it
    is not tied to the input embeddings.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_ids = {id(p) for p in head.parameters()} if head is not None else set()
    groups: dict[str, list[nn.Parameter]] = {"matrices": [], "head": [], "embeddings": [], "no_decay": []}
    seen: set[int] = set()
    for module in model.modules():
        kind = type(module).__name__.lower()
        table = isinstance(module, nn.Embedding) or "embed" in kind
        exempt = table or isinstance(module, nn.LayerNorm) or "norm" in kind
        for param in module.parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            if table and param.ndim == 2:
                groups["embeddings"].append(param)
            elif exempt or param.ndim < 2:
                groups["no_decay"].append(param)
            elif id(param) in head_ids:
                groups["head"].append(param)
            else:
                groups["matrices"].append(param)
    return groups


class Muon(torch.optim.Muon):
    """torch's ``torch.optim.Muon`` (its groups, momentum buffers and checkpoint format), with the orthogonalisation
    in float32 on a CPU.

    Each step, per matrix: momentum ``buf = mu * buf + (1 - mu) * grad``, the Nesterov update
    ``grad + mu * (buf - grad)``, five Newton-Schulz iterations that replace the update by the nearest
    semi-orthogonal matrix (all its singular values near 1), then ``p -= lr * sqrt(max(1, rows / cols)) * update``
    after decoupled weight decay ``p -= lr * wd * p``. A group with ``cautious`` set decays only the entries whose
    update has the weight's sign, those the update already moves toward zero (``--cautious_weight_decay``).
    torch runs the iterations in bfloat16, which is fast on GPUs but many times slower than float32 on CPUs without
    bfloat16 units (docs/training.md, "Muon's cost on a CPU"); off the CPU this class is torch's Muon unchanged
    (cautious decay runs this float32 step on every device).
    """

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        cautious = any(group.get("cautious") for group in self.param_groups)
        if not cautious and any(p.device.type != "cpu" for group in self.param_groups for p in group["params"]):
            return super().step(closure)
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params, grads, buffers = [], [], []
            self._init_group(group, params, grads, buffers)
            mu, lr = group["momentum"], float(group["lr"])
            by_shape: dict[tuple[int, int], list[tuple[torch.Tensor, torch.Tensor]]] = {}
            for param, grad, buffer in zip(params, grads, buffers, strict=True):
                buffer.lerp_(grad, 1 - mu)
                update = grad.lerp(buffer, mu) if group["nesterov"] else buffer
                by_shape.setdefault(tuple(param.shape), []).append((param, update))
            for (rows, cols), pairs in by_shape.items():  # one batched iteration per shape: fewer, larger products
                stacked = torch.stack([update.float() for _, update in pairs])  # (matrices, rows, cols)
                updates = newton_schulz(stacked, group["ns_coefficients"], group["ns_steps"], group["eps"])
                for (param, _), update in zip(pairs, updates, strict=True):
                    decay_weight(param, update, lr * group["weight_decay"], group.get("cautious", False))
                    param.add_(update.to(param.dtype), alpha=-lr * math.sqrt(max(1.0, rows / cols)))
        return loss


def decay_weight(param: torch.Tensor, update: torch.Tensor, rate: float, cautious: bool) -> None:
    """Decoupled weight decay ``param -= rate * param``, before ``update`` (the direction subtracted from
    ``param``) is applied. Cautious: only where ``update`` and ``param`` share a sign, so the decay never pulls
    against the gradient's own step (Slowrun's and modded-nanogpt's cautious decay)."""
    if rate == 0.0:
        return
    if not cautious:
        param.mul_(1 - rate)
        return
    agree = (update * param > 0).to(param.dtype)  # (rows, cols): 1 where the update shrinks |param| too
    param.sub_(param * agree, alpha=rate)


GRAM_MAX_STEPS = 5  # torch.optim.Muon's default ns_steps; beyond it the Gram form's rounding can blow up


def newton_schulz(matrix: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """An approximately semi-orthogonal matrix with the singular vectors of ``matrix`` (rows, cols), or of each
    matrix of a stack (n, rows, cols), by the quintic Newton-Schulz iteration X <- aX + (bA + cA^2)X, A = XX^T,
    on the wide orientation (short, long). A stack runs as batched products: on a CPU, small same-shaped matrices
    iterate faster together than one by one, where each product is too small to split between threads.

    Every iterate is P X0 with P a polynomial in A0 = X0 X0^T, so when the long side is at least twice the short one
    the iteration runs on (short, short) matrices (``gram_newton_schulz``), for fewer FLOPs. Its rounding grows in
    the directions of (near-)zero singular values with every step, as it is never reset from X: at up to
    ``GRAM_MAX_STEPS`` steps it stays within ~1e-3 of the exact iteration (relative to the largest entry) even for
    rank-1 updates, where the plain float32 form is within ~3e-4 and torch's bfloat16 one much coarser (tested);
    longer iterations take the plain form.
    """
    single = matrix.dim() == 2
    stack = matrix.unsqueeze(0) if single else matrix  # (n, rows, cols)
    tall = stack.size(1) > stack.size(2)
    wide = stack.mT if tall else stack  # (n, short, long): the Gram matrices stay small
    x = wide / wide.norm(dim=(1, 2), keepdim=True).clamp(min=eps)  # spectral norm <= Frobenius norm <= 1
    if x.size(2) >= 2 * x.size(1) and steps <= GRAM_MAX_STEPS:
        x = gram_newton_schulz(x, coefficients, steps)
    else:
        a, b, c = coefficients
        for _ in range(steps):
            gram = x @ x.mT  # (n, short, short)
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.mT if tall else x
    return x[0] if single else x


def gram_newton_schulz(x: torch.Tensor, coefficients: tuple[float, float, float], steps: int) -> torch.Tensor:
    """The Newton-Schulz iterate of each wide matrix of ``x`` (n, short, long), computed on its Gram matrix.

    With A = X X^T and P = aI + bA + cA^2, one step maps X to P X and A to P A P = P^2 A (P and A commute), so
    ``steps`` steps are the product Q of the P's applied once to x: 4 (short, short) products per step plus
    two (short, long) ones, instead of 3 products with a (short, long) operand per step.
    """
    a, b, c = coefficients
    gram = x @ x.mT  # (n, short, short)
    eye = torch.eye(gram.size(1), dtype=gram.dtype, device=gram.device)
    product = None
    for step in range(steps):
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c).add_(eye, alpha=a)  # aI + bA + cA^2
        product = poly if product is None else poly @ product
        if step < steps - 1:
            gram = poly @ gram @ poly
    return product @ x if product is not None else x


class CombinedOptimizer(torch.optim.Optimizer):
    """Several torch optimizers stepped as one: one object for ``accelerator.prepare``, the checkpoint
    (``state_dict`` holds each part's state under its name) and the schedule.

    ``param_groups`` are read from the parts at every access (loading a state replaces a part's group dicts), so a
    schedule that sets ``group["lr"]`` always sets it in the part that owns the group.
    """

    def __init__(self, parts: dict[str, torch.optim.Optimizer]) -> None:
        self.parts = parts
        super().__init__([{"params": [torch.zeros(0)]}], {})  # hooks and bookkeeping; the groups are the parts'

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for part in self.parts.values() for group in part.param_groups]

    @param_groups.setter
    def param_groups(self, value: Any) -> None:
        pass  # set by Optimizer.__init__; the parts own the groups

    @property
    def state(self) -> dict:  # read-only merged view: each part keeps its own state
        return {p: s for part in self.parts.values() for p, s in part.state.items()}

    @state.setter
    def state(self, value: Any) -> None:
        pass  # set by Optimizer.__init__; the parts own the state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = closure() if closure is not None else None
        for part in self.parts.values():
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts.values():
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {name: part.state_dict() for name, part in self.parts.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        missing = sorted(set(self.parts) - set(state_dict))
        if missing:
            raise ValueError(f"the saved optimizer state lacks {missing}: it was saved by another --optimizer")
        for name, part in self.parts.items():
            part.load_state_dict(state_dict[name])


def _adamw(groups: list[dict[str, Any]], args: OptimizerArguments) -> torch.optim.AdamW:
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=args.learning_rate,
                             betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)


def _named(name: str, params: list[nn.Parameter], **settings: Any) -> dict[str, Any]:
    return {"params": params, "name": name, **settings}


def embedding_groups(kinds: dict[str, list[nn.Parameter]], args: OptimizerArguments) -> list[dict[str, Any]]:
    """The AdamW groups of the embedding tables and the undecayed rest: the tables join ``adamw_no_decay`` unless
    ``--embedding_weight_decay`` is set, when they are a group of their own (so that a run without it keeps the
    groups, and the checkpoints, of a run made before the option)."""
    if not args.embedding_weight_decay:
        return [_named("adamw_no_decay", kinds["embeddings"] + kinds["no_decay"], weight_decay=0.0)]
    return [_named("adamw_embeddings", kinds["embeddings"], weight_decay=args.embedding_weight_decay),
            _named("adamw_no_decay", kinds["no_decay"], weight_decay=0.0)]


def adamw_optimizer(model: nn.Module, args: OptimizerArguments) -> torch.optim.Optimizer:
    """AdamW everywhere: decoupled weight decay on the matrices and an untied head, the embeddings' own on the
    tables, none elsewhere."""
    kinds = partition_parameters(model)
    return _adamw([_named("adamw_decay", kinds["matrices"] + kinds["head"], weight_decay=args.weight_decay),
                   *embedding_groups(kinds, args)], args)


def muon_optimizer(model: nn.Module, args: OptimizerArguments) -> torch.optim.Optimizer:
    """Muon on the hidden matrices (``--muon_learning_rate``), AdamW on the head (decayed) and on embeddings,
    norms and biases (``--learning_rate``)."""
    kinds = partition_parameters(model)
    if not kinds["matrices"]:
        raise ValueError("--optimizer muon found no hidden 2-D matrix to optimise; use --optimizer adamw")
    muon = Muon([_named("muon", kinds["matrices"], cautious=args.cautious_weight_decay)], lr=args.muon_learning_rate,
                momentum=args.muon_momentum, weight_decay=args.muon_weight_decay)
    adamw = _adamw([_named("adamw_head", kinds["head"], weight_decay=args.weight_decay),
                    *embedding_groups(kinds, args)], args)
    return CombinedOptimizer({"muon": muon, "adamw": adamw})


OPTIMIZERS: dict[str, Callable[[nn.Module, OptimizerArguments], torch.optim.Optimizer]] = {
    "adamw": adamw_optimizer,
    "muon": muon_optimizer,
}


def check_optimizer_name(name: str, option: str = "--optimizer") -> None:
    """Refuse an optimizer ``OPTIMIZERS`` does not hold, listing those it does."""
    if name not in OPTIMIZERS:
        raise ValueError(f"{option} {name!r} is not known; choose one of {sorted(OPTIMIZERS)}")


def build_optimizer(model: nn.Module, args: OptimizerArguments) -> torch.optim.Optimizer:
    """The optimizer ``args.optimizer`` names (see ``OPTIMIZERS``), over every trainable parameter once."""
    check_optimizer_name(args.optimizer)
    return OPTIMIZERS[args.optimizer](model, args)


def build_scheduler(optimizer: torch.optim.Optimizer, args: OptimizerArguments,
                    total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """transformers' schedule ``args.lr_scheduler_type`` over ``total_steps`` optimizer steps; every group's
    learning rate follows it from its own peak.

    ``warmup_stable_decay``: linear warmup, the peak held, then a linear decay to ``min_lr_ratio`` x peak over the
    last ``decay_ratio`` of the steps (``transformers.get_wsd_schedule``).
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_factor(args, total_steps))


def schedule_factor(args: OptimizerArguments, total_steps: int) -> Callable[[int], float]:
    """The learning-rate factor at each step (a fraction of the peak) of transformers' schedule over
    ``total_steps``; built on a one-parameter optimizer, so that only the function is kept."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    if args.lr_scheduler_type == "warmup_stable_decay":
        warmup, decay = wsd_phases(args, total_steps)
        scheduler = get_wsd_schedule(probe, num_warmup_steps=warmup, num_decay_steps=decay,
                                     num_training_steps=total_steps, decay_type="linear",
                                     min_lr_ratio=args.min_lr_ratio)
    else:
        scheduler = get_scheduler(args.lr_scheduler_type, probe, num_warmup_steps=args.warmup_steps,
                                  num_training_steps=total_steps)
    return scheduler.lr_lambdas[0]


def wsd_phases(args: OptimizerArguments, total_steps: int) -> tuple[int, int]:
    """(warmup, decay) steps of warmup_stable_decay over ``total_steps``: the decay is ``decay_ratio`` of the run
    (at least 1 step), and the warmup is cut to the steps before it when the run is too short for both."""
    decay = max(1, round(args.decay_ratio * total_steps))
    return min(args.warmup_steps, max(0, total_steps - decay)), decay


def relay_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, args: OptimizerArguments, total_steps: int) -> None:
    """Lay the schedule over ``total_steps`` from now on (a time budget's plan, fixed after its probe): every
    group's factor function is replaced and the current learning rates follow it at the current step."""
    factor = schedule_factor(args, total_steps)
    scheduler.lr_lambdas = [factor] * len(scheduler.lr_lambdas)
    rates = [base * factor(scheduler.last_epoch) for base in scheduler.base_lrs]
    for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    scheduler._last_lr = rates


MAX_LEARNING_RATE = 10.0  # far above any rate that trains: a larger one is a typo (or inf), refused up front


def check_optimizer_arguments(args: OptimizerArguments) -> None:
    """Learning rates positive, finite and below MAX_LEARNING_RATE, weight decay finite, ratios in range (before
    any work)."""
    check_optimizer_name(args.optimizer)
    for name in ("learning_rate", "muon_learning_rate"):
        value = getattr(args, name)
        if not 0 < value <= MAX_LEARNING_RATE:  # NaN fails every comparison
            raise ValueError(f"--{name} must be > 0 and at most {MAX_LEARNING_RATE:g} (usual rates: 1e-4 to 0.05), "
                             f"got {value}")
    for name in ("muon_weight_decay", "embedding_weight_decay"):
        if not 0 <= getattr(args, name) < math.inf:
            raise ValueError(f"--{name} must be >= 0 and finite, got {getattr(args, name)}")
    for name in ("decay_ratio", "min_lr_ratio"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            raise ValueError(f"--{name} must be in [0, 1], got {getattr(args, name)}")
    if not 0.0 <= args.muon_momentum < 1.0:
        raise ValueError(f"--muon_momentum must be in [0, 1), got {args.muon_momentum}")


def describe_optimizer(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """One record per parameter group: name, optimizer, peak lr, weight decay, momentum (Muon: its Nesterov
    momentum; AdamW: its betas), tensors and parameters."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds ours
    parts = inner.parts if isinstance(inner, CombinedOptimizer) else {type(inner).__name__.lower(): inner}
    return [{"name": group.get("name", f"{kind}_{i}"), "optimizer": type(part).__name__,
             "learning_rate": group.get("initial_lr", group["lr"]), "weight_decay": group["weight_decay"],
             **_momentum(group), "tensors": len(group["params"]), "parameters": _count(group["params"])}
            for kind, part in parts.items() for i, group in enumerate(part.param_groups)]


def _momentum(group: dict[str, Any]) -> dict[str, Any]:
    """{"momentum": mu} of a Muon group, {"betas": [b1, b2]} of an Adam group, {} otherwise."""
    if "betas" in group:
        return {"betas": [float(b) for b in group["betas"]]}
    return {"momentum": float(group["momentum"])} if "momentum" in group else {}


def _count(params: Iterable[torch.Tensor]) -> int:
    return sum(p.numel() for p in params)


def describe_schedule(args: OptimizerArguments, total_steps: int) -> dict[str, Any]:
    """The schedule as a record: its type, the warmup it runs, total steps (and, for WSD, the decay). A WSD warmup
    cut short to fit the decay is recorded as run, with ``warmup_steps_asked`` beside it; the other schedules keep
    ramping at the asked pace, so a warmup as long as the run is recorded with ``peak_reached: False``."""
    record: dict[str, Any] = {"type": args.lr_scheduler_type, "warmup_steps": args.warmup_steps,
                              "total_steps": total_steps}
    if args.lr_scheduler_type == "warmup_stable_decay":
        warmup, decay = wsd_phases(args, total_steps)
        record.update(warmup_steps=warmup, decay_steps=decay, decay_ratio=args.decay_ratio,
                      min_lr_ratio=args.min_lr_ratio)
        if warmup != args.warmup_steps:
            record["warmup_steps_asked"] = args.warmup_steps
    elif args.warmup_steps >= total_steps > 0:  # the asked ramp runs, cut by the end of the run
        record["peak_reached"] = False
    return record


def warmup_cut_warning(schedule: dict[str, Any]) -> str | None:
    """The warning for a schedule record whose warmup was cut short (``describe_schedule``), or None."""
    total = schedule["total_steps"]
    if "warmup_steps_asked" in schedule:
        return (f"--warmup_steps {schedule['warmup_steps_asked']} is cut to {schedule['warmup_steps']}: the run has "
                f"{total} steps and decays over the last {schedule['decay_steps']} (lower --warmup_steps or "
                "--decay_ratio, or train longer)")
    if schedule.get("peak_reached") is False:
        return (f"--warmup_steps {schedule['warmup_steps']} is not shorter than the run ({total} steps): the learning "
                "rate rises for the whole run and never reaches its peak (lower --warmup_steps, or train longer)")
    return None
