"""Trials on several GPU hosts at once: a Ray cluster where each GPU host is a node.

Each GPU host runs ``ray start --address HEAD --resources '{"search_host": 1}'``; the custom
resource admits one trial per host at a time. The driver keeps one agent actor per host, which
claims that resource for the study and is created with no restarts or retries (Ray would
otherwise silently run a trial again whose worker died). The agent runs each trial on its own
node through the local host and keeps what happened (placed on a host, log events, ladder levels)
for the driver to long-poll. A level waits on the node for the driver's verdict, so the study's
pruner stops a running trial's load test and server exactly as it does on one host.

The driver stays the only writer to the storage: results, artifacts (shipped back as bytes)
and verdicts all pass through it. A worker or node that dies mid-trial ends that trial as an
infrastructure fault (the study re-enqueues it); what the dead worker left running on the node
is killed by the trial marker, and the study goes on with the hosts that remain.

Node settings come from the environment ``ray start`` ran in: :data:`NAME_ENV` names the host
in the study (default: its hostname), :data:`PORT_ENV` overrides the space's port (only needed
when several emulated hosts share one machine).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from search.errors import BadInput
from search.hosts.local import LocalHost
from search.lifecycle import Failure
from search.loadtest import LevelResult
from search.study import Hooks, Job, run_job
from search.trial import TrialResult

RESOURCE = "search_host"
NAME_ENV = "SEARCH_HOST_NAME"
PORT_ENV = "SEARCH_HOST_PORT"
POLL_S = 1.0  # how long a node holds a progress poll open when nothing happens
SWEEP_TIMEOUT_S = 30.0  # how long the driver waits for a node to kill a lost trial's processes
GONE_TIMEOUT_S = 10.0  # how long a killed actor gets to die before its node is swept

Message = tuple[str, Any]  # ("placed", (host, node id)) | ("event", Event) | ("level", LevelResult)


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine belongs to)."""
    try:
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BadInput(f"--ray {address}: cannot reach a Ray cluster ({exc}); start one with `ray start --head` "
                       "and give its address") from None


# --------------------------------------------------------------------------- on the node


class _Agent:
    """A GPU host's agent: runs the trials the driver sends it, one at a time, on its own node.

    It lives as long as the study (a fresh worker per trial would pay Python's imports each time);
    messages and verdicts are keyed by trial marker, so a poll left over from the previous trial
    can never take the next one's.
    """

    def __init__(self) -> None:
        self._messages: dict[str, list[Message]] = {}  # by marker, while that trial runs
        self._verdicts: dict[tuple[str, int], bool] = {}  # (marker, level index) -> keep
        self._changed = threading.Condition()

    def run(self, job: Job, emulate: bool) -> tuple[TrialResult, dict[str, bytes]]:
        """Run ``job`` here; return its result and its artifact files (relative path -> bytes)."""
        marker = job.marker
        with self._changed:
            self._messages[marker] = []
        host = LocalHost(emulate=emulate, name=os.environ.get(NAME_ENV) or socket.gethostname())
        if os.environ.get(PORT_ENV):
            launch = job.space.launch.model_copy(update={"port": int(os.environ[PORT_ENV])})
            job = dataclasses.replace(job, space=job.space.model_copy(update={"launch": launch}))
        scratch = Path(tempfile.mkdtemp(prefix=f"{marker}-"))
        self._say(marker, ("placed", (host.name, ray.get_runtime_context().get_node_id())))
        levels = 0

        def on_level(level: LevelResult) -> bool:
            nonlocal levels
            step, levels = (marker, levels), levels + 1
            self._say(marker, ("level", level))
            with self._changed:
                self._changed.wait_for(lambda: step in self._verdicts)
                return self._verdicts.pop(step)

        try:
            result = run_job(job, host, on_event=lambda event: self._say(marker, ("event", event)),
                             on_level=on_level, trial_dir=scratch)
            result.artifacts = job.trial_dir
            files = {str(p.relative_to(scratch)): p.read_bytes() for p in scratch.rglob("*") if p.is_file()}
            files["result.json"] = (json.dumps(result.to_dict(), indent=2) + "\n").encode()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            with self._changed:
                self._messages.pop(marker, None)
                self._changed.notify_all()
        if result.startup is not None:  # the log watcher holds threads; the driver needs only the record
            result.startup = dataclasses.replace(result.startup, watch=None)
        return result, files

    def poll(self, marker: str, timeout: float) -> list[Message]:
        """What trial ``marker`` did since the last poll; waits up to ``timeout`` s for something."""
        with self._changed:
            self._changed.wait_for(lambda: self._messages.get(marker, True), timeout=timeout)
            taken = self._messages.get(marker, [])
            if marker in self._messages:
                self._messages[marker] = []
        return taken

    def decide(self, marker: str, step: int, keep: bool) -> None:
        """The driver's verdict on a level: False prunes (the ladder stops, the server is torn down)."""
        with self._changed:
            self._verdicts[(marker, step)] = keep
            self._changed.notify_all()

    def _say(self, marker: str, message: Message) -> None:
        with self._changed:
            self._messages.setdefault(marker, []).append(message)
            self._changed.notify_all()


