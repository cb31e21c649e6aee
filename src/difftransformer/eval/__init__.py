"""The paper's experiments (SPEC §5) as functions that work on any transformers causal LM.

One module per task: needle (multi-needle retrieval and the reusable sample generator), attention
(attention allocation), outliers, quant (attention-logit quantisation), longctx, icl, mqar; ``logits``
hooks attention logits on our models and on transformers models alike; ``cli`` is ``difftransformer eval``.
"""

from difftransformer.eval.needle import NeedleSample, make_needle_sample

__all__ = ["NeedleSample", "make_needle_sample"]
