"""The `minitx` command (also `python -m hf_minitx`): one subcommand per job, one way of handling errors.

    minitx train --task causal-lm --dataset builtin:pydocs --preset tiny --max_steps 50 --output_dir out
    minitx generate --model out --prompt "def "
    accelerate launch --multi_gpu --num_processes 2 -m hf_minitx train ...

Every subcommand is a module with `main(argv)`; its arguments are dataclasses (a help line per field) read
by `parse_arguments`, and `minitx SUB --help` lists them. Bad input ends in one `error: ...` line and exit
code 2, never a traceback (set HF_MINITX_TRACEBACK=1 to see one).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

USER_ERRORS = (ValueError, OSError, ImportError, KeyError)  # OSError: files, and the Hub (HubError)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
INTERRUPTED_AT_START = "interrupted while starting; nothing was written"


class Interrupted(Exception):
    """A command stopped on a signal after saving what it could; ``exit_code`` is 128 + the signal number."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Subcommand:
    """A subcommand: its name, one line of help, and the module whose `main(argv)` runs it."""

    name: str
    help: str
    module: str


SUBCOMMANDS = (
    Subcommand("train", "train a decoder-only or encoder-decoder model with Accelerate", "hf_minitx.training.loop"),
    Subcommand("generate", "generate with a saved model folder", "hf_minitx.inference"),
    Subcommand("train-tokenizer", "train a byte-level BPE tokenizer on a corpus", "hf_minitx.data.tokenizer"),
    Subcommand("push", "upload a model folder to the Hub, or stage and check it with --dry_run",
               "hf_minitx.hub.push"),
    Subcommand("export", "a decoder-only model as a stock Qwen3, Llama or GPT-2 folder, or as a GGUF file",
               "hf_minitx.hub.export"),
    Subcommand("visualize", "draw attention, positions, masks, parameters or training curves",
               "hf_minitx.tools.visualize"),
    Subcommand("explore", "one self-contained HTML page: tokens, attention, predictions, checkpoints, the model",
               "hf_minitx.tools.explore"),
    Subcommand("experiment", "the paper's toy tasks (copy, reverse, post-LN vs pre-LN) and comparisons",
               "hf_minitx.tools.experiments"),
    Subcommand("benchmark", "hf_minitx side by side with GPT-2, BART and torch.nn.Transformer",
               "hf_minitx.tools.benchmark.run"),
    Subcommand("benchmark-report", "rewrite docs/benchmark-results.md and README.md's headline from benchmark JSON",
               "hf_minitx.tools.benchmark.report"),
    Subcommand("demo", "train a KJV language model and a number translator offline, then generate",
               "hf_minitx.tools.demo"),
    Subcommand("check-device", "compare a saved model on a GPU with the CPU, and cached generation",
               "hf_minitx.tools.device_check"),
)


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage + error; we print one line that says where the help is."""

    def error(self, message: str) -> None:  # noqa: D102
        raise SystemExit(_fail(f"{message} (see `{self.prog} --help`)"))


def parse_arguments(
    types: Sequence[type], argv: Sequence[str] | None, *, prog: str, description: str | None = None,
    defaults: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """Parse `argv` into instances of the dataclasses `types` (transformers' HfArgumentParser).

    `defaults` replaces field defaults (e.g. from an arguments file); unknown arguments are an error.
    """
    from transformers import HfArgumentParser
    from transformers.hf_argparser import string_to_bool

    class Parser(HfArgumentParser, _OneLineErrorParser):
        pass

    parser = Parser(list(types), prog=prog, description=description, allow_abbrev=False,  # --max_st is no option:
                    formatter_class=argparse.RawDescriptionHelpFormatter)  # a prefix would pass the checks below
    for action in parser._actions:  # `bool | None` fields (None: the task decides) take `--flag` alone, as bools do
        if action.type is string_to_bool and action.nargs is None:
            action.nargs, action.const = "?", True
        if isinstance(action, argparse._StoreFalseAction) and action.option_strings[0].startswith("--no_"):
            action.help = f"turn --{action.dest} off (it is on by default)"  # HfArgumentParser copies the flag's help
    if defaults:
        parser.set_defaults(**defaults)
    argv = merge_repeated(list(argv or []))
    check_lists_given_once(parser, argv)
    *parsed, extra = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if extra:
        raise ValueError(_unused_message(argv, extra))
    for args in parsed:
        check_seed(getattr(args, "seed", None))
        check_word_sized(args)
    return tuple(parsed)


def check_word_sized(args: Any) -> None:
    """Refuse a whole number past 64 bits, naming its option: torch, numpy and itertools would each refuse it later
    in their own words (an overflow, at the first evaluation of a run already under way)."""
    for name, value in vars(args).items():
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.maxsize:
            raise ValueError(f"--{name} {value} is past what a 64-bit count holds (at most {sys.maxsize})")


def check_at_least(values: dict[str, float | None], least: float, *, hint: str = "") -> None:
    """Refuse the first option of ``values`` (name -> value as parsed; None: left out) below ``least``, naming it."""
    for name, value in values.items():
        if value is not None and value < least:
            raise ValueError(f"--{name} must be >= {least}{hint}, got {value}")


def check_fraction(name: str, value: float, *, hint: str = "") -> None:
    """Refuse an option outside [0, 1): a probability, a share or a rate that must leave something."""
    if not 0.0 <= value < 1.0:
        raise ValueError(f"--{name} must be in [0, 1){hint}, got {value}")


SEED_LIMIT = 2**32  # numpy's and the tokenizer trainer's seeds are unsigned 32-bit


def check_seed(seed: int | None) -> None:
    """Refuse a --seed outside [0, 2**32) in the option's own words, before numpy or the tokenizer's trainer would
    refuse it in theirs (or, for a large one, halfway through a run)."""
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"--seed must be a whole number from 0 to {SEED_LIMIT - 1} (2**32 - 1), got {seed}")


MERGED_OPTIONS = ("--config_overrides",)  # name=value lists: each time given adds its names (a later one wins a name)


def merge_repeated(argv: list[str]) -> list[str]:
    """``argv`` with each of MERGED_OPTIONS given more than once joined into one (``--config_overrides a=1
    --config_overrides b=2`` is ``--config_overrides a=1,b=2``): argparse would keep the last one and drop the
    others without a word."""
    merged: list[str] = []
    at: dict[str, int] = {}  # option -> index of its value in ``merged``
    index = 0
    while index < len(argv):
        option, equals, value = argv[index].partition("=")
        option = "--" + option[2:].replace("-", "_") if option.startswith("--") else option  # --config-overrides too
        takes_next = not equals and index + 1 < len(argv)
        if option not in MERGED_OPTIONS or not (equals or takes_next):
            merged.append(argv[index])
            index += 1
            continue
        value = value if equals else argv[index + 1]
        if option in at:
            merged[at[option]] = f"{merged[at[option]]},{value}"
        else:
            merged += [option, value]
            at[option] = len(merged) - 1
        index += 1 if equals else 2
    return merged


def check_lists_given_once(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Refuse an option that takes several values given more than once (``--prompt a --prompt b``): argparse would
    keep the last one's values and drop the others without a word."""
    for action in parser._actions:
        if action.nargs not in ("+", "*") or not action.option_strings:
            continue
        given = [arg for arg in argv if arg.split("=", 1)[0] in action.option_strings]
        if len(given) > 1:
            option = action.option_strings[0]
            raise ValueError(f"{option} was given {len(given)} times, and only the last one's values would be kept; "
                             f"give all its values after one {option} (e.g. {option} a b)")


def _unused_message(argv: list[str], extra: list[str]) -> str:
    """Why arguments were left over: most often an unquoted glob the shell expanded into many file names."""
    first = argv.index(extra[0]) if extra[0] in argv else -1
    option = next((argv[i] for i in range(first - 1, -1, -1) if argv[i].startswith("--")), None)
    paths = [arg for arg in extra if os.path.exists(arg)]
    if option and first > 0 and paths and len(paths) == len(extra):
        named = argv[argv.index(option) + 1]
        shown = ", ".join([named, *extra][:3]) + (f" and {len(extra) - 2} more" if len(extra) > 2 else "")
        return (f"{option} got {len(extra) + 1} paths ({shown}): the shell expanded an unquoted glob. Quote the "
                f"pattern so minitx expands it, e.g. {option} '{_common_pattern([named, *extra])}', or join files "
                "with commas")
    shown = " ".join(extra[:5]) + (f" ... ({len(extra)} in all)" if len(extra) > 5 else "")
    return f"unrecognized arguments: {shown}"


def _common_pattern(paths: list[str]) -> str:
    """A glob that matches ``paths``: their shared folder, then * with their shared extension."""
    folder = os.path.commonpath([os.path.dirname(p) or "." for p in paths])
    suffixes = {os.path.splitext(p)[1] for p in paths}
    name = "*" + (suffixes.pop() if len(suffixes) == 1 else "")
    return name if folder in ("", ".") else os.path.join(folder, name)


def one_line(message: str) -> str:
    """A message of several lines as one: its non-blank lines joined with "; ", or with a space after a line
    that ends with a colon (a last resort: messages are built as one line where they are made)."""
    joined = ""
    for line in (line.strip() for line in message.splitlines()):
        if line:
            joined += ("" if not joined else " " if joined.endswith(":") else "; ") + line
    return joined


def _fail(message: str) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return EXIT_USAGE


def _write_error(error: BaseException) -> str | None:
    """A write the system refused (read-only, no permission, full), in the words of ``hf_minitx.folders``, which
    every command that writes has loaded (this module imports no part of the package, so it asks the loaded one)."""
    folders = sys.modules.get(f"{__package__}.folders")
    return folders.raw_write_error(error) if folders is not None else None


def _hold_read_failures(quiet: bool) -> None:
    """Keep back, while a command runs, the line a datasets reader logs before it raises (``_read_error`` says it
    in the error line), where the command loaded ``hf_minitx.data.sources`` (this module imports no part of the
    package)."""
    sources = sys.modules.get(f"{__package__}.data.sources")
    if sources is not None:
        sources.READER_FAILURES.quiet = quiet


def _read_error(error: BaseException) -> str | None:
    """A data file a datasets reader failed on while a stream was read (the error it raises does not name the
    file; ``hf_minitx.data.sources`` held the line that does), as one line; None for any other error."""
    sources = sys.modules.get(f"{__package__}.data.sources")
    said = sources.read_failure(error) if sources is not None else None
    return f"could not read the dataset: {said}. Is the file malformed?" if said else None


def run_cli(main: Callable[..., Any], *args: Any) -> int:
    """Call `main(*args)`; errors in what the user asked for print `error: ...` and return 2; an interruption
    prints one line and returns 130 (SIGINT) or 143 (SIGTERM)."""
    _hold_read_failures(True)
    try:
        result = main(*args)
    except Interrupted as stop:
        if os.environ.get("LOCAL_RANK", "0") == "0":  # a launch's other processes on this machine would repeat it
            print(str(stop), file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except USER_ERRORS as error:
        if os.environ.get("HF_MINITX_TRACEBACK"):
            raise
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        return _fail(_write_error(error) or _read_error(error) or str(message))
    except RuntimeError as error:
        lost = _peer_gone(error)
        if lost is None or os.environ.get("HF_MINITX_TRACEBACK"):
            raise
        print(f"error: {lost}", file=sys.stderr)
        return 1
    finally:
        _hold_read_failures(False)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def _peer_gone(error: RuntimeError) -> str | None:
    """One line for a process of a launch whose collective failed because another process stopped (that process
    said why): not gloo's traceback. None for any other error."""
    frames, world = error.__traceback__, int(os.environ.get("WORLD_SIZE", "1") or 1)
    while frames is not None and frames.tb_next is not None:
        frames = frames.tb_next
    where = frames.tb_frame.f_code.co_filename.replace(os.sep, "/") if frames is not None else ""
    if world < 2 or "/torch/distributed/" not in where:
        return None
    said = str(error).splitlines()[0].split("] ", 1)[-1].split(". ")[0] if str(error) else type(error).__name__
    return (f"process {os.environ.get('RANK', '?')} of {world} stopped: another process of the launch ended first "
            f"(its own message says why): {said}")


def _usage() -> str:
    width = max(len(command.name) for command in SUBCOMMANDS)
    lines = [f"  {command.name:<{width}}  {command.help}" for command in SUBCOMMANDS]
    return ("usage: minitx SUBCOMMAND [ARGS ...]   (python -m hf_minitx works the same)\n\n"
            "A small, from-scratch Transformer for the Hugging Face ecosystem.\n\nsubcommands:\n"
            + "\n".join(lines) + "\n\n`minitx SUBCOMMAND --help` lists a subcommand's arguments, one line each.")


def find_subcommand(name: str) -> Subcommand:
    """The subcommand called `name`; a ValueError suggests the closest one."""
    names = [command.name for command in SUBCOMMANDS]
    for command in SUBCOMMANDS:
        if command.name == name:
            return command
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean `minitx {close[0]}`? " if close else ""
    raise ValueError(f"unknown subcommand {name!r}; {hint}the subcommands are: {', '.join(names)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `minitx` and `python -m hf_minitx`; returns the exit code. Output read by a program that
    stops early (`minitx --help | head -3`) ends quietly, as other command-line tools do, not in a traceback."""
    try:
        code = dispatch(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left for the exit's own flush
        return 1
    if argv is None:  # the program (not a call from Python) is done: a Ctrl-C now would only break the exit's cleanup
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return code


def dispatch(argv: Sequence[str] | None = None) -> int:
    """The subcommand named first in `argv` (default: the command line), run through `run_cli`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        from . import __version__

        print(f"hf_minitx {__version__}")
        return 0
    try:
        command = find_subcommand(argv[0])
    except ValueError as error:
        return _fail(str(error))
    try:
        module = importlib.import_module(command.module)  # torch, transformers, datasets: seconds
    except KeyboardInterrupt:
        print(INTERRUPTED_AT_START, file=sys.stderr)
        return EXIT_INTERRUPTED
    return run_cli(module.main, argv[1:])
