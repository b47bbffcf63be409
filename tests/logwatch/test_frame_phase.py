"""The traceback frame names the phase, even when another rank's lines ran ahead of the failing one."""

from __future__ import annotations

from search.logwatch import LogClassifier

INTERLEAVED = """\
[2026-12-02 11:45:39 TP0] Load weight begin. avail mem=95.00 GB
Loading safetensors checkpoint shards:  19% Completed | 16/83 [00:00<00:00, 415.00it/s]
[2026-12-02 11:45:39 TP1] Init torch distributed begin.
[2026-12-02 11:45:39 TP1] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 3046, in run_scheduler_process
    scheduler = Scheduler(
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", line 352, in __init__
    min_per_gpu_memory = self.init_torch_distributed()
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", line 661, in init_torch_distributed
    raise RuntimeError(
RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. pre_model_load_memory=4.78
[2026-12-02 11:45:39] Received sigquit from a child process. It usually means the child failed.
"""


def test_gpu_busy_is_placed_at_startup_by_its_frame() -> None:
    classifier = LogClassifier()
    for line in INTERLEAVED.splitlines():
        classifier.feed(line)
    assert classifier.failure is not None
    assert (classifier.failure.name, classifier.failure.phase) == ("gpu_busy", "starting")
    assert classifier.failure.line.startswith("RuntimeError: The memory capacity is unbalanced.")
