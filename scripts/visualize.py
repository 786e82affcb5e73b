"""Look inside a MiniTx model: attention maps, positional encodings, masks, parameters, training curves.

Examples:

    python scripts/visualize.py attention --model runs/kjv-gpt --text "In the beginning God" --out attn.png
    python scripts/visualize.py attention --model runs/copy --source "5 9 7 4 12 6" --target "5 9 7 4 12 6" \\
        --kinds cross --out cross.png
    python scripts/visualize.py positions --dim 128 --length 100 --out positions.png
    python scripts/visualize.py training --run runs/kjv-gpt --out curves.png
    python scripts/visualize.py masks --length 10 --out masks.png
    python scripts/visualize.py params --model runs/kjv-gpt --out params.png

Each command writes one PNG to --out. A model trained without a tokenizer (the copy task) takes its
text as whitespace-separated token ids.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from hf_minitx import visualize
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from hf_minitx import visualize


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options: one subcommand per picture."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    attention = sub.add_parser("attention", help="attention weights per layer and head (+ head average)")
    attention.add_argument("--model", required=True, help="folder written by save_pretrained")
    attention.add_argument("--text", help="input text (decoder-only model)")
    attention.add_argument("--source", help="source text (encoder-decoder model)")
    attention.add_argument("--target", help="target text (encoder-decoder model), read with teacher forcing")
    attention.add_argument("--kinds", nargs="+", choices=["self", "encoder", "decoder", "cross"],
                           help="which maps of a seq2seq model to draw (default: all)")

    positions = sub.add_parser("positions", help="sinusoidal table, a few dimensions, rotary frequencies")
    positions.add_argument("--dim", type=int, default=128, help="model width (hidden_size)")
    positions.add_argument("--length", type=int, default=100, help="number of positions")
    positions.add_argument("--head_dim", type=int, default=None, help="rotary head width (default: --dim)")
    positions.add_argument("--rope_theta", type=float, default=10000.0, help="rotary base")

    training = sub.add_parser("training", help="loss, learning rate, throughput from metrics.jsonl")
    training.add_argument("--run", required=True, nargs="+", help="run folder(s); several are drawn together")

    masks = sub.add_parser("masks", help="causal and padding masks")
    masks.add_argument("--length", type=int, default=10, help="sequence length")
    masks.add_argument("--num_padding", type=int, default=3, help="left-padding tokens in the padding mask")

    params = sub.add_parser("params", help="parameter counts per component")
    params.add_argument("--model", required=True, help="folder written by save_pretrained")

    for command in (attention, positions, training, masks, params):
        command.add_argument("--out", required=True, help="PNG file to write")
    args = parser.parse_args(argv)
    if not args.out.lower().endswith(".png"):
        parser.error(f"--out must name a .png file, got {args.out}")
    return args


def main(argv: list[str] | None = None) -> Path:
    """Draw the requested picture; returns the PNG path."""
    args = parse_args(argv)
    if args.command == "attention":
        visualize.plot_attention(args.model, text=args.text, source=args.source, target=args.target,
                                 out=args.out, kinds=args.kinds)
    elif args.command == "positions":
        visualize.plot_positions(args.dim, args.length, args.out, rope_theta=args.rope_theta, head_dim=args.head_dim)
    elif args.command == "training":
        runs = args.run[0] if len(args.run) == 1 else args.run
        visualize.plot_training(runs, args.out)
    elif args.command == "masks":
        visualize.plot_masks(args.length, args.out, num_padding=args.num_padding)
    elif args.command == "params":
        counts = visualize.plot_params(args.model, args.out)
        print(visualize.format_param_table(counts))
    print(f"wrote {args.out}")
    return Path(args.out)


if __name__ == "__main__":
    from hf_minitx.cli import run_cli

    sys.exit(run_cli(main))
