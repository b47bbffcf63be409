"""A local Ray cluster whose nodes stand for GPU hosts (`search.parallel.emulated_cluster`), and a
tiny emulator space whose state directory and port come from the node that runs each trial."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray

from search.parallel import NAME_ENV, RayRunner, emulated_cluster
from search.runner import Job
from search.space import Space, load_space
from search.trial import TrialResult
from tests import helpers
from tests.helpers import parent

# Throughput grows with concurrency; a chunked prefill below 4096 runs at 30% (under the target at
# the first level, so the driver prunes it mid-ladder); triton crashes at autotune.
SLOW_BELOW = 4096
LANDSCAPE = helpers.toy_landscape(f'0.3 if (flags["chunked_prefill_size"] or 8192) < {SLOW_BELOW} else 1.0')


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


def study_command(tmp_path: Path, study: str, ray_args: list[str], n_trials: int, *,
                  remeasure: int = 1, seed: int = 0) -> list[str]:
    """`search study run` on the toy space (written under ``tmp_path``), its study in
    ``tmp_path/studies.db`` and artifacts in ``tmp_path/trials``."""
    return ["search", "study", "run", str(write_space(tmp_path, time_scale=0.01)), "--study", study, *ray_args,
            "--emulate", "--n-trials", str(n_trials), "--remeasure", str(remeasure), "--seed", str(seed),
            "--storage", f"sqlite:///{tmp_path / 'studies.db'}", "--trials-dir", str(tmp_path / "trials")]


@contextmanager
def driver(tmp_path: Path, study: str, ray_args: list[str], n_trials: int,
           env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`study_command` run as a separate process (the driver) logging to ``tmp_path/driver.log``;
    killed on the way out if still running."""
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        proc = subprocess.Popen(study_command(tmp_path, study, ray_args, n_trials), stdout=out,
                                stderr=subprocess.STDOUT, cwd=tmp_path,
                                env={**os.environ, "RAY_AUTH_MODE": "disabled", **(env or {})})
        try:
            yield proc, log
        finally:
            if proc.poll() is None:
                proc.kill()


@dataclass
class LocalCluster:
    address: str
    hosts: list[str]  # the host names the nodes report
    cluster: Any  # the ray.cluster_utils.Cluster, to take a node away

    def power_off(self, host: str, study: str) -> str:
        """Take ``host`` away as a power cut would: its Ray node, then what ran on it (its Ray workers and
        ``study``'s trial servers there, which a real machine would lose with it). Returns its node id."""
        node = next(n for n in self.cluster.worker_nodes if n._ray_params.env_vars.get(NAME_ENV) == host)
        self.cluster.remove_node(node, allow_graceful=False)
        machine = set()
        for server in marker_processes(study):
            machine.add(server)
            try:
                machine.add(parent(server))  # its Ray worker
            except OSError:
                pass
        for pid in machine:
            if host_of(pid) == host:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return node.node_id


def _cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Two GPU hosts; the driver is a `search study run` subprocess that inherits RAY_AUTH_MODE."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        cluster, names = emulated_cluster(tmp_path_factory.mktemp("nodes"), hosts=2)
        try:
            yield LocalCluster(cluster.address, names, cluster)
        finally:
            if ray.is_initialized():  # a test's in-process driver; the cluster cannot go while it is connected
                ray.shutdown()
            cluster.shutdown()  # only the processes this fixture started


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster the module's tests share."""
    yield from _cluster(tmp_path_factory)


@pytest.fixture
def fresh_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of the test's own, for a test that takes a host away."""
    yield from _cluster(tmp_path_factory)


@pytest.fixture
def space(tmp_path: Path) -> Space:
    """The conftest space, parsed, for jobs driven from the test process."""
    return load_space(write_space(tmp_path, time_scale=0.01))


def job(space: Space, root: Path, study: str, name: str) -> Job:
    """The baseline as a job of ``study`` (marker ``search-<study>-<name>``), artifacts under ``root``."""
    return Job(space, dict(space.baseline or {}), f"search-{study}-{name}", root / name)


def drain(runner: RayRunner, count: int) -> list[tuple[Job, TrialResult]]:
    """Drive ``runner`` as the study does until ``count`` jobs have finished, in the order they finished."""
    done: list[tuple[Job, TrialResult]] = []
    while len(done) < count:
        done += runner.wait(0.5)
    return done


def marker_processes(study: str) -> dict[int, str]:
    """Live processes carrying a trial marker of ``study``: pid -> marker (other people's studies run here too)."""
    return helpers.marker_processes(f"search-{study}-")


def host_of(pid: int) -> str | None:
    """The emulated host a process runs on (the node's name in its environment); None once it is gone."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(f"{NAME_ENV}=".encode())]
    return found[0] if found else None
