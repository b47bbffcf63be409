"""A local Ray cluster whose nodes stand for GPU hosts (`search.parallel.emulated_cluster`), and a
tiny emulator space whose state directory and port come from the node that runs each trial."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from search.parallel import emulated_cluster
from tests import helpers

# Throughput grows with concurrency; a chunked prefill below 4096 runs at 30% (under the target at
# the first level, so the driver prunes it mid-ladder); triton crashes at autotune.
LANDSCAPE = helpers.toy_landscape('0.3 if (flags["chunked_prefill_size"] or 8192) < 4096 else 1.0')


def write_space(root: Path, time_scale: float) -> Path:
    """A space whose emulator state and port come from the node that runs the trial."""
    return helpers.write_space(
        root, time_scale=str(time_scale), landscape=LANDSCAPE, private_state=False, timeout_s=60,
        params={
            "--chunked-prefill-size": {"type": "int", "low": 1024, "high": 8192, "step": 1024},
            "--moe-runner-backend": {"type": "categorical", "choices": ["flashinfer_cutlass", "triton"]},
        },
        baseline={"--chunked-prefill-size": 8192, "--moe-runner-backend": "flashinfer_cutlass"},
    )


@dataclass
class LocalCluster:
    address: str
    hosts: list[str]  # the host names the nodes report


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two GPU hosts; the driver is a `search study run` subprocess that inherits RAY_AUTH_MODE."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        cluster, names = emulated_cluster(tmp_path_factory.mktemp("nodes"), hosts=2)
        try:
            yield LocalCluster(cluster.address, names)
        finally:
            cluster.shutdown()  # only the processes this fixture started


def marker_processes(study: str) -> dict[int, str]:
    """Live processes carrying a trial marker of ``study``: pid -> marker (other people's studies run here too)."""
    return helpers.marker_processes(f"search-{study}-")


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
