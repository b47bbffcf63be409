"""One scheduler process per TP rank: holds its GPU, logs its startup phases, reports load.

Started by the main process as `python -m search.emulator.ranks` with the plan as the first
line on stdin. A SIGKILLed parent leaves it running (an orphan) with its GPU held until it is
killed itself, whether serving or still starting: SGLang asks for PR_SET_PDEATHSIG, yet schedulers
reparented to init that keep their GPUs are what users report (sglang issue 23627, PR 31645).
A SIGTERM ends it cleanly.
Protocol: it writes `init` to the fd named in the plan at torch distributed's collectives and
waits for `go` on stdin, then `ready` when started; later stdin lines are `load RUNNING
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
from search.emulator.logs import Logger

GIB_MIB = 1024
# Power and utilization rise with the load served (the seed saw ~250 W of 600 W at 880-3,740 tok/s).
_POWER_SPAN_W = 200.0
_POWER_HALF_RATE = 500.0
# 0.5.23's prefill capture, as a part of the (decode) graph-capture time it comes on top of.
_PREFILL_GRAPH_SHARE = 0.3


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
        self.parent = os.getppid()  # SGLang keeps psutil.Process().parent() from the start
        self.ready_fd: int = plan["ready_fd"]
        self.lock_fd: int | None = None
        self.used_mib = 600
        occupant = plan["occupants"][self.rank]
        self.occupant = gpu_state.GpuState(**occupant) if occupant else None

    # --- phases -------------------------------------------------------------------------
    def run(self) -> None:
        self.log.say("dist_begin")
        if self.gpu >= self.plan["host_gpus"]:
            self.crash("starting", "RuntimeError: CUDA error: invalid device ordinal")
        # Another process's GPU cannot be locked: this rank then shares it, as CUDA lets it.
        self.lock_fd = gpu_state.try_lock(self.state_dir, self.gpu)
        self.publish(0, 0.0)
        self.sleep(self.seconds["starting"])
        self.rendezvous()
        # Up to 0.5.9 the balance check is part of init_torch_distributed; 0.5.23 checks after
        # "Init parallel ends" and its "Memory baseline taken" (distributed/bootstrap.py).
        check_late = "baseline" in self.log.words
        if not check_late:
            self.check_memory_balance()
        self.log.say("dist_end", elapsed=self.seconds["starting"], usage=0.59)
        self.log.say("baseline", usage=0.59)
        if check_late:
            self.check_memory_balance()
        self.loading()
        self.kv_cache()
        if self.plan["autotune"]:
            self.autotune()
        prefill_first = self.log.version == "0.5.23"  # up to 0.5.9 the piecewise capture comes after decode's
        if self.plan["prefill_graph"] and prefill_first:
            self.prefill_graph()
        if self.plan["cuda_graph"]:
            self.cuda_graph()
        if self.plan["prefill_graph"] and not prefill_first:
            self.prefill_graph()
        if self.rank == 0:
            p = self.plan
            self.log.say("max_tokens", tokens=p["kv_tokens"], chunked=p["chunked_prefill_size"],
                         prefill=p["max_prefill_tokens"], mrr=p["max_running_requests"],
                         ctx=p["context_len"], avail=self.avail())

    def rendezvous(self) -> None:
        """The collectives of init_torch_distributed: wait here until every rank arrived (relayed
        by the main process: `init` out, `go` back). Once the parent is gone the ranks' own
        collective would still complete, so an orphan goes on."""
        try:
            os.write(self.ready_fd, b"init\n")
        except BrokenPipeError:
            return
        sys.stdin.readline()  # "go", or "" at EOF when the parent is gone

    def free_gib(self, rank: int) -> float:
        """What `get_available_gpu_memory` reads on the rank's GPU at startup (GiB, unrounded).

        Never below 0: the built-in GLM-5 weights overfill a GPU at tp <= 2, so a holder's
        published use can exceed the GPU; a real GPU is then simply full.
        """
        occupant = self.plan["occupants"][rank]
        used = occupant["memory_used_mib"] if occupant else gpu_state.IDLE_USED_MIB
        return max(gpu_state.TOTAL_MIB - used, 0) / GIB_MIB

    def check_memory_balance(self) -> None:
        """SGLang's TP memory check: the all-reduced minimum of free memory against this rank's own.

        Every rank with more than 1/0.9 of the least free memory raises (the ranks on the free
        GPUs, not the occupied one), unless SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK is false: then
        each logs the same text and goes on. A single GPU is never checked.
        """
        least = min(self.free_gib(r) for r in range(self.plan["tp"]))
        local = self.free_gib(self.rank)
        if self.plan["tp"] == 1 or least >= local * 0.9:
            return
        message = self.log.words["unbalanced"].format(least=least, local=local, local90=local * 0.9)
        if self.plan["balance_check"]:
            self.crash("unbalanced", f"RuntimeError: {message}")
        self.log.raw(message)

    def enter(self, phase: str) -> None:
        """At a phase's first line: stop here for good if the landscape hangs this phase."""
        if self.plan["hang"] == phase:
            while True:
                signal.pause()

    def fail(self, phase: str, after: float = 0.0) -> None:
        """Where the landscape's failure of `phase` strikes (`after` seconds on, when it does): the
        failing ranks raise, the others wait in a collective until the main process kills them."""
        if self.failure and self.failure["phase"] == phase:
            self.sleep(after)
            if self.fails_here:
                self.crash(phase, self.failure["error"])
            while True:
                signal.pause()

    def loading(self) -> None:
        self.log.say("load_begin", avail=self.avail())
        self.enter("loading")
        total, seconds = self.plan["shards"], self.seconds["loading"]
        shard_gib = self.plan["weights_gib"] / total
        # On a GPU another process fills, the shards that fit load, then the next one OOMs while
        # it loads: never at once, so a rank on a free GPU raising at the balance check (no work
        # after the collective) is first, as it is on real GPUs.
        fits = int(self.free_gib(self.rank) // shard_gib) if self.occupant else total
        bar = self.log.bar("shards_bar", total, seconds, self.log.words[self.plan["shards_desc"]]) if self.rank == 0 else None
        for done in range(1, total + 1):
            self.sleep(seconds / total)
            if done > fits:
                self.crash("loading", self.shard_oom(shard_gib, fits))
            if bar:
                bar.update()
            if done == max(1, total // 2):
                self.fail("loading")  # part-way, as a real loading failure
        if bar:
            bar.close()
        self.used_mib = int(self.plan["weights_gib"] * GIB_MIB)
        self.publish(0, 0.0)
        self.log.say("load_end", elapsed=seconds, arch=self.plan["arch"], quant=self.plan["quantization"],
                     avail=self.avail(), usage=self.plan["weights_gib"])

    def shard_oom(self, shard_gib: float, loaded: int) -> str:
        """PyTorch's CUDA OOM text for the shard after `loaded` ones, on a GPU the occupant fills."""
        assert self.occupant is not None
        mine_mib = self.used_mib + loaded * shard_gib * GIB_MIB
        free_mib = max(self.free_gib(self.rank) * GIB_MIB - loaded * shard_gib * GIB_MIB, 0.0)
        device = self.plan["base_gpu_id"] + self.rank
        return (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {shard_gib:.2f} GiB. GPU {device} "
                f"has a total capacity of {self.plan['gpu_gib']:.2f} GiB of which {free_mib:.2f} MiB is free. "
                f"Process {self.occupant.pid} has {self.occupant.memory_used_mib / GIB_MIB:.2f} GiB memory in use. "
                f"Including non-PyTorch memory, this process has {mine_mib / GIB_MIB:.2f} GiB memory in use.")

    def kv_cache(self) -> None:
        if self.rank == 0:
            self.log.say("kv_dtype")
        self.enter("kv_cache")
        self.sleep(self.seconds["kv_cache"] / 2)
        self.fail("kv_cache")
        self.sleep(self.seconds["kv_cache"] / 2)
        self.used_mib = int(self.plan["pool_gib"] * GIB_MIB)
        self.publish(0, 0.0)
        self.log.say("kv_alloc", tokens=self.plan["kv_tokens"], kv=self.plan["pool_gib"] - self.plan["weights_gib"])
        self.log.say("pool_end", avail=self.avail())

    def autotune(self) -> None:
        self.log.say("autotune_begin", cache=self.plan["autotune_cache"])
        self.log.flashinfer("tuner_start")
        self.enter("autotune")
        self.sleep(self.seconds["autotune"] / 2)
        self.fail("autotune")
        self.sleep(self.seconds["autotune"] / 2)
        self.log.flashinfer("tuner_end")
        self.log.say("autotune_end")

    def prefill_graph(self) -> None:
        """Prefill capture: 0.5.23's (backend breakable by default) before decode's, 0.5.9's opt-in
        piecewise one after it."""
        sizes, seconds = self.plan["prefill_graph_tokens"], self.seconds["cuda_graph"] * _PREFILL_GRAPH_SHARE
        self.log.say("prefill_graph_begin", backend=self.plan["prefill_graph_backend"], num_tokens=sizes,
                     avail=self.avail())
        self.enter("cuda_graph")
        bar = self.log.bar("graph_bar", len(sizes), seconds) if self.rank == 0 else None
        for size in reversed(sizes):
            if bar:
                bar.set_description(self.log.words["prefill_graph_desc"].format(num_tokens=size, avail=self.avail()))
            self.sleep(seconds / len(sizes))
            if bar:
                bar.update()
        if bar:
            bar.close()
        self.used_mib += GIB_MIB // 2
        self.publish(0, 0.0)
        self.log.say("prefill_graph_end", elapsed=seconds, usage=0.5, avail=self.avail())

    def cuda_graph(self) -> None:
        """Capture from the largest batch down; a capture failure strikes at the first (largest)."""
        bs, seconds = self.plan["graph_bs"], self.seconds["cuda_graph"]
        self.log.say("graph_begin", avail=self.avail(), backend=self.plan["graph_backend"])
        if self.rank == 0:
            self.log.say("graph_bs", bs=bs)
        self.enter("cuda_graph")
        bar = self.log.bar("graph_bar", len(bs), seconds) if self.rank == 0 else None
        for size in reversed(bs):
            if bar:
                bar.set_description(self.log.words["graph_desc"].format(bs=size, avail=self.avail()))
            self.sleep(seconds / len(bs))
            self.fail("cuda_graph")
            if bar:
                bar.update()
        self.fail("cuda_graph")  # reached only when there was no batch size to capture
        if bar:
            bar.close()
        self.used_mib += 3 * GIB_MIB
        self.publish(0, 0.0)
        self.log.say("graph_end", elapsed=seconds, usage=3.0, avail=self.avail(), bs=bs)

    # --- serving ------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            os.write(self.ready_fd, b"ready\n")
        except BrokenPipeError:
            pass  # the parent died during startup: stdin is at EOF too, so this rank is an orphan below
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["load"] and len(words) == 3:
                self.publish(int(words[1]), float(words[2]))
            elif words == ["warmup"]:
                self.enter("warmup")
                self.fail("warmup", after=self.seconds["warmup"] / 2)
        self.publish(0, 0.0)  # parent gone: an orphan keeps its GPU until killed
        while True:
            signal.pause()

    def publish(self, running: int, tokens_per_s: float) -> None:
        if self.lock_fd is None:
            return  # a shared GPU shows its holder's state
        power = gpu_state.IDLE_POWER_W + _POWER_SPAN_W * tokens_per_s / (tokens_per_s + _POWER_HALF_RATE)
        utilization = round(100 * running / (running + 8)) if running else 0
        gpu_state.write(self.state_dir, gpu_state.GpuState(
            index=self.gpu, pid=os.getpid(), memory_used_mib=self.used_mib,
            power_draw_w=round(power, 2), utilization_pct=utilization))

    # --- helpers ------------------------------------------------------------------------
    def avail(self) -> float:
        shared = self.occupant.memory_used_mib if self.occupant else 0
        return self.plan["gpu_gib"] - (self.used_mib + shared) / GIB_MIB

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def crash(self, frames: str, error: str) -> None:
        """Log the exception as SGLang's scheduler does, SIGQUIT the parent if it lives, and die."""
        self.log.exception(frames, error)
        if os.getppid() == self.parent:  # an orphan's parent is gone; never signal its new one
            os.kill(self.parent, signal.SIGQUIT)
        os._exit(1)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    plan = json.loads(sys.stdin.readline())
    rank = Rank(plan)
    rank.run()
    rank.serve()


if __name__ == "__main__":
    main()
