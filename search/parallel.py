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
is killed by the trial marker, and the study goes on with the hosts that remain. Ray notices a
dead node some seconds after its trial's worker stops answering, so the lost trial's host stays
booked until the sweep there ends (on a dead node, when Ray gives up scheduling it): the next
trial is not sent to it meanwhile.

Node settings come from the environment ``ray start`` ran in: :data:`NAME_ENV` names the host
in the study (default: its hostname), :data:`PORT_ENV` overrides the space's port (only needed
when several emulated hosts share one machine).

GPU slots: a node that also offers ``search_gpu: N`` (and lists its GPUs in :data:`GPUS_ENV`) runs
trials side by side. Each agent then claims as many ``search_gpu`` as its trial's layout takes
(`search.layout`), so Ray itself places it on a node with that many free; on the node the agent
takes that many GPU indexes from :data:`GPUS_ENV` by a ``flock`` each (`_GpuClaim`: released when
its process ends, kill -9 included) and runs the trial through a `search.slots.SlotHost` (its own
``CUDA_VISIBLE_DEVICES`` and port). An agent keeps its GPUs for its next trial of the same size.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import random
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from search.errors import BadInput, InfrastructureFault
from search.hosts import LocalHost, local_host
from search.hosts.base import Host
from search.lifecycle import Failure
from search.loadtest import LevelResult
from search.runner import Hooks, Job, run_job
from search.slots import SlotHost, job_gpus, too_big
from search.storage import Outcome
from search.trial import TrialResult

RESOURCE = "search_host"
GPU_RESOURCE = "search_gpu"  # GPU slots: a node's GPUs, shared out by layout
NAME_ENV = "SEARCH_HOST_NAME"
PORT_ENV = "SEARCH_HOST_PORT"
GPUS_ENV = "SEARCH_HOST_GPUS"  # the GPUs a slot node offers, "0,1,2,3"
CLAIM_TIMEOUT_S = 30.0  # how long an agent waits for GPU locks a just-killed agent has not let go of yet
POLL_S = 1.0  # how long a node holds a progress poll open when nothing happens
SWEEP_TIMEOUT_S = 30.0  # how long the driver waits for a node to kill a lost trial's processes
GONE_TIMEOUT_S = 10.0  # how long a killed actor gets to die before its node is swept
VERDICT_TIMEOUT_S = 300.0  # how long a level waits for the driver's verdict before the trial gives up

Message = tuple[str, Any]  # ("placed", (host, node id)) | ("event", Event) | ("level", LevelResult)


def connect(address: str) -> None:
    """Join the Ray cluster at ``address`` (``auto``: the one this machine belongs to)."""
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BadInput(f"--ray {address}: cannot reach a Ray cluster ({exc}); start one with `ray start --head` "
                       "and give its address") from None


# --------------------------------------------------------------------------- on the node


def _offered_gpus() -> list[int] | None:
    """The GPUs this node offers trials side by side (:data:`GPUS_ENV`); None: whole host per trial."""
    text = os.environ.get(GPUS_ENV, "").strip()
    return [int(part) for part in text.split(",")] if text else None


