"""Upload a trained hf_minitx model folder to the Hugging Face Hub, or check it with --dry_run.

    python scripts/push_to_hub.py --model_dir runs/kjv-gpt --repo_id your-username/kjv-gpt [--private]
    python scripts/push_to_hub.py --model_dir runs/kjv-gpt --dry_run /tmp/kjv-gpt-staged
"""

import sys

from hf_minitx.push_cli import main

if __name__ == "__main__":
    sys.exit(main())
