"""torch.compile: a decode step with a static cache compiles as one graph (no breaks) and agrees with eager."""

from __future__ import annotations

import pytest
import torch
from transformers import StaticCache

from helpers import random_model
from kind_table import KIND_FIELDS

KINDS = list(KIND_FIELDS.values())


@pytest.mark.slow
@pytest.mark.parametrize("fields", KINDS)
def test_static_cache_decode_step_compiles_fullgraph(fields):
    model = random_model(seed=1, dtype=torch.float32, **fields)
    ids = torch.randint(0, 97, (2, 10))
    cache = StaticCache(config=model.config, max_cache_len=16)
    model(ids[:, :6], past_key_values=cache, use_cache=True)
    step = torch.compile(model.forward, fullgraph=True)
    # positions given, as generate gives them: the cache's length is data the graph cannot start a range from
    logits = [
        step(
            ids[:, t : t + 1], position_ids=torch.full((2, 1), t), past_key_values=cache, use_cache=True
        ).logits
        for t in (6, 7)
    ]
    torch.testing.assert_close(torch.cat(logits, 1), model(ids[:, :8]).logits[:, 6:8], atol=1e-5, rtol=1e-5)
