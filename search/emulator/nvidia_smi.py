"""`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits] [-i IDS]` over the emulator's GPUs.

Answers from the state directory (gpu_state), so GPU checks and power telemetry of the tuner run
against the emulator exactly as against a real host. Install as a command via the
`search-nvidia-smi = "search.emulator.nvidia_smi:main"` script entry.
"""

from __future__ import annotations

import argparse
import sys

from search.emulator import gpu_state
from search.emulator.config import Settings

_NAME = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
# query field -> (header, unit, value from a GpuState)
_FIELDS = {
    "index": ("index", "", lambda s: str(s.index)),
    "name": ("name", "", lambda s: _NAME),
    "memory.used": ("memory.used [MiB]", " MiB", lambda s: str(s.memory_used_mib)),
    "memory.total": ("memory.total [MiB]", " MiB", lambda s: str(s.memory_total_mib)),
    "memory.free": ("memory.free [MiB]", " MiB", lambda s: str(s.memory_total_mib - s.memory_used_mib)),
    "power.draw": ("power.draw [W]", " W", lambda s: f"{s.power_draw_w:.2f}"),
    "power.limit": ("power.limit [W]", " W", lambda s: f"{s.power_limit_w:.2f}"),
    "utilization.gpu": ("utilization.gpu [%]", " %", lambda s: str(s.utilization_pct)),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi")
    parser.add_argument("--query-gpu", required=True)
    parser.add_argument("--format", default="csv")
    parser.add_argument("-i", "--id", dest="ids")
    args = parser.parse_args(argv)
    fields = [f.strip() for f in args.query_gpu.split(",") if f.strip()]
    unknown = [f for f in fields if f not in _FIELDS]
    if unknown:
        print(f'Field "{unknown[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    fmt = {p.strip() for p in args.format.split(",")}
    settings = Settings.from_env()
    ids = [int(i) for i in args.ids.split(",")] if args.ids else list(range(settings.gpus))
    if any(i >= settings.gpus for i in ids):
        print(f"No devices were found matching the ids: {args.ids}", file=sys.stderr)
        return 6
    if "noheader" not in fmt:
        print(", ".join(_FIELDS[f][0] if "nounits" not in fmt else _FIELDS[f][0].split(" [")[0] for f in fields))
    for i in ids:
        state = gpu_state.read(settings.state_dir, i)
        print(", ".join(_FIELDS[f][2](state) + ("" if "nounits" in fmt else _FIELDS[f][1]) for f in fields))
    return 0


if __name__ == "__main__":
    sys.exit(main())
