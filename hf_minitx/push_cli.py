"""Command line of scripts/push_to_hub.py: upload a model folder, or stage and check it with --dry_run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .hub import HubError, dry_run, push_to_hub
from .hub_folder import ModelFolderError


def build_parser() -> argparse.ArgumentParser:
    """Arguments: --model_dir, --repo_id, --private, --revision, --commit_message, --dry_run STAGING_DIR."""
    parser = argparse.ArgumentParser(
        description="Upload a saved hf_minitx model folder to the Hugging Face Hub (weights, config, generation "
                    "config, tokenizer, custom code and a model card).")
    parser.add_argument("--model_dir", required=True, help="folder written by training / save_pretrained")
    parser.add_argument("--repo_id", help="Hub repo as OWNER/NAME, e.g. your-username/kjv-gpt (needed to upload)")
    parser.add_argument("--private", action="store_true", help="create the repo as private (when it is new)")
    parser.add_argument("--revision", help="branch to upload to (created if missing); default: main")
    parser.add_argument("--commit_message", help="message of the upload commit")
    parser.add_argument("--dry_run", metavar="STAGING_DIR",
                        help="upload nothing: write exactly what would be uploaded into STAGING_DIR and check that "
                             "it loads and generates with trust_remote_code=True where hf_minitx is not installed")
    parser.add_argument("--prompt", help="prompt for the --dry_run generation check (default: a training sample)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; bad input and Hub problems print one clear line and return exit code 2 or 1."""
    args = build_parser().parse_args(argv)
    try:
        if args.dry_run:
            staging, result = dry_run(args.model_dir, args.dry_run, repo_id=args.repo_id, prompt=args.prompt)
            files = sorted(path.name for path in staging.iterdir())
            print(f"staged {len(files)} files in {staging}: {', '.join(files)}")
            print(f"loaded without hf_minitx as {result.model_class.rsplit('.', 1)[-1]} (code from the folder); "
                  f"generated {result.num_new_tokens} tokens: {result.text!r}")
            print("dry run passed: nothing was uploaded.")
            return 0
        if not args.repo_id:
            print("error: --repo_id OWNER/NAME is required to upload (or pass --dry_run STAGING_DIR).", file=sys.stderr)
            return 2
        url = push_to_hub(args.model_dir, args.repo_id, private=args.private, revision=args.revision,
                          commit_message=args.commit_message)
        print(f"uploaded {args.model_dir} to https://huggingface.co/{args.repo_id} ({url})")
        return 0
    except (ModelFolderError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except HubError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