# One agent per host (it holds the resource); no CPU reserved (the server's GPUs are the constraint);
# threads so polls and verdicts are served while ``run`` works; never restarted or retried.
_AgentActor = ray.remote(num_cpus=0, resources={RESOURCE: 1}, max_concurrency=4, max_restarts=0,
                         max_task_retries=0)(_Agent)


@ray.remote(num_cpus=0, max_retries=0)
def _sweep(marker: str) -> int:
    """Kill what a lost trial left on this node (its worker died; its server did not)."""
    return LocalHost().kill_marker(marker)


# --------------------------------------------------------------------------- on the driver


@dataclass
class _Remote:
    job: Job
    hooks: Hooks
    actor: Any  # the _AgentActor handle running it
    run: ray.ObjectRef
    poll: ray.ObjectRef | None
    node: str | None = None  # Ray node id, once known
    host: str = ""
    phase: str = "starting"  # the last phase seen, for the failure record if the worker dies
    steps: int = 0


class RayRunner:
    """Runs a study's jobs on the cluster's ``search_host`` nodes, one per node (a ``search.study.Runner``)."""

    def __init__(self, address: str, *, emulate: bool = False) -> None:
        connect(address)
        self.address = address
        self.emulate = emulate
        self._running: dict[ray.ObjectRef, _Remote] = {}  # by the run ref
        self._idle: list[Any] = []  # agents whose host is free
        if self.capacity() == 0:
            ray.shutdown()
            raise BadInput(f"the Ray cluster at {address} has no node with the {RESOURCE!r} resource; on each GPU "
                           f"host run `ray start --address HEAD:6379 --resources '{{\"{RESOURCE}\": 1}}'`")

    def capacity(self) -> int:
        """Trials the live cluster admits at once (nodes that die drop out)."""
        return int(ray.cluster_resources().get(RESOURCE, 0))

    def free(self) -> int:
        return max(0, self.capacity() - len(self._running))

    def start(self, job: Job, hooks: Hooks) -> None:
        actor = self._idle.pop() if self._idle else _AgentActor.remote()  # a new agent claims a free host
        run = actor.run.remote(job, self.emulate)
        self._running[run] = _Remote(job, hooks, actor, run, actor.poll.remote(job.marker, POLL_S))

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        polls = {r.poll: r for r in self._running.values() if r.poll is not None}
        refs = [*self._running, *polls]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # take everything else that is ready too
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if ref in polls:
                self._relay(polls[ref])
        return [self._collect(self._running.pop(ref)) for ref in ready if ref in self._running]

    def cancel(self) -> None:
        for remote in list(self._running.values()):
            self._lose(remote)
        self._running.clear()

    def kill_marker(self, marker: str, host: str) -> int:
        """Ask every live ``search_host`` node to kill ``marker`` (a dead driver's trial may be on any)."""
        nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and RESOURCE in n.get("Resources", {})]
        return sum(self._sweep_on(node, marker) for node in nodes)

    def close(self) -> None:
        self.cancel()
        for actor in self._idle:
            ray.kill(actor)
        self._idle.clear()
        ray.shutdown()

    # -- internals ----------------------------------------------------------------------------
    def _relay(self, remote: _Remote) -> None:
        """Hand a poll's messages to the driver's hooks, answer levels, and poll again."""
        try:
            messages: list[Message] = ray.get(remote.poll)
        except RayError:  # the actor died: its run ref reports it
            remote.poll = None
            return
        self._dispatch(remote, messages)
        remote.poll = remote.actor.poll.remote(remote.job.marker, POLL_S)

    def _dispatch(self, remote: _Remote, messages: list[Message]) -> None:
        for kind, data in messages:
            if kind == "placed":
                remote.host, remote.node = data
                remote.hooks.placed(remote.host)
            elif kind == "event":
                if data.kind == "phase":
                    remote.phase = data.name
                remote.hooks.event(data)
            elif kind == "level":  # GPU telemetry comes back in the result, recorded by the trial itself
                keep = remote.hooks.level(data)
                remote.actor.decide.remote(remote.job.marker, remote.steps, keep)
                remote.steps += 1

    def _collect(self, remote: _Remote) -> tuple[Job, TrialResult]:
        """A finished run: its result and artifacts, or an infrastructure fault if its worker or node died."""
        try:
            result, files = ray.get(remote.run)
        except RayActorError as exc:  # anything else (a bug in the trial) stops the study, as on one host
            self._lose(remote)  # its host's resource comes free when the agent is gone; a new agent claims it
            where = f" on {remote.host}" if remote.host else ""
            message = (f"the Ray worker running this trial{where} died ({type(exc).__name__}: the node was lost "
                       "or the worker killed); not the config's fault")
            return remote.job, TrialResult(outcome="infrastructure", artifacts=remote.job.trial_dir,
                                           marker=remote.job.marker,
                                           failure=Failure("worker_lost", remote.phase, "", True, message))
        self._idle.append(remote.actor)
        for name, data in files.items():
            path = remote.job.trial_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return remote.job, result

    def _lose(self, remote: _Remote) -> None:
        """Stop a trial for good: kill its actor, wait for it to die, then kill its server by marker."""
        ray.kill(remote.actor, no_restart=True)
        try:
            ray.get(remote.run, timeout=GONE_TIMEOUT_S)
        except (RayError, GetTimeoutError):
            pass
        if remote.node is not None:
            self._sweep_on(remote.node, remote.job.marker)
        else:
            self.kill_marker(remote.job.marker, remote.host)

    @staticmethod
    def _sweep_on(node: str, marker: str) -> int:
        try:
            ref = _sweep.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(marker)
            return ray.get(ref, timeout=SWEEP_TIMEOUT_S)
        except (RayError, GetTimeoutError):  # the node is gone: so are its processes
            return 0


def emulated_cluster(root: Path, hosts: int) -> tuple[Any, list[str]]:
    """A Ray cluster on this machine whose ``hosts`` nodes stand for GPU hosts (tests, benchmark, a dry run).

    The head (the controller) has no ``search_host``; each node gets its own emulator state
    directory under ``root`` (its GPUs), its own port and a host name, as separate machines would.
    Ray must allow unauthenticated local use (``RAY_AUTH_MODE=disabled``). The caller shuts the
    returned ``ray.cluster_utils.Cluster`` down; its ``address`` is what ``--ray`` takes.
    """
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    names = [f"gpu-host-{i}" for i in range(hosts)]
    for name in names:
        state = root / name
        state.mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:  # a free port for this host's servers
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cluster.add_node(num_cpus=1, resources={RESOURCE: 1}, env_vars={
            NAME_ENV: name, PORT_ENV: str(port), "SEARCH_EMULATOR_STATE_DIR": str(state)})
    return cluster, names
