"""transformers' common model tests (``ModelTesterMixin``) on our three attention kinds.

The test files come from the installed transformers version's sdist (see tests/hf_common_fetch.py). Skips below
carry a one-line reason each; docs/architecture.md lists them.
"""

from __future__ import annotations

import sys
import unittest
from functools import partialmethod

import pytest
import torch

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM, DiffTransformerModel
from difftransformer.models.modeling import DiffTransformerPreTrainedModel
from hf_common_fetch import FetchError, common_tests_path

try:
    sys.path.insert(0, str(common_tests_path()))
except FetchError as error:
    pytest.skip(f"transformers' common tests unavailable: {error}", allow_module_level=True)

from transformers.models.auto.modeling_auto import (  # noqa: E402
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_MAPPING_NAMES,
)
from transformers_tests.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402

from kind_table import KIND_FIELDS  # noqa: E402

KINDS = KIND_FIELDS  # every kind the package declares (tests/kind_table.py)


class DiffTransformerModelTester:
    """Tiny configs and inputs in the shape ModelTesterMixin asks of a model tester."""

    def __init__(self, parent: unittest.TestCase, kind: str) -> None:
        self.parent, self.kind = parent, kind
        self.batch_size, self.seq_length, self.vocab_size = 4, 7, 99
        self.hidden_size, self.num_hidden_layers = 32, 2
        self.num_attention_heads = KINDS[kind]["num_attention_heads"]
        self.is_training = True

    def get_config(self) -> DiffTransformerConfig:
        return DiffTransformerConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=37,
            num_hidden_layers=self.num_hidden_layers,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            **KINDS[self.kind],
        )

    def prepare_config_and_inputs_for_common(self) -> tuple[DiffTransformerConfig, dict[str, torch.Tensor]]:
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = torch.tril(torch.ones_like(input_ids))  # right padding of every length
        return self.get_config(), {"input_ids": input_ids, "attention_mask": attention_mask}


# The default suite runs these (seconds per kind); `make test-slow` runs every other test of the mixin.
FAST = (
    "test_model_outputs_equivalence",  # return_dict=False gives tuples
    "test_keep_in_fp32_modules_exist",  # the float32 list names modules this kind has
    "test_retain_grad_hidden_states_attentions",  # returned maps are in the graph
    "test_attention_outputs",
    "test_batching_equivalence",
    "test_can_set_attention_dynamically",  # attn_implementation is applied
    "test_tp_plan_matches_params",
    "test_training",
    "test_model_rope_scaling_frequencies",  # RotaryEmbedding(config=...), as transformers' rotary classes
    "test_reverse_loading_mapping",  # the lambda vectors' names on disk and in transformers' original format
    # output_loading_info=True returns transformers' report (models/loading.py), naming exactly what is missing
    "test_model_weights_reload_no_missing_tied_weights",
)


class _CommonTests(ModelTesterMixin):
    """The mixin on one attention kind; ``fast`` keeps only the FAST tests, else only the others."""

    kind = ""
    fast = True

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name in [name for name in dir(cls) if name.startswith("test_")]:
            if (name in FAST) != cls.fast:
                setattr(cls, name, None)  # not collected

    all_model_classes = (DiffTransformerModel, DiffTransformerForCausalLM)
    # The mixin runs this init test only for models whose config file carries a copyright year of 2023 or later.
    test_can_init_all_missing_weights_before_2023 = True

    @classmethod
    def setUpClass(cls) -> None:
        # The mixin asks transformers' name tables which class is a base model and which a causal LM (to give
        # the latter labels); AutoModel.register() adds ours to the Auto classes but not to those tables.
        cls._tables = pytest.MonkeyPatch()
        cls._tables.setitem(MODEL_MAPPING_NAMES, "difftransformer", "DiffTransformerModel")
        cls._tables.setitem(
            MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "difftransformer", "DiffTransformerForCausalLM"
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls._tables.undo()

    def setUp(self) -> None:
        self.model_tester = DiffTransformerModelTester(self, self.kind)

    @unittest.skip(
        "GenerationTesterMixin is not in the sdist; tests/test_hf_common.py tests generation itself"
    )
    def test_generation_tester_mixin_inheritance(self):
        pass

    def test_reverse_loading_mapping(self):
        if self.kind not in ("diff", "gda"):
            self.skipTest(
                "the registered key mapping renames DIFF V1's and GDA's lambda vectors; this kind has none "
                "(transformers keys mappings by model type, which the kinds share)"
            )
        # Our save_pretrained writes the in-memory names (what tools reading a checkpoint by parameter name find);
        # the mapping's original format, DiffLlama's lambda names, is what save_original_format=True writes.
        with pytest.MonkeyPatch.context() as patch:
            original_format = partialmethod(
                DiffTransformerPreTrainedModel.save_pretrained, save_original_format=True
            )
            patch.setattr(DiffTransformerPreTrainedModel, "save_pretrained", original_format)
            super().test_reverse_loading_mapping()


class TestDiffV1CommonFast(_CommonTests, unittest.TestCase):
    kind, fast = "diff", True


class TestDiffV2CommonFast(_CommonTests, unittest.TestCase):
    kind, fast = "diff_v2", True


class TestSoftmaxCommonFast(_CommonTests, unittest.TestCase):
    kind, fast = "softmax", True


class TestGDACommonFast(_CommonTests, unittest.TestCase):
    kind, fast = "gda", True


class TestGatedCommonFast(_CommonTests, unittest.TestCase):
    kind, fast = "gated", True


@pytest.mark.slow
class TestDiffV1Common(_CommonTests, unittest.TestCase):
    kind, fast = "diff", False


@pytest.mark.slow
class TestDiffV2Common(_CommonTests, unittest.TestCase):
    kind, fast = "diff_v2", False


@pytest.mark.slow
class TestSoftmaxCommon(_CommonTests, unittest.TestCase):
    kind, fast = "softmax", False


@pytest.mark.slow
class TestGDACommon(_CommonTests, unittest.TestCase):
    kind, fast = "gda", False


@pytest.mark.slow
class TestGatedCommon(_CommonTests, unittest.TestCase):
    kind, fast = "gated", False


# Generation: GenerationTesterMixin is not in the sdist, so the features its tests cover (and that failed on DIFF V1
# while its cache was not head_dim wide) are tested here on the same tiny configs, greedy against greedy.


def _generation_model(kind: str) -> DiffTransformerForCausalLM:
    torch.manual_seed(0)
    tester = DiffTransformerModelTester(unittest.TestCase(), kind)
    return DiffTransformerForCausalLM(tester.get_config()).eval()


GREEDY = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)


