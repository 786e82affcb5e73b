"""transformers' own common model and config tests (ModelTesterMixin, ConfigTester), run on both MiniTx kinds.

The test sources ship in the transformers sdist, not in the wheel: point `MINITX_TRANSFORMERS_TESTS` at the root
of an extracted sdist (the folder holding `tests/`), e.g. `tar xzf transformers-5.24.0.tar.gz` then
`MINITX_TRANSFORMERS_TESTS=$PWD/transformers-5.24.0`. Without it the whole module is skipped.

The sdist holds the common test files but not every sibling module they import; missing ones are replaced by
small stand-ins (the export mixin and the generation mixin become empty: those tests are simply absent; the
config keyword set is written out below). Tests of features MiniTx does not have (flash attention, deepspeed,
RoPE scaling, sparse experts, ...) skip themselves with their reason; everything else runs as transformers runs
it on its own models. A known gap is an expected failure: once closed it shows up as an unexpected success.
"""

import importlib
import os
import sys
import types
import unittest
import warnings
from pathlib import Path
from unittest import mock

import pytest
import transformers

from hf_minitx import MiniTxConfig, MiniTxForCausalLM, MiniTxForConditionalGeneration, MiniTxModel
from hf_minitx.models.configuration_minitx import EXTRA_PIECES

ENV_VAR = "MINITX_TRANSFORMERS_TESTS"
PACKAGE = "hf_transformers_tests"  # not `tests`: this repository's tests folder is on sys.path as well


def transformers_tests_dir() -> Path:
    """The `tests/` folder of the extracted transformers sdist named by MINITX_TRANSFORMERS_TESTS, else skip."""
    root = os.environ.get(ENV_VAR)
    if not root:
        pytest.skip(f"{ENV_VAR} is not set: point it at an extracted transformers sdist (the folder holding "
                    "tests/) to run transformers' common model tests", allow_module_level=True)
    folder = Path(root) / "tests"
    if not (folder / "test_modeling_common.py").is_file():
        pytest.skip(f"{ENV_VAR}={root} holds no tests/test_modeling_common.py: point it at the root of an "
                    "extracted transformers sdist", allow_module_level=True)
    return folder


# Keyword arguments every PretrainedConfig accepts and keeps (ConfigTester.check_config_arguments_init)
CONFIG_COMMON_KWARGS = {
    "return_dict": False, "output_hidden_states": True, "output_attentions": True, "dtype": "float16",
    "chunk_size_feed_forward": 5, "architectures": ["MiniTxForCausalLM"], "id2label": {0: "label"},
    "label2id": {"label": "0"}, "problem_type": "regression",
}


def stand_in(name: str, **attributes) -> None:
    """Register module `PACKAGE.name` (and its parent packages) holding `attributes`, unless the file exists."""
    parts = name.split(".")
    if (transformers_tests_dir().joinpath(*parts[:-1]) / f"{parts[-1]}.py").is_file():
        return
    for depth in range(1, len(parts)):
        parent = ".".join([PACKAGE, *parts[:depth]])
        sys.modules.setdefault(parent, types.ModuleType(parent)).__path__ = []
    module = types.ModuleType(f"{PACKAGE}.{name}")
    module.__dict__.update(attributes)
    sys.modules[module.__name__] = module


def import_transformers_tests() -> tuple[types.ModuleType, types.ModuleType]:
    """transformers' test_modeling_common and test_configuration_common, imported as package PACKAGE."""
    folder = transformers_tests_dir()
    pytest.importorskip("parameterized", reason="transformers' common tests need `pip install parameterized`")
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(folder)]
        sys.modules[PACKAGE] = package
    stand_in("exporters.test_export", ExportTesterMixin=type("ExportTesterMixin", (), {}))
    stand_in("generation.test_utils", GenerationTesterMixin=type("GenerationTesterMixin", (), {}))
    stand_in("utils.test_configuration_utils", config_common_kwargs=CONFIG_COMMON_KWARGS)
    # test_configuration_common imports transformers from the sdist's tests/__init__.py, which the sdist lacks
    # and nothing uses: the installed transformers stands in
    # its tests carry transformers' own pytest marks (flash_attn_test...), unknown here and harmless
    with mock.patch("transformers.utils.direct_transformers_import", lambda path: transformers), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        return (importlib.import_module(f"{PACKAGE}.test_modeling_common"),
                importlib.import_module(f"{PACKAGE}.test_configuration_common"))


modeling_common, configuration_common = import_transformers_tests()
ModelTesterMixin = modeling_common.ModelTesterMixin
ConfigTester = configuration_common.ConfigTester
ids_tensor = modeling_common.ids_tensor
random_attention_mask = modeling_common.random_attention_mask


