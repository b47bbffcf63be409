"""SGLang's log lines: the `[time TPn]` prefix and each version's wording.

Wording is data (WORDING below, from ../../shared/reference/sglang.md section 2): 0.5.8.post1 and
0.5.9 share a family with two small differences, 0.5.23 is reworded in places.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

_COMMON = {
    "dist_begin": "Init torch distributed begin.",
    "load_begin": "Load weight begin. avail mem={avail:.2f} GB",
    # tqdm bar formats (srt/utils/common.py BAR_FORMAT; tqdm's default for graph capture).
    "shards_bar": "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\n",
    "shards_desc": "Loading safetensors checkpoint shards",
    "graph_bar": "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]",
    "graph_desc": "Capturing batches (bs={bs} avail_mem={avail:.2f} GB)",
    "kv_dtype": "Using KV cache dtype: torch.bfloat16",
    "kv_alloc": "KV Cache is allocated. #tokens: {tokens}, KV size: {kv:.2f} GB",
    "pool_end": "Memory pool end. avail mem={avail:.2f} GB",
    "autotune_end": "FlashInfer autotune completed.",
    "tuner_start": "flashinfer.jit: [Autotuner]: Autotuning process starts ...",
    "tuner_end": "flashinfer.jit: [Autotuner]: Autotuning process ends",
    "graph_bs": "Capture cuda graph bs {bs}",
    "graph_end": "Capture cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage={usage:.2f} GB. avail mem={avail:.2f} GB.",
    "max_tokens": "max_total_num_tokens={tokens}, chunked_prefill_size={chunked}, max_prefill_tokens={prefill}, max_running_requests={mrr}, context_len={ctx}, available_gpu_mem={avail:.2f} GB",
    "exception": "Scheduler hit an exception: {traceback}",
    # The launch-phase SIGQUIT handler (engine.py); once the tokenizer manager's loop runs (from
    # the warmup request on) loop.add_signal_handler's handler takes over, called without args.
    "sigquit": "Received sigquit from a child process. It usually means the child failed.",
    "sigquit_running": "SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
    "watchdog": "Scheduler watchdog timeout (self.watchdog_timeout={timeout}, self.soft=False)",
    "ready": "The server is fired up and ready to roll!",
    # http_server.py _execute_server_warmup: /model_info never answered in its 120 tries.
    "warmup_failed": "Initialization failed. warmup error: {traceback}",
    "nan": "Detected errors during sampling! NaN in the logits.",
}
_FAMILY_0_5_9 = {
    **_COMMON,
    "dist_end": "Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB",
    "load_end": "Load weight end. elapsed={elapsed:.2f} s, type={arch}, dtype=torch.bfloat16, avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.",
    "autotune_begin": "Running FlashInfer autotune...",
    "graph_begin": "Capture cuda graph begin. This can take up to several minutes. avail mem={avail:.2f} GB",
    "prefill": "Prefill batch, #new-seq: {seqs}, #new-token: {new}, #cached-token: 0, token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, input throughput (token/s): {rate:.2f}, cuda graph: {prefill_graph}",
    "decode": "Decode batch, #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, cuda graph: {graph}, gen throughput (token/s): {rate:.2f}, #queue-req: {queued}",
    # model_runner.py init_torch_distributed (a RuntimeError, or a warning when the check is off).
    "unbalanced": "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. min_per_gpu_memory={least!r}, local_gpu_memory={local!r}, local_gpu_memory * 0.9={local90!r}",
    # A rank dead before it reported ready (engine.py _wait_for_scheduler_ready); then EOFError.
    "init_dead": "Rank {rank} scheduler is dead. Please check if there are relevant logs.",
    "init_dead_code": "Exit code: {code}",
}
WORDING = {
    "0.5.8.post1": {
        **_FAMILY_0_5_9,
        "dist_end": "Init torch distributed ends. mem usage={usage:.2f} GB",
        "load_end": "Load weight end. type={arch}, dtype=torch.bfloat16, avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.",
        # scheduler_metrics_mixin.py: both lines end in "#queue-req: N, "; 0.5.9 appended to them.
        "prefill": "Prefill batch, #new-seq: {seqs}, #new-token: {new}, #cached-token: 0, token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, ",
        "decode": "Decode batch, #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, cuda graph: {graph}, gen throughput (token/s): {rate:.2f}, #queue-req: {queued}, ",
    },
    "0.5.9": _FAMILY_0_5_9,
    "0.5.23": {
        **_FAMILY_0_5_9,
        "load_end": "Load weight end. elapsed={elapsed:.2f} s, type={arch}, avail mem={avail:.2f} GB, mem usage={usage:.2f} GB.",
        "autotune_begin": "Running FlashInfer autotune with cache: {cache}",
        "graph_begin": "Capture {role} decode cuda graph begin. backend={backend}, num_tokens_per_req=1, avail mem={avail:.2f} GB",
        # cuda_graph_setup.py: the batch sizes move into the end line; no separate "bs" line.
        "graph_bs": None,
        "graph_end": "Capture {role} decode cuda graph end. bs={bs}, elapsed={elapsed:.2f} s, mem usage={usage:.2f} GB, avail mem={avail:.2f} GB.",
        # The subprocess watchdog notices a dead rank within a second and SIGQUITs the main process.
        "child_crashed": "Subprocess scheduler_{rank} (pid={pid}) crashed with exit code {code}. Triggering SIGQUIT for cleanup...",
        "init_dead": None,
        "init_dead_code": None,
        "init_died": "Rank {rank} scheduler died during initialization (exit code: {code}). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
        "prefill": "Prefill batch, #new-seq: {seqs}, #new-token: {new}, #cached-token: 0, token usage: {usage:.2f}, #running-req: {running}, #queue-req: {queued}, #pending-token: 0, cuda graph: {prefill_graph}, input throughput (token/s): {rate:.2f}",
        # distributed/bootstrap.py _check_tp_memory_balance.
        "unbalanced": "The memory capacity is unbalanced. Some GPUs may be occupied by other processes. pre_model_load_memory={least!r}, local_gpu_memory={local!r}, local_gpu_memory * 0.9={local90!r}",
        # BAR_FORMAT lost its trailing newline: redraws share one line until the bar closes.
        "shards_bar": "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]",
    },
}


_SITE = "/usr/local/lib/python3.12/dist-packages"
_HEAD = [("managers/scheduler.py", 3046, "run_scheduler_process", "scheduler = Scheduler("),
         ("managers/scheduler.py", 383, "__init__", "self.tp_worker = TpModelWorker("),
         ("managers/tp_worker.py", 254, "__init__", "self.model_runner = ModelRunner(")]
# Innermost frames per failing phase; the function names are the ones real tracebacks show.
_FRAMES = {
    "loading": _HEAD + [("model_executor/model_runner.py", 396, "initialize", "self.load_model()"),
                        ("model_executor/model_runner.py", 802, "load_model", "self.model = get_model("),
                        ("model_loader/loader.py", 634, "load_weights", "model.load_weights(weights)")],
    "kv_cache": _HEAD + [("model_executor/model_runner.py", 437, "initialize", "self.init_memory_pool("),
                         ("model_executor/model_runner.py", 1736, "init_memory_pool", "self.max_total_num_tokens = self.profile_max_num_token(total_gpu_memory)"),
                         ("model_executor/model_runner.py", 1498, "profile_max_num_token", "raise RuntimeError(")],
    "autotune": _HEAD + [("model_executor/model_runner.py", 460, "initialize", "self.kernel_warmup()"),
                         ("model_executor/model_runner.py", 1953, "kernel_warmup", "self._flashinfer_autotune()"),
                         ("model_executor/model_runner.py", 1981, "_flashinfer_autotune", "self._dummy_run(batch_size=self.req_to_token_pool.size)")],
    "cuda_graph": _HEAD + [("model_executor/model_runner.py", 466, "initialize", "self.init_device_graphs()"),
                           ("model_executor/model_runner.py", 2231, "init_device_graphs", "self.graph_runner = CudaGraphRunner(self)"),
                           ("model_executor/cuda_graph_runner.py", 381, "__init__", "raise Exception(")],
    "warmup": [("managers/scheduler.py", 3061, "run_scheduler_process", "scheduler.event_loop_overlap()"),
               ("managers/scheduler.py", 1005, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
               ("managers/scheduler.py", 2093, "run_batch", "logits_output, next_token_ids = self.tp_worker.forward_batch_generation("),
               ("model_executor/model_runner.py", 2412, "forward", "return self._forward_raw(")],
    # Not a scheduler's: the main process's warmup thread polling /model_info (http_server.py).
    "warmup_poll": [("entrypoints/http_server.py", 2373, "_execute_server_warmup", "res = requests.get(")],
    "starting": [("managers/scheduler.py", 3046, "run_scheduler_process", "scheduler = Scheduler("),
                 ("model_executor/model_runner.py", 352, "__init__", "min_per_gpu_memory = self.init_torch_distributed()"),
                 ("model_executor/model_runner.py", 661, "init_torch_distributed", "raise RuntimeError(")],
}
# The memory-balance check: in init_torch_distributed up to 0.5.9, moved to bootstrap.py in 0.5.23.
_UNBALANCED = {
    "0.5.9": [*_FRAMES["starting"][:2],
              ("model_executor/model_runner.py", 844, "init_torch_distributed", "raise RuntimeError(msg)")],
    "0.5.23": [*_FRAMES["starting"][:1],
               ("model_executor/model_runner.py", 1262, "init_torch_distributed",
                "self.pre_model_load_memory = bootstrap.measure_pre_model_load_memory("),
               ("distributed/bootstrap.py", 215, "measure_pre_model_load_memory", "_check_tp_memory_balance("),
               ("distributed/bootstrap.py", 450, "_check_tp_memory_balance", "raise RuntimeError(msg)")],
}
# tqdm's bar for a file without a known width: 10 cells of Unicode eighths.
_BAR_CELLS = 10
_BAR_CHARS = " \u258f\u258e\u258d\u258c\u258b\u258a\u2589\u2588"


def _family(version: str) -> str:
    """The shipped version whose wording `version` has: itself, else the nearest older family."""
    if version in WORDING:
        return version
    return "0.5.23" if tuple(int(p) for p in version.split(".")[:3] if p.isdigit()) >= (0, 5, 23) else "0.5.9"


def wording(version: str) -> dict[str, str]:
    """Templates of the version, or of the nearest older shipped one for an unknown patch level."""
    return WORDING[_family(version)]


class Logger:
    """Writes `[YYYY-MM-DD HH:MM:SS{.mmm}{ TPn}] message` lines as SGLang's basicConfig does (stderr).

    `rank` None is the main process (no tag); SGLang tags scheduler lines `TPn` only when
    tp_size > 1, so callers pass None for a single-GPU server's rank too. Warnings share the
    format (basicConfig's has no level), so `raw` writes them too.
    """

    def __init__(self, version: str, rank: int | None, ms: bool, stream: TextIO = sys.stderr) -> None:
        family = _family(version)
        self.words = WORDING[family]
        self.frames = {**_FRAMES, "unbalanced": _UNBALANCED["0.5.23" if family == "0.5.23" else "0.5.9"]}
        self.tag = f" TP{rank}" if rank is not None else ""
        self.ms = ms
        self.stream = stream

    def prefix(self) -> str:
        now = time.time()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        if self.ms:
            stamp += f".{int(now % 1 * 1000):03d}"
        return f"[{stamp}{self.tag}] "

    def raw(self, message: str) -> None:
        self.stream.write(self.prefix() + message + "\n")
        self.stream.flush()

    def say(self, key: str, **values: object) -> None:
        """Log the version's line for `key`; a line the version does not have is skipped."""
        template = self.words.get(key)
        if template is not None:
            self.raw(template.format(**values))

    def bar(self, key: str, total: int, seconds: float, desc: str = "") -> "Bar":
        """A tqdm bar in the version's format (`shards_bar`, `graph_bar`), drawn at 0 at once."""
        return Bar(self.stream, self.words[key], total, seconds / total if total else 0.0, desc)

    def traceback(self, frames: str, error: str) -> str:
        """A traceback through SGLang's frames of `frames` (a startup phase, "unbalanced" for the
        memory-balance check, "warmup_poll" for the HTTP warmup's wait) ending in `error`."""
        lines = "".join(f'  File "{_SITE}/sglang/srt/{path}", line {line}, in {func}\n    {code}\n'
                        for path, line, func, code in self.frames[frames])
        return f"Traceback (most recent call last):\n{lines}{error}"

    def exception(self, frames: str, error: str) -> None:
        """`Scheduler hit an exception:` with the traceback of `frames`."""
        self.say("exception", traceback=self.traceback(frames, error))


class Bar:
    """A tqdm progress bar as tqdm writes it to a file that is not a terminal (a redirected stderr).

    Every redraw is a carriage return plus the formatted bar, padded with spaces over a longer
    previous one; closing redraws and writes a newline. A format ending in a newline (SGLang's
    BAR_FORMAT up to 0.5.9) so puts each redraw on its own line and adds an empty one at the
    end. Times follow the phase's (time-scaled) duration: item n is done at n x `seconds_per_it`.
    No logging prefix: tqdm writes to the stream itself.
    """

    def __init__(self, stream: TextIO, fmt: str, total: int, seconds_per_it: float, desc: str) -> None:
        self.stream, self.fmt, self.total, self.per_it, self.desc = stream, fmt, total, seconds_per_it, desc
        self.n = 0
        self.last_len = 0
        self.draw()

    def set_description(self, desc: str) -> None:
        self.desc = desc
        self.draw()

    def update(self) -> None:
        self.n += 1
        self.draw()

    def close(self) -> None:
        self.draw()
        self.stream.write("\n")
        self.stream.flush()

    def draw(self) -> None:
        text = self.format()
        self.stream.write("\r" + text + " " * max(self.last_len - len(text), 0))
        self.stream.flush()
        self.last_len = len(text)

    def format(self) -> str:
        """tqdm.format_meter's fields for a bar without unit scaling or a known width."""
        n, total = self.n, self.total
        elapsed = n * self.per_it
        rate = n / elapsed if elapsed else None
        if rate is None:
            rate_fmt = "?it/s"
        elif 1 / rate > 1:
            rate_fmt = f"{1 / rate:5.2f}s/it"
        else:
            rate_fmt = f"{rate:5.2f}it/s"
        frac = n / total if total else 0.0
        full, part = divmod(int(frac * _BAR_CELLS * (len(_BAR_CHARS) - 1)), len(_BAR_CHARS) - 1)
        bar = _BAR_CHARS[-1] * full
        if full < _BAR_CELLS:
            bar += _BAR_CHARS[part] + _BAR_CHARS[0] * (_BAR_CELLS - full - 1)
        percentage = frac * 100
        return self.fmt.format(
            desc=self.desc, percentage=percentage, n_fmt=n, total_fmt=total, elapsed=tqdm_time(elapsed),
            remaining=tqdm_time((total - n) / rate) if rate else "?", rate_fmt=rate_fmt, bar=bar,
            l_bar=(f"{self.desc}: " if self.desc else "") + f"{percentage:3.0f}%|")


def tqdm_time(seconds: float) -> str:
    """tqdm.format_interval: [H:]MM:SS."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"
