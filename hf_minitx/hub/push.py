"""Share a trained model on the Hugging Face Hub: stage, check, and upload a model folder.

- `stage_for_upload(model_dir, staging_dir)` copies exactly the files that would be uploaded (weights,
  config, generation config, tokenizer, custom code, training records) and writes a fresh model card.
- `check_loads_without_package(folder)` loads a folder with `trust_remote_code=True` in a fresh Python
  process where hf_minitx cannot be imported, and generates: what a Hub user without hf_minitx gets.
- `dry_run(model_dir, staging_dir)` = stage + check; `push_to_hub(model_dir, repo_id)` = stage + upload
  with huggingface_hub (`create_repo(exist_ok=True)`, then `upload_folder`).
- The card helpers (`render_model_card`, `write_model_card`, `check_model_card`) and the folder checks
  (`verify_model_folder`) are in `hf_minitx.hub.card` and `hf_minitx.hub.folder`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..folders import (
    SUMMARY_FILE,
    WRITE_ERRNOS,
    check_not_locked,
    html_written_by_us,
    output_folder,
    read_summary,
    weights_digest,
    write_advice,
    write_errno,
    write_folder,
)
from .card import CARD_FILE, EXPLORER_FILE, check_model_card, render_model_card, write_model_card
from .folder import ModelFolderError, ModelFolderInfo, verify_model_folder

# Training records shared alongside the model when the folder has them.
RECORD_FILES = (SUMMARY_FILE, "metrics.jsonl", "loss_curve.png")
RESULT_PREFIX = "REMOTE_LOAD_RESULT "


class HubError(OSError):
    """Uploading cannot start or failed; the message says what to do."""


@dataclass(frozen=True)
class RemoteLoadResult:
    """What the package-free loading check saw (see `check_loads_without_package`)."""

    model_class: str
    config_class: str
    tokenizer_class: str
    output_ids: list[int]
    num_new_tokens: int
    text: str


def check_repo_id(repo_id: str) -> str:
    """Return `repo_id` if it is a valid "owner/name" Hub id; raise ValueError explaining the format otherwise."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    example = "e.g. --repo_id your-username/kjv-gpt"
    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo_id {repo_id!r} must look like OWNER/NAME (your user or organisation, a slash, "
                         f"and the model name), {example}.")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"repo_id {repo_id!r} is not a valid Hub id: {error} ({example}).") from None
    return repo_id


def resolve_token(token: str | None = None) -> str:
    """The token to upload with: `token`, else HF_TOKEN or the one saved by `hf auth login`."""
    from huggingface_hub import get_token

    found = token or get_token()
    if not found:
        raise HubError(
            "No Hugging Face token found. Log in once with `hf auth login`, or set HF_TOKEN to a token with "
            "write access (create one at https://huggingface.co/settings/tokens), then run the upload again."
        )
    return found


def check_upload_ready(repo_id: str, token: str | None = None) -> str:
    """Everything an upload needs that can be checked without the network: the repo id, a token, and that
    offline mode is off. Returns the token. `minitx train --push_to_hub` calls it before training."""
    from huggingface_hub import constants

    check_repo_id(repo_id)
    if constants.is_offline_mode():  # before the token: logging in would not help
        raise HubError("HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set, so nothing can be uploaded; unset it "
                       "and run again, or use --dry_run STAGING_DIR to check the folder offline.")
    return resolve_token(token)


