"""Training with Accelerate: arguments and presets, the loop, loss, evaluation, checkpoints and run folders.

`minitx train` (or `accelerate launch -m hf_minitx train`) runs `train(model_args, data_args, train_args)`;
the arguments are the dataclasses of `hf_minitx.training.arguments`, the model shapes the JSON presets
shipped in `hf_minitx/training/presets/`.
"""

from .arguments import DataArguments, ModelArguments, TrainArguments
from .model_presets import available_presets, load_preset

__all__ = ["ModelArguments", "DataArguments", "TrainArguments", "available_presets", "load_preset", "train"]


def __getattr__(name: str):
    if name == "train":  # the loop imports accelerate and torch: load it when asked for
        from .loop import train

        return train
    raise AttributeError(name)