@pytest.mark.parametrize("kind", KINDS)
def test_cache_layers_are_shaped_by_the_config(kind):
    """transformers' convention: each layer caches keys and values as (B, num_key_value_heads, S, head_dim)."""
    model = _generation_model(kind)
    config = model.config
    out = model(torch.randint(3, 99, (2, 5)), use_cache=True)
    shape = (2, config.num_key_value_heads, 5, config.head_dim)
    assert len(out.past_key_values.layers) == config.num_hidden_layers
    for layer in out.past_key_values.layers:
        assert tuple(layer.keys.shape) == shape and tuple(layer.values.shape) == shape


@pytest.mark.parametrize("kind", KINDS)
def test_static_cache_and_assisted_decoding_match_greedy(kind):
    model = _generation_model(kind)
    prompt = torch.randint(3, 99, (1, 5))
    greedy = model.generate(prompt, **GREEDY)
    static = model.generate(prompt, cache_implementation="static", **GREEDY)
    assert torch.equal(static, greedy)
    torch.manual_seed(1)
    assistant = DiffTransformerForCausalLM(
        model.config
    ).eval()  # another draft model: greedy output must not move
    assert torch.equal(model.generate(prompt, assistant_model=assistant, **GREEDY), greedy)
    assert torch.equal(model.generate(prompt, prompt_lookup_num_tokens=2, **GREEDY), greedy)


@pytest.mark.parametrize("kind", KINDS)
def test_generate_continues_from_cache_and_from_embeddings(kind):
    model = _generation_model(kind)
    prompt = torch.randint(3, 99, (2, 5))
    full = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    first = model.generate(prompt, return_dict_in_generate=True, **GREEDY)
    resumed = model.generate(
        first.sequences, past_key_values=first.past_key_values, max_new_tokens=2, do_sample=False,
        pad_token_id=0, eos_token_id=None,
    )  # fmt: skip
    assert torch.equal(resumed, full)
    embeds = model.get_input_embeddings()(prompt)
    assert torch.equal(model.generate(inputs_embeds=embeds, **GREEDY), full[:, 5:11])


@pytest.mark.parametrize("kind", KINDS)
def test_beam_search_and_sampling_run(kind):
    model = _generation_model(kind)
    prompt = torch.randint(3, 99, (2, 5))
    beams = model.generate(prompt, num_beams=3, num_return_sequences=2, **GREEDY)
    assert beams.shape == (4, 11)
    torch.manual_seed(3)
    sampled = model.generate(prompt, do_sample=True, top_k=5, max_new_tokens=4, pad_token_id=0)
    assert sampled.shape[0] == 2 and torch.equal(sampled[:, :5], prompt)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_static_cache_generation_matches_eager(kind):
    # Every kind compiles the same forward (one code object): a clean slate, not dynamo's limit of 8 graphs for it.
    torch._dynamo.reset()
    model = _generation_model(kind)
    prompt = torch.randint(3, 99, (1, 5))
    eager = model.generate(prompt, **GREEDY)
    model.forward = torch.compile(model.forward, fullgraph=True)
    assert torch.equal(model.generate(prompt, cache_implementation="static", **GREEDY), eager)
