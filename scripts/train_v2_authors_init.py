"""`difftransformer train` for DIFF V2 with lambda_proj initialised as the authors' released module leaves it
(PyTorch's nn.Linear default, kaiming-uniform) rather than by transformers' normal init (docs/results/retrieval.md,
"DIFF V2's failed seeds"). Every other weight and the data order stay those of the plain run of the same seed: the
reset draws from its own generator and puts the global random state back.

    python scripts/train_v2_authors_init.py --preset retrieval --attention diff_v2 --seed 0 --output-dir runs/v2init/seed0
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from difftransformer.cli import main
from difftransformer.train import runner

RESET_SEED = 12345


class AuthorsLambdaInit(runner.DiffTransformerForCausalLM):
    """The package's model with every layer's lambda_proj reset by nn.Linear.reset_parameters after the build."""

    def __init__(self, config, *args, **kwargs) -> None:
        super().__init__(config, *args, **kwargs)
        if config.attention != "diff_v2":
            raise SystemExit(f"this script trains DIFF V2 (--attention diff_v2); got {config.attention!r}")
        state = torch.random.get_rng_state()
        torch.manual_seed(RESET_SEED)
        with torch.no_grad():
            for layer in self.model.layers:
                nn.Linear.reset_parameters(layer.self_attn.lambda_proj)
        torch.random.set_rng_state(state)


if __name__ == "__main__":
    runner.DiffTransformerForCausalLM = AuthorsLambdaInit
    sys.exit(main(["train", *sys.argv[1:]]))
