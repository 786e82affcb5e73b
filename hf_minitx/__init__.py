"""hf_minitx: a small, from-scratch Transformer that is a first-class Hugging Face model.

The package is laid out as the architecture:

- `hf_minitx.models`: the model, the Hub custom code (config, attention, positions, layers, modeling);
- `hf_minitx.data`: corpora, the byte-level BPE tokenizer, tokenization and packing;
- `hf_minitx.training`: arguments and presets, the training loop, loss, evaluation, checkpoints, run folders;
- `hf_minitx.hub`: model folder checks, the model card, push and the clean-environment load check;
- `hf_minitx.tools`: visualisation, the explorer, the paper's toy experiments, the benchmark, the demo, the device check;
- `hf_minitx.inference`: the one loader of saved folders, and generation from it;
- `hf_minitx.model_files`: reading a saved folder without loading it (config.json, the safetensors header);
- `hf_minitx.cli`: the `minitx` command (also `python -m hf_minitx`).

Importing the package registers `MiniTxConfig` and the models with transformers' Auto classes, so
`AutoConfig`, `AutoModel`, `AutoModelForCausalLM` and `AutoModelForSeq2SeqLM` resolve `model_type="minitx"`.
"""

import os as _os
import sys as _sys

try:  # the first seconds of every `minitx` command: Ctrl-C here ends the command in one line (exit 130)
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from .models import (
        MiniTxConfig,
        MiniTxForCausalLM,
        MiniTxForConditionalGeneration,
        MiniTxModel,
        MiniTxPreTrainedModel,
    )
except KeyboardInterrupt:
    if _sys.argv and (_sys.argv[0] == "-m" or _os.path.basename(_sys.argv[0]) == "minitx"):  # the command
        print("interrupted while starting; nothing was written", file=_sys.stderr, flush=True)
        _os._exit(130)  # nothing is open yet; SystemExit here can still end as a death by SIGINT
    raise  # imported as a library: the caller decides

__version__ = "0.1.0"


def _register() -> None:
    """Register with the Auto classes here, and mark the classes so save_pretrained writes `auto_map` + code."""
    AutoConfig.register(MiniTxConfig.model_type, MiniTxConfig, exist_ok=True)
    AutoModel.register(MiniTxConfig, MiniTxModel, exist_ok=True)
    AutoModelForCausalLM.register(MiniTxConfig, MiniTxForCausalLM, exist_ok=True)
    AutoModelForSeq2SeqLM.register(MiniTxConfig, MiniTxForConditionalGeneration, exist_ok=True)
    MiniTxConfig.register_for_auto_class("AutoConfig")
    MiniTxModel.register_for_auto_class("AutoModel")
    MiniTxForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    MiniTxForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")


_register()

__all__ = [
    "MiniTxConfig",
    "MiniTxPreTrainedModel",
    "MiniTxModel",
    "MiniTxForCausalLM",
    "MiniTxForConditionalGeneration",
]
