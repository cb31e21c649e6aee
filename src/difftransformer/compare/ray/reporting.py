"""What a run tells the scheduler while it trains (the step and the validation loss, which the progress line and
early stopping read), and how a run's log names the Ray node it runs on."""

from __future__ import annotations

from collections.abc import Callable

from transformers import TrainerCallback

EVAL_LOSS = "eval_loss"


def node_name() -> str:
    """This process's Ray node, as a run's log header names it ("Ray node ID")."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "none"
    return f"Ray node {node}"


class TuneReport(TrainerCallback):
    """Reports the step and the validation loss to the trial at each evaluation and checkpoint, and the step at each
    logging step, from the main process; with ``every_process`` (Ray Train's report, a collective every worker
    calls alike, which costs a round of messages between the workers) at evaluations and checkpoints only."""

    def __init__(self, report: Callable[[dict], None], every_process: bool = False) -> None:
        self.report, self.every_process = report, every_process

    def _reports(self, state) -> bool:
        return self.every_process or state.is_world_process_zero

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self.every_process and state.is_world_process_zero and logs and EVAL_LOSS not in logs:
            self.report({"step": state.global_step, "max_steps": state.max_steps})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._reports(state) and metrics and EVAL_LOSS in metrics:
            self.report(
                {"step": state.global_step, "max_steps": state.max_steps, EVAL_LOSS: metrics[EVAL_LOSS]}
            )

    def on_save(self, args, state, control, **kwargs):
        if self.every_process:
            self.report({"step": state.global_step, "max_steps": state.max_steps})