def transport_errors() -> tuple[type[BaseException], ...]:
    """The errors of a Hub request that never got an answer (no network, a name that does not resolve, a timeout):
    OSError (requests' and the socket's) and the TransportError of whichever httpx the Hub client uses."""
    errors: list[type[BaseException]] = [OSError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(errors)


def files_to_upload(info: ModelFolderInfo) -> list[str]:
    """Relative names of the files shared from a checked model folder (the card is written separately)."""
    names = ["config.json", *info.weight_files, *info.code_files, *info.tokenizer_files]
    optional = ["generation_config.json", *RECORD_FILES]
    names += [name for name in optional if (info.path / name).is_file()]
    return list(dict.fromkeys(names))


def stage_for_upload(
    model_dir: str | Path,
    staging_dir: str | Path,
    *,
    repo_id: str | None = None,
    kind: str | None = None,
    license: str = "apache-2.0",
    explorer: str | Path | None = None,
) -> Path:
    """Copy what would be uploaded from `model_dir` into `staging_dir` and write its model card.

    `explorer` is a page written by `minitx explore`: it is shared as `explore.html` and the card links it.

    Checks the folder first (`verify_model_folder`, then a load that refuses weights which do not match the
    config, so a broken folder is named as such rather than blamed on the remote-code check); `staging_dir` must
    be absent or empty. The card is rendered afresh, with `repo_id` in its usage snippets. Returns the staging
    folder.
    """
    from ..inference import load_model_folder

    info = verify_model_folder(model_dir, kind)
    check_not_locked(info.path, option="--model_dir")  # a run still writing it: its files are not the model yet
    check_run_finished(info.path)
    page = check_explorer_page(explorer, model_dir) if explorer is not None else None
    load_model_folder(info.path, device="cpu", dtype="float32")  # weights that do not fit the config are refused
    staging = Path(staging_dir)
    if staging.resolve() == info.path.resolve():
        raise ValueError("the staging folder must differ from the model folder.")
    with output_folder(staging, command="push", flag=None, overwrite=False, option="staging folder") as folder:
        return write_folder(folder, lambda fresh: _stage(info, fresh, repo_id=repo_id, license=license, explorer=page))


def _summary(folder: Path) -> dict:
    """A folder's training_summary.json, or {} where it has none that reads as one."""
    return read_summary(folder) or {}


def check_run_finished(model_dir: Path) -> None:
    """Refuse the folder of a run in two phases stopped before its student finished: it holds the teacher, with the
    teacher's card, while the run's model is still to come (training_summary.json: the split the shape plan made,
    and no model kept by the run yet). A finished run's teacher kept by --keep_phases (``folders_kept``) is a model
    of its own."""
    summary, parent = _summary(model_dir), _summary(model_dir.resolve().parent).get("phases") or {}
    if model_dir.resolve().name == "teacher" and parent.get("model_kept") and parent.get("folders_kept"):
        return
    if (summary.get("shape_plan") or {}).get("phases") and not (summary.get("phases") or {}).get("model_kept"):
        raise ValueError(f"{model_dir} holds the teacher of a run in two phases that stopped before its student "
                         "finished, not the run's model: finish it with the same `minitx train` command plus "
                         "--resume_from_checkpoint latest, then push")


EXPLORER_DATA = re.compile(r'<script type="application/json" id="explorer-data">(.*?)</script>', re.S)


def check_explorer_page(path: str | Path, model_dir: str | Path) -> Path:
    """The --explorer page, refused unless `minitx explore` wrote it from this folder's very weights."""
    page = Path(path)
    remake = f"minitx explore --model {model_dir} --run {model_dir} --text \"...\" --out {page}"
    if page.is_dir():
        remake = remake.replace(f"--out {page}", f"--out {page / 'explore.html'}")
        raise ValueError(f"--explorer {page} is a folder; pass the .html page written by minitx explore (its "
                         f"--out), or make one: {remake}")
    if not page.is_file():
        raise FileNotFoundError(f"--explorer {page} does not exist; make it first: {remake}")
    if not html_written_by_us(page):
        raise ValueError(f"--explorer {page} is not a page written by minitx explore; pass the --out of "
                         "`minitx explore`")
    found = EXPLORER_DATA.search(page.read_text(encoding="utf-8", errors="replace"))
    try:
        shown = json.loads(found.group(1))["model"].get("weights") if found else None
    except (ValueError, KeyError, AttributeError):
        shown = None
    if shown != weights_digest(Path(model_dir)):
        raise ValueError(f"--explorer {page} was not made from the weights in {model_dir} (another model, or "
                         f"an older version of this one); make it again: {remake}")
    return page


def _stage(info: ModelFolderInfo, staging: Path, *, repo_id: str | None, license: str,
           explorer: Path | None = None) -> None:
    """The files to upload (and the explorer page), and a fresh model card, copied into the empty ``staging``."""
    for name in files_to_upload(info):
        shutil.copy2(info.path / name, staging / name)
    if explorer is not None:
        shutil.copy2(explorer, staging / EXPLORER_FILE)
    # named after the model's folder, not the hidden folder the copy is written in before it takes its place
    text = render_model_card(staging, repo_id=repo_id, license=license, name=info.path.resolve().name)
    check_model_card(text)
    (staging / CARD_FILE).write_text(text, encoding="utf-8")


def _default_prompt(folder: Path) -> str:
    """A prompt for the smoke generation: the first recorded sample prompt, else a neutral phrase."""
    samples = _summary(folder).get("sample_generations") or []
    if isinstance(samples, list) and samples and isinstance(samples[0], dict) and samples[0].get("prompt"):
        return str(samples[0]["prompt"])
    return "The"


def check_loads_without_package(
    folder: str | Path, *, prompt: str | None = None, max_new_tokens: int = 8, timeout: float = 300.0
) -> RemoteLoadResult:
    """Load `folder` with AutoConfig/AutoTokenizer/AutoModelFor* (trust_remote_code=True) and generate,
    in a fresh Python process that cannot import hf_minitx and starts in an empty temporary directory.

    Raises HubError with the child's error output when loading or generating fails.
    """
    folder = Path(folder).resolve()
    script = (Path(__file__).parent / "remote_check.py").read_text(encoding="utf-8")
    prompt = prompt if prompt is not None else _default_prompt(folder)
    try:
        with tempfile.TemporaryDirectory(prefix="minitx-remote-check-") as workdir:
            env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
            env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(Path(workdir) / "modules"),
                       TOKENIZERS_PARALLELISM="false")
            completed = subprocess.run(
                [sys.executable, "-c", script, str(folder), prompt, str(max_new_tokens)],
                cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout,
            )
    except subprocess.TimeoutExpired:
        raise HubError(f"loading {folder} without hf_minitx took longer than {timeout:.0f} s; "
                       "try a smaller max_new_tokens or check the machine's load.") from None
    except OSError as error:  # the temporary folder could not be made (or emptied): a full or read-only TMPDIR
        if write_errno(error) is None:
            raise
        raise _no_room_for_check(folder, write_errno(error)) from None
    lines = [line for line in completed.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if completed.returncode != 0 or not lines:
        raise child_failure(folder, completed.stderr, completed.returncode)
    data = json.loads(lines[-1][len(RESULT_PREFIX):])
    if not data.pop("hf_minitx_blocked"):
        raise HubError("the isolation check could import hf_minitx, so it proves nothing; please report this.")
    if data["model_class"].split(".")[0] != "transformers_modules":
        raise HubError(f"{folder} loaded {data['model_class']}, not the code stored in the folder.")
    return RemoteLoadResult(**data)


def _no_room_for_check(folder: Path, code: int) -> HubError:
    """The clean-environment check could not write its temporary files (the folder itself was staged)."""
    where = Path(tempfile.gettempdir())
    return HubError(f"the loading check of {folder} could not write in the temporary folder {where} "
                    f"({os.strerror(code)}), so it could not run; {write_advice(code, where)} (or set TMPDIR to "
                    "a folder with room)")


def _syntax_error_in(folder: Path) -> str:
    """" (in FILE, line N)" for the first code file of ``folder`` that does not parse (transformers parses the code
    files without naming them), else ""."""
    for path in sorted(folder.glob("*.py")):
        try:
            compile(path.read_bytes(), path.name, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as error:
            return f" (in {path.name}, line {getattr(error, 'lineno', '?')})"
    return ""


def child_failure(folder: Path, stderr: str, returncode: int) -> HubError:
    """Why the clean-environment check failed, in one line: the child's last error (type and message) and the
    file and line of the folder's code it came from; a write that failed for lack of room or rights is said as
    such. The whole traceback follows when HF_MINITX_TRACEBACK is set."""
    lines = stderr.rstrip().splitlines()
    frames = [index for index, line in enumerate(lines) if line.startswith('  File "')]
    after = lines[frames[-1] + 1:] if frames else lines
    error = next((line.strip() for line in after if line and not line[0].isspace()), None)
    error = error or (lines[-1].strip() if lines else f"exit code {returncode}, no error output")
    found = re.search(r"\[Errno (\d+)\]|\(os error (\d+)\)", error)  # an OSError, or a Rust library's
    if found and int(found.group(1) or found.group(2)) in WRITE_ERRNOS:
        return _no_room_for_check(folder, int(found.group(1) or found.group(2)))
    own = [re.match(r'  File "(.+)", line (\d+)', lines[index]) for index in frames]
    own = [match for match in own if match and "transformers_modules" in match.group(1)]
    where = f" (in {Path(own[-1].group(1)).name}, line {own[-1].group(2)})" if own else _syntax_error_in(folder)
    full = f":\n{stderr.rstrip()}" if os.environ.get("HF_MINITX_TRACEBACK") else (
        "; set HF_MINITX_TRACEBACK=1 to see the whole traceback")
    return HubError(f"{folder} does not load without hf_minitx installed: {error}{where}{full}")


def dry_run(
    model_dir: str | Path,
    staging_dir: str | Path,
    *,
    repo_id: str | None = None,
    prompt: str | None = None,
    max_new_tokens: int = 8,
    explorer: str | Path | None = None,
) -> tuple[Path, RemoteLoadResult]:
    """Stage the upload into `staging_dir` and prove the staged folder loads and generates without hf_minitx; the
    folder's lock is held from the first check to the end of the loading check."""
    if repo_id is not None:
        check_repo_id(repo_id)
    if prompt is not None and not prompt.strip():
        raise ValueError("--prompt is empty; give a few words for the generation check, or leave --prompt out")
    with output_folder(staging_dir, command="push", flag=None, overwrite=False, option="--dry_run",
                       inputs=[("--model_dir", model_dir)]) as folder:  # not staged inside the folder it copies
        staging = stage_for_upload(model_dir, folder, repo_id=repo_id, explorer=explorer)  # lock held to the end
        return staging, check_loads_without_package(staging, prompt=prompt, max_new_tokens=max_new_tokens)


def push_to_hub(
    model_dir: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    token: str | None = None,
    explorer: str | Path | None = None,
) -> str:
    """Upload a model folder to the Hub repo `repo_id` ("owner/name"); returns the commit URL.

    Everything is checked before any network call: the repo id, the token, offline mode and the folder.
    The repo is created if missing (`private` applies then), `revision` names a branch (created if
    missing), and the staged folder is sent with one `upload_folder` commit. `explorer`: a page written by
    `minitx explore`, shared as explore.html and linked from the card.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    token = check_upload_ready(repo_id, token)
    again = (f"{model_dir} is as it was: send it with `minitx push --model_dir {model_dir} --repo_id {repo_id}` once "
             "that is fixed")
    with tempfile.TemporaryDirectory(prefix="minitx-upload-") as workdir:
        staging = stage_for_upload(model_dir, Path(workdir) / "stage", repo_id=repo_id,
                                   explorer=explorer)  # checks the folder
        api = HfApi(token=token)
        try:
            api.create_repo(repo_id, private=private, repo_type="model", exist_ok=True)
            if revision:
                api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
            commit = api.upload_folder(
                repo_id=repo_id, folder_path=staging, repo_type="model", revision=revision,
                commit_message=commit_message or f"Upload {Path(model_dir).name} (hf_minitx)",
            )
        except HfHubHTTPError as error:
            status = getattr(error.response, "status_code", None)
            hint = {401: "the token was rejected; log in again with `hf auth login`",
                    403: "the token cannot write to this repo; use a token with write access, or a repo you own"}
            raise HubError(f"upload to {repo_id} failed: {hint.get(status, error)}. {again}") from error
        except transport_errors() as error:
            raise HubError(f"upload to {repo_id} failed: the Hub could not be reached ({type(error).__name__}: "
                           f"{error}); check the network (or HTTPS_PROXY). {again}") from error
    return commit.commit_url


def training_warning(model_dir: str | Path) -> str | None:
    """The warning its training left in a folder's training_summary.json (a run that diverged or ended at
    chance), as one line; None when there is none or no readable summary."""
    warning = _summary(Path(model_dir)).get("warning")
    return f"warning: {str(warning).removeprefix('warning: ')}" if warning else None


@dataclass
class PushArguments:
    """`minitx push`: upload a saved model folder, or stage and check it offline with --dry_run."""

    model_dir: str = field(metadata={"help": "folder written by training / save_pretrained"})
    repo_id: str | None = field(default=None, metadata={
        "help": "Hub repo as OWNER/NAME, e.g. your-username/kjv-gpt (needed to upload)"})
    private: bool = field(default=False, metadata={"help": "create the repo as private (when it is new)"})
    revision: str | None = field(default=None, metadata={"help": "branch to upload to (created if missing)"})
    commit_message: str | None = field(default=None, metadata={"help": "message of the upload commit"})
    dry_run: str | None = field(default=None, metadata={
        "help": "STAGING_DIR: upload nothing; write exactly what would be uploaded there and check that it loads "
                "and generates with trust_remote_code=True where hf_minitx is not installed"})
    prompt: str | None = field(default=None, metadata={
        "help": "prompt for the --dry_run generation check (default: a training sample)"})
    explorer: str | None = field(default=None, metadata={
        "help": "an HTML page written by `minitx explore`: shared as explore.html, and the model card links it"})


def main(argv: Sequence[str] | None = None) -> int:
    """`minitx push`: upload, or stage and check with --dry_run; problems raise one clear error."""
    from ..cli import parse_arguments

    (args,) = parse_arguments([PushArguments], argv, prog="minitx push", description=(
        "Upload a saved hf_minitx model folder to the Hugging Face Hub (weights, config, generation config, "
        "tokenizer, custom code and a model card), or check it offline with --dry_run STAGING_DIR."))
    if args.dry_run:
        staging, result = dry_run(args.model_dir, args.dry_run, repo_id=args.repo_id, prompt=args.prompt,
                                  explorer=args.explorer)
        files = sorted(path.name for path in staging.iterdir())
        print(f"staged {len(files)} files in {staging}: {', '.join(files)}")
        print(f"loaded without hf_minitx as {result.model_class.rsplit('.', 1)[-1]} (code from the folder); "
              f"generated {result.num_new_tokens} tokens: {result.text!r}")
        warning = training_warning(args.model_dir)
        if warning:
            print(warning)
        print(f"dry run passed{' (mind the warning above)' if warning else ''}: nothing was uploaded.")
        return 0
    if not args.repo_id:
        raise ValueError("--repo_id OWNER/NAME is required to upload (or pass --dry_run STAGING_DIR)")
    url = push_to_hub(args.model_dir, args.repo_id, private=args.private, revision=args.revision,
                      commit_message=args.commit_message, explorer=args.explorer)
    print(f"uploaded {args.model_dir} to https://huggingface.co/{args.repo_id} ({url})")
    if training_warning(args.model_dir):  # the card says it too
        print(f"{training_warning(args.model_dir)} (the model card carries this warning)")
    return 0


__all__ = [
    "HubError",
    "ModelFolderError",
    "ModelFolderInfo",
    "RemoteLoadResult",
    "check_repo_id",
    "resolve_token",
    "files_to_upload",
    "stage_for_upload",
    "check_loads_without_package",
    "dry_run",
    "push_to_hub",
    "render_model_card",
    "write_model_card",
    "check_model_card",
    "verify_model_folder",
]
