"""hf_minitx: a small, from-scratch Transformer that is a first-class Hugging Face model.

The package is laid out as the architecture:

- `hf_minitx.models`: the model, the Hub custom code (config, input checks, attention, positions, layers,
  decoding, the heads' shared part, modeling);
- `hf_minitx.data`: corpora, the byte-level BPE tokenizer, tokenization and packing;
- `hf_minitx.training`: arguments and presets, the training loop, loss, evaluation, checkpoints, run folders;
- `hf_minitx.hub`: model folder checks, the model card, push and the clean-environment load check;
- `hf_minitx.tools`: visualisation, the explorer, the paper's toy experiments, the benchmark, the demo, the device
  check;
- `hf_minitx.inference`: the one loader of saved folders, and generation from it;
- `hf_minitx.model_files`: reading a saved folder without loading it (config.json, the safetensors header);
- `hf_minitx.cli`: the `minitx` command (also `python -m hf_minitx`).

Importing the package registers `MiniTxConfig` and the models with transformers' Auto classes, so
`AutoConfig`, `AutoModel`, `AutoModelForCausalLM` and `AutoModelForSeq2SeqLM` resolve `model_type="minitx"`.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"
__all__ = [
    "MiniTxConfig",
    "MiniTxPreTrainedModel",
    "MiniTxModel",
    "MiniTxForCausalLM",
    "MiniTxForConditionalGeneration",
]


def _as_command() -> bool:
    """Whether this import starts the `minitx` command (`minitx ...` or `python -m hf_minitx ...`)."""
    return bool(_sys.argv) and (_sys.argv[0] == "-m" or _os.path.basename(_sys.argv[0]) == "minitx")


def _help_only() -> bool:
    """`minitx`, `minitx --help` or `minitx --version`: the command prints a few lines and needs neither torch
    nor transformers, so they are not imported (the classes still load on first use)."""
    return _as_command() and (len(_sys.argv) < 2 or _sys.argv[1] in ("-h", "--help", "--version"))


def _drop_known_import_noise() -> None:
    """Drop three log lines that come with torchao (the int8 extra), which transformers imports whenever it is
    installed: that its GPU kernels cannot load on this build, that Triton is missing, and torch's note that the
    enums torchao registers need no registering. They come before every command and on every import, about
    nothing a user can change; every other line of those loggers stays."""
    import logging

    noise = {"torchao": "Failed to load ", "torchao.kernel.intmm": "Detected no triton",
             "torch.utils._pytree": "is an Enum subclass and is now natively supported"}
    for name, text in noise.items():
        logging.getLogger(name).addFilter(lambda record, text=text: text not in record.getMessage())


def _load() -> None:
    """Import the models and register them with the Auto classes, and mark the classes so save_pretrained
    writes `auto_map` + code."""
    try:  # the first seconds of every `minitx` command: Ctrl-C here ends the command in one line (exit 130)
        from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

        from . import models
    except KeyboardInterrupt:
        if _as_command():
            print("interrupted while starting; nothing was written", file=_sys.stderr, flush=True)
            _os._exit(130)  # nothing is open yet; SystemExit here can still end as a death by SIGINT
        raise  # imported as a library: the caller decides
    AutoConfig.register(models.MiniTxConfig.model_type, models.MiniTxConfig, exist_ok=True)
    AutoModel.register(models.MiniTxConfig, models.MiniTxModel, exist_ok=True)
    AutoModelForCausalLM.register(models.MiniTxConfig, models.MiniTxForCausalLM, exist_ok=True)
    AutoModelForSeq2SeqLM.register(models.MiniTxConfig, models.MiniTxForConditionalGeneration, exist_ok=True)
    models.MiniTxConfig.register_for_auto_class("AutoConfig")
    models.MiniTxModel.register_for_auto_class("AutoModel")
    models.MiniTxForCausalLM.register_for_auto_class("AutoModelForCausalLM")
    models.MiniTxForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
    globals().update({name: getattr(models, name) for name in __all__})


def __getattr__(name: str):  # only reached when the help-only start skipped _load
    if name in __all__:
        _load()
        return globals()[name]
    raise AttributeError(f"module 'hf_minitx' has no attribute {name!r}")


if not _help_only():
    _drop_known_import_noise()
    _load()
