"""Load a saved model on the GPU, compare its logits with the CPU (float32 and bfloat16), generate with the cache.

    python scripts/check_device.py --model_dir runs/kjv-gpt            # needs CUDA
    python scripts/check_device.py --model_dir runs/kjv-gpt --device cpu --dtypes float32 bfloat16

Exits 0 when every check passes, 1 when one fails, and 0 with a message (nothing checked) on a machine
without CUDA unless --device is given.
"""

import argparse
import sys
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="saved model folder (config, weights, tokenizer)")
    parser.add_argument("--device", default="cuda", help="device to compare with the CPU (default: cuda)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=sorted(DTYPES))
    parser.add_argument("--max_new_tokens", type=int, default=20)
    args = parser.parse_args()
    if not Path(args.model_dir, "config.json").is_file():
        print(f"error: {args.model_dir} has no config.json; pass a folder written by save_pretrained.", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("CUDA is not available on this machine (torch.cuda.is_available() is False): nothing was checked. "
              "Run this on a GPU machine, or pass --device cpu to exercise the check on the CPU.")
        return 0
    from hf_minitx.device_check import compare_devices, format_report

    if args.device.startswith("cuda"):
        print(f"GPU: {torch.cuda.get_device_name(torch.device(args.device))}, torch {torch.__version__}")
    results = compare_devices(args.model_dir, args.device, tuple(DTYPES[d] for d in args.dtypes),
                              max_new_tokens=args.max_new_tokens)
    print(format_report(results))
    failed = [r for r in results if not r.passed]
    print("all checks passed" if not failed else f"{len(failed)} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