class MiniTxModelTester:
    """Tiny configs and inputs in the shape transformers' mixins ask a model tester for."""

    def __init__(self, parent: unittest.TestCase, is_encoder_decoder: bool, batch_size: int = 2,
                 seq_length: int = 7, options: dict | None = None):
        self.parent = parent
        self.is_encoder_decoder = is_encoder_decoder
        self.options = options or {}  # config fields beyond the defaults (the extra pieces)
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.encoder_seq_length = seq_length
        self.decoder_seq_length = seq_length
        self.key_length = seq_length
        self.is_training = True
        self.use_labels = True
        self.vocab_size = 99
        self.hidden_size = 32
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_key_value_heads = 4
        self.intermediate_size = 37
        self.max_position_embeddings = 64
        self.pad_token_id = 0
        self.bos_token_id = 1
        self.eos_token_id = 2

    def get_config(self) -> MiniTxConfig:
        """The tiny config of this tester's kind."""
        return MiniTxConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
            intermediate_size=self.intermediate_size, max_position_embeddings=self.max_position_embeddings,
            is_encoder_decoder=self.is_encoder_decoder, pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id, **self.options,
        )

    def prepare_config_and_inputs(self) -> tuple[MiniTxConfig, dict]:
        """A config and a batch of ids (none of them a special id) with a random attention mask and labels."""
        shape = [self.batch_size, self.seq_length]
        input_ids = ids_tensor(shape, self.vocab_size - 3) + 3  # no pad/bos/eos inside the batch
        inputs = {"input_ids": input_ids, "attention_mask": random_attention_mask(shape)}
        if self.is_encoder_decoder:
            inputs["decoder_input_ids"] = ids_tensor(shape, self.vocab_size - 3) + 3
            inputs["decoder_attention_mask"] = random_attention_mask(shape)
        if self.use_labels:
            inputs["labels"] = ids_tensor(shape, self.vocab_size)
        return self.get_config(), inputs

    def prepare_config_and_inputs_for_common(self) -> tuple[MiniTxConfig, dict]:
        """The config and the inputs every model class takes (labels left out: not all heads take them)."""
        config, inputs = self.prepare_config_and_inputs()
        inputs.pop("labels", None)
        return config, inputs


# transformers tells base models from LM heads by its own auto-class registry, which a custom model is not in:
# the tests see MiniTx registered there the way transformers' own models are (copies, patched per test)
REGISTRY = {
    "MODEL_MAPPING_NAMES": "MiniTxModel",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "MiniTxForCausalLM",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": "MiniTxForConditionalGeneration",
}


class MiniTxCommonTests(ModelTesterMixin):
    """What both kinds share: the tester, the config test, and the common tests that do not apply to MiniTx."""

    is_encoder_decoder = False
    options: dict = {}  # config fields of the models under test, beyond the tester's
    test_torch_exportable = False  # the export mixin is not part of the sdist

    def setUp(self):
        for name, class_name in REGISTRY.items():
            names = {**getattr(modeling_common, name), MiniTxConfig.model_type: class_name}
            patcher = mock.patch.object(modeling_common, name, names)
            patcher.start()
            self.addCleanup(patcher.stop)
        self.model_tester = MiniTxModelTester(self, is_encoder_decoder=self.is_encoder_decoder, options=self.options)
        kind = {"is_encoder_decoder": True} if self.is_encoder_decoder else {}  # a default is not saved
        self.config_tester = ConfigTester(self, config_class=MiniTxConfig, hidden_size=32, **kind)

    def test_config(self):
        self.config_tester.run_common_tests()

    @unittest.skip(reason="transformers' generation test mixin is not part of the sdist; MiniTx's generate() "
                          "contracts are covered by tests/models/test_generation.py and its neighbours")
    def test_generation_tester_mixin_inheritance(self):
        pass


class MiniTxForCausalLMCommonTest(MiniTxCommonTests, unittest.TestCase):
    all_model_classes = (MiniTxModel, MiniTxForCausalLM)


class MiniTxForConditionalGenerationCommonTest(MiniTxCommonTests, unittest.TestCase):
    all_model_classes = (MiniTxModel, MiniTxForConditionalGeneration)
    is_encoder_decoder = True


class MiniTxExtraPiecesCommonTest(MiniTxCommonTests, unittest.TestCase):
    """The causal model with every extra piece on (config.EXTRA_PIECES): the peer contracts hold with them."""

    all_model_classes = (MiniTxModel, MiniTxForCausalLM)
    options = dict.fromkeys(EXTRA_PIECES, True)
