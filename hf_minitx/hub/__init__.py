"""Sharing: model folder checks, the model card (template `model_card.md` inside this package), push to the
Hub, and the dry run that loads a staged folder with `trust_remote_code=True` where hf_minitx is absent."""

from .card import check_model_card, render_model_card, write_model_card
from .folder import ModelFolderError, ModelFolderInfo, verify_model_folder
from .push import HubError, dry_run, push_to_hub, stage_for_upload

__all__ = ["ModelFolderError", "ModelFolderInfo", "verify_model_folder", "render_model_card", "write_model_card",
           "check_model_card", "HubError", "dry_run", "push_to_hub", "stage_for_upload"]
