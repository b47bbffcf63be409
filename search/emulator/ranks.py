"""One scheduler process per TP rank: holds its GPU, logs its startup phases, reports load.

Started by the main process as `python -m search.emulator.ranks` with the plan as the first
line on stdin. Like a real SGLang scheduler it is a plain child: a SIGKILLed parent leaves it
running (an orphan) with its GPU held until it is killed itself; a SIGTERM ends it cleanly.
Protocol: it writes `ready` to the fd named in the plan; later stdin lines are `load RUNNING
TOKS_PER_S` (GPU telemetry) or `warmup` (run the warmup forward); EOF means the parent is gone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from search.emulator import gpu_state
from search.emulator.logs import Logger, tqdm_time

GIB_MIB = 1024
# Power and utilization rise with the load served (the seed saw ~250 W of 600 W at 880-3,740 tok/s).
_POWER_SPAN_W = 200.0
_POWER_HALF_RATE = 500.0


class Rank:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.rank: int = plan["rank"]
        self.gpu: int = plan["gpu"]
        self.state_dir = Path(plan["state_dir"])
        self.log = Logger(plan["version"], self.rank if plan["tp"] > 1 else None, plan["log_ms"])
        self.seconds: dict[str, float] = plan["seconds"]
        self.failure: dict[str, Any] | None = plan["failure"]
        self.fails_here = self.failure is not None and self.rank in plan["failing_ranks"]
        self.lock_fd: int | None = None
        self.used_mib = 600

    # --- phases -------------------------------------------------------------------------
    def run(self) -> None:
        self.log.say("dist_begin")
        if self.gpu >= self.plan["host_gpus"]:
            self.crash("starting", "RuntimeError: CUDA error: invalid device ordinal")
        self.lock_fd = gpu_state.try_lock(self.state_dir, self.gpu)
        if self.lock_fd is None:
            free = self.plan["gpu_gib"] * 0.05
            self.crash("starting", "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied "
                       f"by other processes. pre_model_load_memory={free:.2f}, local_gpu_memory="
                       f"{self.plan['gpu_gib']:.2f}, local_gpu_memory * 0.9={self.plan['gpu_gib'] * 0.9:.2f}")
        self.publish(0, 0.0)
        self.sleep(self.seconds["starting"])
        self.log.say("dist_end", elapsed=self.seconds["starting"], usage=0.59)
        self.loading()
        self.kv_cache()
        if self.plan["autotune"]:
            self.autotune()
        if self.plan["cuda_graph"]:
            self.cuda_graph()
        if self.rank == 0:
            p = self.plan
            self.log.say("max_tokens", tokens=p["kv_tokens"], chunked=p["chunked_prefill_size"],
                         prefill=p["max_prefill_tokens"], mrr=p["max_running_requests"],
                         ctx=p["context_len"], avail=self.avail())

    def enter(self, phase: str) -> None:
        """At a phase's first line: stop here if this phase hangs; crash midway if it fails here."""
        if self.plan["hang"] == phase:
            while True:
                signal.pause()
        if self.failure and self.failure["phase"] == phase:
            self.sleep(self.seconds.get(phase, 0.0) / 2)
            if self.fails_here:
                self.crash(phase, self.failure["error"])
            while True:  # the other ranks wait in a collective until the main process kills them
                signal.pause()

    def loading(self) -> None:
        self.log.say("load_begin", avail=self.avail())
        self.enter("loading")
        total, seconds = self.plan["shards"], self.seconds["loading"]
        for done in range(1, total + 1):
            self.sleep(seconds / total)
            if self.rank == 0:
                elapsed = seconds * done / total
                self.log.bar("shards", pct=100 * done // total, done=done, total=total,
                             elapsed=tqdm_time(elapsed), left=tqdm_time(seconds - elapsed),
                             rate=total / seconds if seconds else 0.0)
        self.used_mib = int(self.plan["weights_gib"] * GIB_MIB)
        self.publish(0, 0.0)
        self.log.say("load_end", elapsed=seconds, arch=self.plan["arch"], avail=self.avail(),
                     usage=self.plan["weights_gib"])

    def kv_cache(self) -> None:
        if self.rank == 0:
            self.log.say("kv_dtype")
        self.enter("kv_cache")
        self.sleep(self.seconds["kv_cache"])
        self.used_mib = int(self.plan["pool_gib"] * GIB_MIB)
        self.publish(0, 0.0)
        self.log.say("kv_alloc", tokens=self.plan["kv_tokens"], kv=self.plan["pool_gib"] - self.plan["weights_gib"])
        self.log.say("pool_end", avail=self.avail())

    def autotune(self) -> None:
        self.log.say("autotune_begin", cache=self.plan["autotune_cache"])
        self.log.raw(self.log.words["tuner_start"])
        self.enter("autotune")
        self.sleep(self.seconds["autotune"])
        self.log.raw(self.log.words["tuner_end"])
        self.log.say("autotune_end")

    def cuda_graph(self) -> None:
        bs = self.plan["graph_bs"]
        self.log.say("graph_begin", avail=self.avail(), role="target")
        if self.rank == 0:
            self.log.say("graph_bs", bs=bs)
        self.enter("cuda_graph")
        seconds = self.seconds["cuda_graph"]
        for done, size in enumerate(reversed(bs), start=1):
            self.sleep(seconds / len(bs))
            if self.rank == 0:
                elapsed = seconds * done / len(bs)
                self.log.bar("graph_bar", bs=size, avail=self.avail(), pct=100 * done // len(bs),
                             bar=("█" * (10 * done // len(bs))).ljust(10), done=done, total=len(bs),
                             elapsed=tqdm_time(elapsed), left=tqdm_time(seconds - elapsed),
                             rate=len(bs) / seconds if seconds else 0.0)
        self.used_mib += 3 * GIB_MIB
        self.publish(0, 0.0)
        self.log.say("graph_end", elapsed=seconds, usage=3.0, avail=self.avail(), role="target", bs=bs)

    # --- serving ------------------------------------------------------------------------
    def serve(self, ready_fd: int) -> None:
        os.write(ready_fd, b"ready\n")
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["load"] and len(words) == 3:
                self.publish(int(words[1]), float(words[2]))
            elif words == ["warmup"]:
                self.enter("warmup")
        self.publish(0, 0.0)  # parent gone: an orphan keeps its GPU until killed
        while True:
            signal.pause()

    def publish(self, running: int, tokens_per_s: float) -> None:
        power = gpu_state.IDLE_POWER_W + _POWER_SPAN_W * tokens_per_s / (tokens_per_s + _POWER_HALF_RATE)
        utilization = round(100 * running / (running + 8)) if running else 0
        gpu_state.write(self.state_dir, gpu_state.GpuState(
            index=self.gpu, pid=os.getpid(), memory_used_mib=self.used_mib,
            power_draw_w=round(power, 2), utilization_pct=utilization))

    # --- helpers ------------------------------------------------------------------------
    def avail(self) -> float:
        return self.plan["gpu_gib"] - self.used_mib / GIB_MIB

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def crash(self, phase: str, error: str) -> None:
        """Log the exception as SGLang's scheduler does, SIGQUIT the parent, and die."""
        self.log.exception(phase, error)
        try:
            os.kill(os.getppid(), signal.SIGQUIT)
        except ProcessLookupError:
            pass
        os._exit(1)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    plan = json.loads(sys.stdin.readline())
    rank = Rank(plan)
    rank.run()
    rank.serve(plan["ready_fd"])


if __name__ == "__main__":
    main()