class _GpuClaim:
    """GPU indexes of this node an agent holds while it lives: one ``flock`` per GPU, so agents of one
    node (Ray has checked there are enough ``search_gpu``) take disjoint GPUs, and a dead agent's go back."""

    def __init__(self, host: str, offered: list[int], need: int) -> None:
        root = Path(tempfile.gettempdir()) / f"search-slots-{os.getuid()}" / host
        root.mkdir(parents=True, exist_ok=True)
        self.gpus: list[int] = []
        self._fds: list[int] = []
        deadline = time.monotonic() + CLAIM_TIMEOUT_S
        while len(self.gpus) < need:
            for gpu in offered:
                if gpu in self.gpus or len(self.gpus) == need:
                    continue
                fd = os.open(root / f"gpu{gpu}.lock", os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                self.gpus.append(gpu)
                self._fds.append(fd)
            if len(self.gpus) < need:
                if time.monotonic() > deadline:
                    self.release()
                    raise InfrastructureFault(f"host {host}: {need} of its GPUs {offered} are not free after "
                                              f"{CLAIM_TIMEOUT_S:g} s; another study's agents hold them")
                time.sleep(0.2)

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self.gpus = []


class _NoVerdict(Exception):
    """A level waited longer than its bound for the driver's verdict (the driver lost track of the trial)."""


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
        self._claim: _GpuClaim | None = None  # on a slot node: the GPUs this agent holds

    def _placed(self, host: Host, job: Job) -> Host:
        """``host`` as this job runs on it: on a slot node, a `SlotHost` on GPUs this agent holds."""
        offered = _offered_gpus()
        if offered is None:
            return host
        need = job_gpus(job.space, job.config)
        if self._claim is None or len(self._claim.gpus) != need:
            if self._claim is not None:
                self._claim.release()
            self._claim = _GpuClaim(host.name, offered, need)
        gpus = self._claim.gpus
        return SlotHost(host, gpus, offered.index(gpus[0]))

    def run(self, job: Job, emulate: bool, verdict_timeout_s: float = VERDICT_TIMEOUT_S
            ) -> tuple[TrialResult, dict[str, bytes], list[Message]]:
        """Run ``job`` here: its result, its artifact files (relative path -> bytes), and the messages
        no poll took before it ended (so the driver still learns where it ran and how it ended).

        A level that waits ``verdict_timeout_s`` for the driver's verdict ends the trial as an
        infrastructure fault: a driver that lost track of it must not hold the host forever.
        """
        marker = job.marker
        with self._changed:
            self._messages[marker] = []
        host = local_host(emulate=emulate, name=os.environ.get(NAME_ENV) or socket.gethostname())
        if os.environ.get(PORT_ENV):
            launch = job.space.launch.model_copy(update={"port": int(os.environ[PORT_ENV])})
            job = dataclasses.replace(job, space=job.space.model_copy(update={"launch": launch}))
        scratch = Path(tempfile.mkdtemp(prefix=f"{marker}-"))
        self._say(marker, ("placed", (host.name, ray.get_runtime_context().get_node_id())))
        levels: list[LevelResult] = []

        def on_level(level: LevelResult) -> bool:
            step = (marker, len(levels))
            levels.append(level)
            self._say(marker, ("level", level))
            with self._changed:
                if not self._changed.wait_for(lambda: step in self._verdicts, timeout=verdict_timeout_s):
                    raise _NoVerdict(f"no verdict from the driver on level {step[1]} within {verdict_timeout_s:.0f} s "
                                     "(it lost track of this trial); not the config's fault")
                return self._verdicts.pop(step)

        try:
            try:
                result = run_job(job, self._placed(host, job),
                                 on_event=lambda event: self._say(marker, ("event", event)),
                                 on_level=on_level, trial_dir=scratch)
            except InfrastructureFault as exc:  # its GPUs never came free: the host's fault, retried
                result = TrialResult(outcome=Outcome.INFRASTRUCTURE, artifacts=scratch, marker=marker,
                                     failure=Failure("infrastructure", "starting", str(exc), True, str(exc)))
            except _NoVerdict as exc:  # run_trial tore the server down on the way out
                result = TrialResult(outcome=Outcome.INFRASTRUCTURE, artifacts=scratch, marker=marker, levels=levels,
                                     failure=Failure("no_verdict", "ready", "", True, str(exc)))
            result.artifacts = job.trial_dir
            files = {str(p.relative_to(scratch)): p.read_bytes() for p in scratch.rglob("*") if p.is_file()}
            files["result.json"] = (json.dumps(result.to_dict(), indent=2) + "\n").encode()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            with self._changed:
                unpolled = self._messages.pop(marker, [])
                self._verdicts = {k: v for k, v in self._verdicts.items() if k[0] != marker}
                self._changed.notify_all()
        if result.startup is not None:  # the log watcher holds threads; the driver needs only the record
            result.startup = dataclasses.replace(result.startup, watch=None)
        return result, files, unpolled

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
_AgentActor = ray.remote(_Agent)


def _new_agent(resources: dict[str, float]) -> Any:
    """A new agent claiming ``resources`` (a whole host's ``search_host``, or a slot's ``search_gpu``)."""
    return _AgentActor.options(num_cpus=0, resources=resources, max_concurrency=4, max_restarts=0,
                               max_task_retries=0).remote()


@ray.remote(num_cpus=0, max_retries=0)
def _sweep_task(marker: str) -> int:
    """Kill what a lost trial left on this node (its worker died; its server did not)."""
    return LocalHost().kill_marker(marker)


# --------------------------------------------------------------------------- on the driver


@dataclass
class _Remote:
    job: Job
    hooks: Hooks
    actor: Any  # the _AgentActor handle running it
    run: ray.ObjectRef[Any]
    poll: ray.ObjectRef[Any] | None
    node: str | None = None  # Ray node id, once known
    host: str = ""
    phase: str = "starting"  # the last phase seen, for the failure record if the worker dies
    steps: int = 0
    need: int = 1  # the search_gpu its agent holds (slot mode)


@dataclass
class _Idle:
    actor: Any  # an _AgentActor whose host is free; it still holds the host's resource
    node: str | None
    need: int = 1  # the search_gpu it holds (slot mode)


class RayRunner:
    """Runs a study's jobs on the cluster's ``search_host`` nodes, one per node (a ``search.study.Runner``)."""

    def __init__(self, address: str, *, emulate: bool = False) -> None:
        connect(address)
        self.address = address
        self.emulate = emulate
        self._running: dict[ray.ObjectRef[Any], _Remote] = {}  # by the run ref
        self._idle: list[_Idle] = []  # agents whose host is free
        self._sweeps: dict[ray.ObjectRef[Any], float] = {}  # a lost trial's sweep -> when to stop waiting for it
        self._need = 1  # GPUs the last job took: what free() counts in (slot mode)
        self._done: list[tuple[Job, TrialResult]] = []  # jobs no node could hold, ended without running
        # Slot mode when the cluster offers search_gpu: agents claim GPUs by layout, several per node.
        self.slots = GPU_RESOURCE in ray.cluster_resources()
        if self.capacity() == 0:
            ray.shutdown()
            raise BadInput(f"the Ray cluster at {address} has no node with the {RESOURCE!r} resource; on each GPU "
                           f"host run `ray start --address HEAD:6379 --resources '{{\"{RESOURCE}\": 1}}'`")

    def capacity(self) -> int:
        """Trials the cluster admits at once: its live nodes' ``search_host`` (Ray drops a dead node
        some seconds after it stops answering); in slot mode, as many of the last job's size as its
        ``search_gpu`` hold."""
        if self.slots:
            return sum(int(n.get("Resources", {}).get(GPU_RESOURCE, 0)) // self._need for n in self._slot_nodes())
        return int(ray.cluster_resources().get(RESOURCE, 0))

    def free(self) -> int:
        """Hosts (slots) with nothing running, not counting a lost trial's until its sweep has ended."""
        return max(0, self.capacity() - len(self._running) - len(self._sweeps))

    def settling(self) -> bool:
        """A lost trial's sweep still holds its host: when a node dies, the last running trial can end
        before the sweep does, and stopping then would lose a host that is about to come free."""
        return bool(self._sweeps)

    def start(self, job: Job, hooks: Hooks) -> None:
        need = 1
        if self.slots:
            need = self._need = job_gpus(job.space, job.config)
            largest = max((int(n["Resources"].get(GPU_RESOURCE, 0)) for n in self._slot_nodes()), default=0)
            if need > largest:
                self._done.append((job, too_big(job.marker, job.trial_dir, need, largest)))
                return
        # A new agent claims a free host. Ray types an actor's methods as the plain functions; calls go through `.remote`.
        actor: Any = self._free_agent(need) or _new_agent({GPU_RESOURCE: need} if self.slots else {RESOURCE: 1})
        run = actor.run.remote(job, self.emulate)
        self._running[run] = _Remote(job, hooks, actor, run, actor.poll.remote(job.marker, POLL_S), need=need)

    def wait(self, timeout: float) -> list[tuple[Job, TrialResult]]:
        if self._done:
            done, self._done = self._done, []
            return done
        self._release_idle()
        polls = {r.poll: r for r in self._running.values() if r.poll is not None}
        refs = [*self._running, *polls, *self._sweeps]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # take everything else that is ready too
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if ref in polls:
                self._relay(polls[ref], ref, again=polls[ref].run not in ready)
        self._end_sweeps([ref for ref in ready if ref in self._sweeps])
        return [self._collect(self._running.pop(ref)) for ref in ready if ref in self._running]

    def cancel(self) -> None:
        lost = list(self._running.values())
        self._running.clear()
        for remote in lost:
            ray.kill(remote.actor, no_restart=True)
        for remote in lost:  # a killed actor gets a moment to die before its server is killed under it
            try:
                ray.get(remote.run, timeout=GONE_TIMEOUT_S)
            except (RayError, GetTimeoutError):
                pass
        for remote in lost:
            self._sweep(remote)
        self._finish_sweeps()

    def kill_marker(self, marker: str, host: str) -> int:
        """Ask every live ``search_host`` node to kill ``marker`` (a dead driver's trial may be on any)."""
        refs = [self._sweep_ref(node, marker) for node in self._live_nodes()]
        return sum(count for count in self._gather(refs) if count)

    def close(self) -> None:
        self.cancel()
        for idle in self._idle:
            ray.kill(idle.actor)
        self._idle.clear()
        ray.shutdown()

    # -- internals ----------------------------------------------------------------------------
    def _relay(self, remote: _Remote, poll: ray.ObjectRef[list[Message]], *, again: bool) -> None:
        """Hand a poll's messages to the driver's hooks and answer levels; poll ``again`` unless the
        trial ended. A failed poll of a live agent (an RPC that did not get through) is simply
        repeated: giving up on it would leave the trial's next level waiting for a verdict."""
        messages: list[Message] = []
        try:
            messages = ray.get(poll)
        except ActorDiedError:  # the run ref reports it
            again = False
        except RayError:
            pass
        self._dispatch(remote, messages)
        remote.poll = remote.actor.poll.remote(remote.job.marker, POLL_S) if again else None

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
            result, files, unpolled = ray.get(remote.run)
        except RayActorError as exc:  # anything else (a bug in the trial) stops the study, as on one host
            ray.kill(remote.actor, no_restart=True)  # unreachable is not dead: make sure it starts nothing more
            self._sweep(remote)  # its host comes free once the sweep ends; a new agent claims it
            where = f" on {remote.host}" if remote.host else ""
            message = (f"the Ray worker running this trial{where} died or stopped answering ({type(exc).__name__}: "
                       "the node was lost or the worker killed); not the config's fault")
            return remote.job, TrialResult(outcome=Outcome.INFRASTRUCTURE, artifacts=remote.job.trial_dir,
                                           marker=remote.job.marker,
                                           failure=Failure("worker_lost", remote.phase, "", True, message))
        self._dispatch(remote, [m for m in unpolled if m[0] != "level"])  # an unpolled level was never answered
        self._idle.append(_Idle(remote.actor, remote.node, remote.need))
        for name, data in files.items():
            path = remote.job.trial_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return remote.job, result

    def _free_agent(self, need: int = 1) -> Any | None:
        """An idle agent of this size whose node is still alive; those on a dead node are let go, and so are
        idle agents of other sizes when none fits (their GPUs go back to Ray for this one)."""
        live = set(self._live_nodes())
        for idle in [i for i in self._idle if i.node not in live]:
            ray.kill(idle.actor, no_restart=True)
        self._idle = [i for i in self._idle if i.node in live]
        for idle in reversed(self._idle):
            if idle.need == need:
                self._idle.remove(idle)
                return idle.actor
        for idle in self._idle:
            ray.kill(idle.actor, no_restart=True)
        self._idle.clear()
        return None

    def _release_idle(self) -> None:
        """Let idle agents go while a started trial waits for its host: the host it was counted on may
        be held by another study's agent, or gone (Ray counts a dead node for some seconds), and an
        idle agent holds a host it could have. An agent released needlessly costs one new worker."""
        if self._idle and any(remote.node is None for remote in self._running.values()):
            for idle in self._idle:
                ray.kill(idle.actor, no_restart=True)
            self._idle.clear()

    def _sweep(self, remote: _Remote) -> None:
        """Start killing a lost trial's server by its marker, on its node (or every node if unknown)."""
        nodes = [remote.node] if remote.node is not None else self._live_nodes()
        deadline = time.monotonic() + SWEEP_TIMEOUT_S
        for node in nodes:
            self._sweeps[self._sweep_ref(node, remote.job.marker)] = deadline

    def _end_sweeps(self, done: list[ray.ObjectRef[Any]]) -> None:
        """Forget sweeps that ended (on a dead node they fail: its processes are gone) or ran out of time."""
        self._gather(done)  # ready: this takes no time, and no failure is left unread
        now = time.monotonic()
        for ref in [*done, *(ref for ref, deadline in self._sweeps.items() if deadline <= now)]:
            self._sweeps.pop(ref, None)

    def _finish_sweeps(self) -> None:
        """Wait (bounded) for every sweep still running: the driver must not exit before them."""
        if self._sweeps:
            done, _ = ray.wait(list(self._sweeps), num_returns=len(self._sweeps),
                               timeout=max(0.0, max(self._sweeps.values()) - time.monotonic()))
            self._gather(done)
            self._sweeps.clear()

    @staticmethod
    def _sweep_ref(node: str, marker: str) -> ray.ObjectRef[Any]:
        return _sweep_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(marker)

    @staticmethod
    def _gather(refs: list[ray.ObjectRef[Any]]) -> list[int | None]:
        """Each sweep's count of killed processes; None where its node was gone or it did not answer in time."""
        counts: list[int | None] = []
        for ref in refs:
            try:
                counts.append(ray.get(ref, timeout=SWEEP_TIMEOUT_S))
            except (RayError, GetTimeoutError):
                counts.append(None)
        return counts

    @staticmethod
    def _live_nodes() -> list[str]:
        return [n["NodeID"] for n in ray.nodes() if n.get("Alive")
                and (RESOURCE in n.get("Resources", {}) or GPU_RESOURCE in n.get("Resources", {}))]

    @staticmethod
    def _slot_nodes() -> list[dict[str, Any]]:
        """Live nodes that share their GPUs out (``search_gpu``)."""
        return [n for n in ray.nodes() if n.get("Alive") and GPU_RESOURCE in n.get("Resources", {})]


# Below Linux's ephemeral range (32768-60999), where bind(0) and outgoing connections take ports
# from, and above Ray's worker ports (10002-19999): a host's port stays its own for the whole run.
_SERVER_PORTS = range(20000, 32000)


def _server_port() -> int:
    """A free port for an emulated host's servers, from :data:`_SERVER_PORTS`."""
    for port in random.sample(_SERVER_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_SERVER_PORTS} for an emulated host")


def emulated_cluster(root: Path, hosts: int, gpus: int | None = None) -> tuple[Any, list[str]]:
    """A Ray cluster on this machine whose ``hosts`` nodes stand for GPU hosts (tests, benchmark, a dry run).

    The head (the controller) has no ``search_host``; each node gets its own emulator state
    directory under ``root`` (its GPUs), its own port and a host name, as separate machines would.
    With ``gpus``, each node has that many emulated GPUs and shares them out (``search_gpu``).
    Ray must allow unauthenticated local use (``RAY_AUTH_MODE=disabled``). The caller shuts the
    returned ``ray.cluster_utils.Cluster`` down; its ``address`` is what ``--ray`` takes.
    """
    from ray.cluster_utils import Cluster

    # Its nodes are processes on one machine: a node that dies refuses the health check at once, so
    # it is marked dead after 5 refusals 0.5 s apart, not Ray's 3 s apart, tuned for networks (a
    # stalled node still gets Ray's 10 s a check). The idle-death test: 29 s down to 17 s.
    health = {"health_check_period_ms": 500}
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": health})
    names = [f"gpu-host-{i}" for i in range(hosts)]
    for name in names:
        state = root / name
        state.mkdir(parents=True, exist_ok=True)
        port = _server_port()
        env = {NAME_ENV: name, PORT_ENV: str(port), "SEARCH_EMULATOR_STATE_DIR": str(state)}
        resources = {RESOURCE: 1}
        if gpus is not None:
            env.update({GPUS_ENV: ",".join(map(str, range(gpus))), "SEARCH_EMULATOR_GPUS": str(gpus)})
            resources[GPU_RESOURCE] = gpus
        cluster.add_node(num_cpus=1, resources=resources, env_vars=env)
    return cluster, names
