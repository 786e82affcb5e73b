"""The run folder (``--output_dir``) of `minitx train`, from the lock to the claim.

    lock_output_folder   the folder's lock, taken before any work: a second run on it stops at once
    get_tokenizer        a freshly trained tokenizer waits in a hidden staging folder private to this launch
    claim_output_folder  once every check passed: a new run empties (or creates) the folder, a resumed run keeps it
    settle_replaced      a replaced folder's old contents: deleted once training stops, back where nothing was made
    abandon_setup        an interruption before the first step removes what this run wrote, and says what is left
"""

from __future__ import annotations

import glob
import shutil
import uuid
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase

from ..data.corpus import iter_training_texts
from ..data.tokenizer import PADDING_SIDES, load_tokenizer, train_bpe_tokenizer
from ..folders import (
    PARTIAL_SUFFIX,
    describe_contents,
    drop_set_aside,
    launch_id,
    lock_folder,
    move_files_into,
    put_back,
    read_marker,
    replace_folder,
    unlock_folder,
    write_marker,
)
from ..launch import is_first_process
from .checkpoints import write_failure
from .run_plan import RunPlan


def tokenizer_staging(plan: RunPlan) -> Path:
    """Where a freshly trained tokenizer waits (a hidden sibling of output_dir, private to this launch) until the
    folder is claimed."""
    return plan.output_dir.with_name(f".{plan.output_dir.name}.tokenizer-{launch_id()}{PARTIAL_SUFFIX}")


def lock_output_folder(plan: RunPlan) -> None:
    """Take output_dir's lock before any work (the launch's first process), so that a second run on the same
    folder is refused before it reads data or trains a tokenizer. A folder made to hold the lock is noted:
    ``release_unclaimed`` removes it when the run stops before claiming it."""
    if not is_first_process():
        return
    made = not plan.output_dir.exists()
    lock_folder(plan.output_dir, command="train")  # a live writer refuses (and nothing is noted)
    plan.made_folder = made
    pattern = f".{glob.escape(plan.output_dir.name)}.tokenizer-*{PARTIAL_SUFFIX}"
    for orphan in plan.output_dir.parent.glob(pattern):  # only the lock holder stages: these are a killed run's
        if orphan != tokenizer_staging(plan):
            shutil.rmtree(orphan, ignore_errors=True)
            print(f"note: removed {orphan}, a tokenizer left half-saved by a run that was killed")
    for aside in plan.output_dir.parent.glob(f".{glob.escape(plan.output_dir.name)}.replaced-*"):  # the user's
        print(f"note: {aside} holds what {plan.output_dir} held before a run that was killed replaced it; move it "
              "back or delete it yourself")


def release_unclaimed(plan: RunPlan) -> None:
    """After a failure before the folder was claimed: no staging folder is left, and a folder made only to hold
    the lock is removed (its lock with it)."""
    shutil.rmtree(tokenizer_staging(plan), ignore_errors=True)
    settle_replaced(plan, restore=True)  # claimed, but no step was made: the replaced folder's contents come back
    if plan.claimed is None and plan.made_folder:
        unlock_folder(plan.output_dir)
        shutil.rmtree(plan.output_dir, ignore_errors=True)


