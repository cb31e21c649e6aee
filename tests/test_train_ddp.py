"""Two CPU processes under torchrun (DDP over gloo, through Trainer/accelerate) against one process with the same
global batch: the logged losses agree."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from difftransformer.train.callbacks import column, read_metrics
from difftransformer.train.runner import METRICS_CSV
from helpers import free_port

SCRIPT = textwrap.dedent(
    """
    import sys
    from test_train_support import pack, small_tokenizer, synthetic_texts
    from difftransformer.train.presets import RECIPE, get_preset
    from difftransformer.train.runner import train_model
    from difftransformer.train.settings import TrainingSettings

    output_dir, batch = sys.argv[1], int(sys.argv[2])
    texts = synthetic_texts()
    tokenizer = small_tokenizer(texts)
    blocks = pack(texts, tokenizer, 32)
    config = get_preset("micro").model_config("diff", vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id)
    options = TrainingSettings(**{**RECIPE, **dict(
        output_dir=output_dir, max_steps=4, per_device_train_batch_size=batch, logging_steps=1, eval_steps=4,
        save_steps=4, learning_rate=3e-3, warmup_steps=1, report_to="none")})
    train_model(config, blocks[:-8], blocks[-8:], tokenizer, options)
    """
)


def test_two_processes_match_one(tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__), "OMP_NUM_THREADS": "1"}
    single = [sys.executable, str(script), str(tmp_path / "one"), "8"]
    subprocess.run(single, check=True, env=env, capture_output=True, timeout=300)
    ddp = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(script), str(tmp_path / "two"), "4"]  # fmt: skip
    done = subprocess.run(ddp, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one = read_metrics(tmp_path / "one" / METRICS_CSV)
    two = read_metrics(tmp_path / "two" / METRICS_CSV)
    assert column(one, "loss")[0] == column(two, "loss")[0] == [1, 2, 3, 4]
    assert column(two, "loss")[1] == pytest.approx(column(one, "loss")[1], abs=1e-5)
    assert column(two, "eval_loss")[1] == pytest.approx(column(one, "eval_loss")[1], abs=1e-5)


AT_EXIT = textwrap.dedent(
    """
    import sys
    import torch.distributed as dist
    from difftransformer.train.runner import destroy_process_group_at_exit

    destroy_process_group_at_exit()  # no group yet: nothing registered
    dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
    real = dist.destroy_process_group

    def reported(*args, **kwargs):
        print("destroyed", flush=True)
        real(*args, **kwargs)

    dist.destroy_process_group = reported
    destroy_process_group_at_exit()
    destroy_process_group_at_exit()  # registered once
    print("exiting", flush=True)
    """
)


@pytest.mark.slow
def test_a_finished_run_has_its_process_group_destroyed_at_exit(tmp_path):
    """Without it, gloo's threads can abort the exiting process (SIGABRT)."""
    done = subprocess.run(
        [sys.executable, "-c", AT_EXIT, str(tmp_path / "store")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["exiting", "destroyed"]
