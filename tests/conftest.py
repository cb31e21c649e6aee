import os

import pytest
import torch
from hypothesis import settings

settings.register_profile("default", max_examples=25, deadline=None, derandomize=True)
settings.register_profile("thorough", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield
