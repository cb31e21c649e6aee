"""Folders saved by an earlier main load unchanged: the same logits and the same greedy tokens, for every kind.

tests/data/folders-92575d6 holds tiny models of every attention kind (randomised weights: tests/helpers.randomize)
saved by main at 92575d6, the last commit before the attention kinds became points of the space of parts, with the
logits and greedy tokens that commit computed for them (expected.safetensors; inputs.json: a batch with left padding).
Only config.json and model.safetensors were kept: they are what a later package reads.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from difftransformer import DiffTransformerConfig, DiffTransformerForCausalLM

FOLDERS = Path(__file__).parent / "data" / "folders-92575d6"
EXPECTED = load_file(FOLDERS / "expected.safetensors")
INPUTS = json.loads((FOLDERS / "inputs.json").read_text())
NAMES = sorted(p.name for p in FOLDERS.iterdir() if p.is_dir())


def test_every_kind_of_that_main_is_here():
    kinds = {json.loads((FOLDERS / name / "config.json").read_text())["attention"] for name in NAMES}
    assert kinds == {"softmax", "gated", "diff_v2", "diff", "gda"}


@pytest.mark.parametrize("name", NAMES)
def test_an_earlier_folder_gives_the_logits_and_tokens_it_gave(name):
    model = DiffTransformerForCausalLM.from_pretrained(FOLDERS / name).eval()
    ids, mask = torch.tensor(INPUTS["input_ids"]), torch.tensor(INPUTS["attention_mask"])
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits
        greedy = model.generate(ids[:1, :5], max_new_tokens=8, do_sample=False)
    torch.testing.assert_close(logits, EXPECTED[f"{name}.logits"], rtol=1e-5, atol=1e-5)
    assert torch.equal(greedy, EXPECTED[f"{name}.greedy"])


@pytest.mark.parametrize("name", NAMES)
def test_an_earlier_folder_reads_as_its_kind_declares(name):
    """Before the parts, every config.json held ``subln`` and ``gda_ratio``, read only by DIFF V1 and GDA: the
    whole-head kinds keep no norm and no noise maps they never had."""
    config = DiffTransformerConfig.from_pretrained(FOLDERS / name)
    saved = json.loads((FOLDERS / name / "config.json").read_text())
    assert "map_layout" not in saved and saved["subln"] in ("affine", "plain", "none")
    if config.attention in ("diff", "gda"):
        assert config.subln == saved["subln"] and config.gda_ratio == saved["gda_ratio"]
    else:
        assert config.subln == "none"
        assert config.gda_ratio == (1 if config.attention == "diff_v2" else None)
