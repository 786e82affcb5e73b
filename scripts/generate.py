"""Generate with a saved hf_minitx model (decoder-only or encoder-decoder).

    python scripts/generate.py --model runs/kjv-gpt --prompt "And God said" --max_new_tokens 80
    python scripts/generate.py --model runs/numbers-en-fr --prompt "forty-two" "one thousand and one"

Sampling defaults come from the model's generation_config.json; override them here. The device is
picked automatically (cuda, then mps, then cpu) with a dtype it supports, unless --device/--dtype say.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

try:
    import hf_minitx  # noqa: F401  (registers the Auto classes)
    from hf_minitx.inference import generate, load_for_generation
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import hf_minitx  # noqa: F401
    from hf_minitx.inference import generate, load_for_generation


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a saved model folder (a training --output_dir)")
    parser.add_argument("--prompt", nargs="+", required=True, help="one or more prompts (or sources to translate)")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: generation_config.json")
    sampling = parser.add_mutually_exclusive_group()
    sampling.add_argument("--do_sample", action="store_true", default=None, help="sample instead of greedy/beams")
    sampling.add_argument("--greedy", action="store_true", help="greedy decoding (no sampling)")
    parser.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    parser.add_argument("--top_k", type=int, default=None, help="sample among the k most likely tokens")
    parser.add_argument("--top_p", type=float, default=None, help="nucleus sampling probability mass")
    parser.add_argument("--num_beams", type=int, default=None, help="beam search width (implies no sampling)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--device", default="auto", help="auto (cuda -> mps -> cpu), cpu, cuda, cuda:N, mps")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[str]:
    """Print and return one output per prompt."""
    args = parse_args(argv)
    model, tokenizer = load_for_generation(args.model, device=args.device, dtype=args.dtype)
    do_sample = False if args.greedy or (args.num_beams or 1) > 1 else args.do_sample
    outputs = generate(
        model, tokenizer, args.prompt, seed=args.seed, max_new_tokens=args.max_new_tokens, do_sample=do_sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, num_beams=args.num_beams,
    )
    seq2seq = model.config.is_encoder_decoder
    for prompt, output in zip(args.prompt, outputs, strict=True):
        print(f"{prompt} -> {output}" if seq2seq else f"{prompt}{output}")
    return outputs


if __name__ == "__main__":
    from hf_minitx.cli import run_cli

    sys.exit(run_cli(main))