def get_tokenizer(plan: RunPlan, corpus: Any, accelerator: Accelerator) -> PreTrainedTokenizerBase:
    """The given tokenizer folder, the one a resumed run saved, or a byte-level BPE trained on the training
    split (the main process trains it into ``tokenizer_staging``; ``claim_output_folder`` moves it in)."""
    data_args, output_dir = plan.data_args, plan.output_dir
    if data_args.tokenizer or (plan.checkpoint is not None and (output_dir / "tokenizer.json").is_file()):
        tokenizer = load_tokenizer(data_args.tokenizer or str(output_dir))
        tokenizer.padding_side = PADDING_SIDES[data_args.task]  # this model's side, whatever corpus trained it
        return tokenizer
    staging = tokenizer_staging(plan)
    if accelerator.is_main_process:
        accelerator.print(f"training a {data_args.tokenizer_vocab_size}-token BPE tokenizer on {data_args.dataset}")
        tokenizer = train_bpe_tokenizer(
            iter_training_texts(corpus["train"], max_texts=data_args.tokenizer_max_texts, seed=plan.train_args.seed,
                                max_chars=data_args.tokenizer_max_chars),
            data_args.tokenizer_vocab_size, model_max_length=plan.config.max_position_embeddings,
            add_eos_token=data_args.task == "seq2seq",  # sources end with EOS, in training and in use
            padding_side=PADDING_SIDES[data_args.task],
        )
        shutil.rmtree(staging, ignore_errors=True)
        try:
            tokenizer.save_pretrained(staging)
        except BaseException as error:  # an interruption (or a full disk) leaves no half-saved staging folder
            shutil.rmtree(staging, ignore_errors=True)
            failure = write_failure(error, staging, output_dir)
            if failure is error:
                raise
            raise failure from None
    accelerator.wait_for_everyone()
    return load_tokenizer(str(staging))


def claim_output_folder(plan: RunPlan) -> str:
    """Main process, once every check passed: the only place a run's old folder is replaced. A new run
    empties (or creates) output_dir and marks it; a resumed run keeps it. Returns the run id."""
    if plan.checkpoint is None:
        folder = plan.output_dir
        plan.claimed = ("missing" if plan.made_folder or not folder.exists()
                        else "replaced" if describe_contents(folder) else "empty")
        # setup may fail, a time budget's probe may find it too short: the old contents wait aside (settle_replaced)
        run_id, plan.set_aside = replace_folder(plan.output_dir, command="train", keep_old=True)
    else:
        plan.claimed = "resumed"
        lock_folder(plan.output_dir, command="train")
        marker = read_marker(plan.output_dir)
        run_id = (marker or {}).get("run_id") or plan.resume_state.get("run_id") or uuid.uuid4().hex[:12]
        if marker is None:
            write_marker(plan.output_dir, command="train", run_id=run_id)
    staging = tokenizer_staging(plan)
    if staging.is_dir():
        move_files_into(staging, plan.output_dir)
    return run_id


def abandon_setup(plan: RunPlan | None) -> str:
    """After an interruption before the first step: remove what this run wrote (the tokenizer staging
    folder; a new run's marker and tokenizer), and say in one line what is left."""
    if plan is None:
        return "interrupted before training started; nothing was written"
    kept_aside = plan.set_aside is not None
    release_unclaimed(plan)  # the old contents kept aside are back
    folder = plan.output_dir
    if plan.claimed == "resumed":
        return f"interrupted before training resumed; the run in {folder} is as it was: resume it again"
    if kept_aside:
        return f"interrupted before training started; {folder} holds its old contents again: nothing was replaced"
    if plan.claimed == "missing":
        shutil.rmtree(folder, ignore_errors=True)
    elif plan.claimed in ("empty", "replaced"):  # holds only what this run put there
        for path in folder.iterdir():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    if plan.claimed == "replaced":  # a mount point, emptied in place: nothing could be kept aside
        return (f"interrupted before training started; the old contents of {folder} had already been replaced "
                "(--overwrite_output_dir), so it is left empty")
    return "interrupted before training started; nothing was written"


def settle_replaced(plan: RunPlan, *, restore: bool) -> bool:
    """The old contents of a folder this run replaced (``claim_output_folder`` kept them aside): with ``restore``
    (setup failed or was interrupted, or a time budget ran out inside its probe: no model and nothing to resume),
    they take the folder's place again and what the run wrote is deleted; otherwise (training stopped: its model or
    a checkpoint to resume is there) they are deleted. True when they were put back."""
    aside, plan.set_aside = plan.set_aside, None
    if aside is None or not aside.is_dir():
        return False
    if restore:
        put_back(plan.output_dir, aside)
    else:
        drop_set_aside(aside)
    return restore
