"""Per-GPU state files: `gpu<i>.lock` (flock held by the owning rank) and `gpu<i>.json`.

The lock is the truth about ownership (the kernel drops it when the holder dies, even by
SIGKILL); the JSON carries what `nvidia-smi` shows and is trusted only while the lock is held.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The seed machine's GPU: RTX PRO 6000 Blackwell (SM120), 97,887 MiB, 600 W limit.
TOTAL_MIB = 97887
POWER_LIMIT_W = 600.0
IDLE_POWER_W = 75.0
IDLE_USED_MIB = 2


@dataclass
class GpuState:
    index: int
    pid: int
    memory_used_mib: int
    memory_total_mib: int = TOTAL_MIB
    power_draw_w: float = IDLE_POWER_W
    power_limit_w: float = POWER_LIMIT_W
    utilization_pct: int = 0


def lock_path(state_dir: Path, gpu: int) -> Path:
    return state_dir / f"gpu{gpu}.lock"


def json_path(state_dir: Path, gpu: int) -> Path:
    return state_dir / f"gpu{gpu}.json"


_CLAIM_RETRY_S = 0.2  # a probe holds its shared lock for microseconds; a holder for the process's life


def _open_lock(state_dir: Path, gpu: int) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    return os.open(lock_path(state_dir, gpu), os.O_RDWR | os.O_CREAT, 0o644)


def try_lock(state_dir: Path, gpu: int) -> int | None:
    """Open and flock the GPU's lock file exclusively; the fd (kept for the process's life) or None if held.

    A refusal is retried for a moment: it may be a probe (:func:`is_held`, from ``nvidia-smi`` or a
    starting server) rather than an owner, and a rank that lost its claim to a probe would run
    unseen by every later check.
    """
    fd = _open_lock(state_dir, gpu)
    deadline = time.monotonic() + _CLAIM_RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.005)


def is_held(state_dir: Path, gpu: int) -> bool:
    """Whether a process owns the GPU. The probe takes a shared lock, so probes never look like
    owners to each other (an exclusive probe made two nvidia-smi calls at once see a phantom owner)."""
    fd = _open_lock(state_dir, gpu)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our probe lock
    return False


def write(state_dir: Path, state: GpuState) -> None:
    """Atomically replace the GPU's JSON (readers never see half a file)."""
    path = json_path(state_dir, state.index)
    tmp = path.with_suffix(f".json.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(state)))
    os.replace(tmp, path)


def occupant(state_dir: Path, gpu: int) -> GpuState | None:
    """Another process's hold on the GPU as a starting server finds it (None: the GPU is free).

    A holder that has not published its state yet is taken to fill the GPU as a loaded server
    does (95% of its memory), so a server started next to it sees an occupied GPU.
    """
    if not is_held(state_dir, gpu):
        return None
    state = read(state_dir, gpu)
    if state.pid == 0:
        state.memory_used_mib = int(TOTAL_MIB * 0.95)
    return state


def read(state_dir: Path, gpu: int) -> GpuState:
    """What the GPU shows now: the holder's JSON while its lock is held, else an idle GPU."""
    if is_held(state_dir, gpu):
        try:
            return GpuState(**json.loads(json_path(state_dir, gpu).read_text()))
        except (OSError, ValueError, TypeError):
            pass  # holder is between lock and first write
    return GpuState(index=gpu, pid=0, memory_used_mib=IDLE_USED_MIB)
