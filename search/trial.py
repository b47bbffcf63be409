"""One config end to end: start it, gate its answers, climb the ladder, always tear down.

The study calls :func:`run_trial` for every trial and ``search trial run`` for one; both get a
:class:`TrialResult` and a ``trials/<study>/<n>/`` directory. The outcome tells the study what
to do with it: ``completed`` (an objective, maybe None when no level met the SLOs), ``crashed``
(the config's fault), ``pruned`` (the ladder callback stopped it) or ``infrastructure`` (the
host's fault: retry the same parameters elsewhere or later).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search import correctness, gpu
from search.artifacts import TrialArtifacts
from search.background import Background
from search.errors import InfrastructureFault, RunFailed
from search.hosts.base import GpuSample, Host, ServerHandle
from search.layout import gpus_needed
from search.lifecycle import Failure, OnEvent, Startup, Watch, phases_dict, start_server
from search.loadtest import NO_PROGRESS, LadderSpec, LevelResult, run_ladder
from search.loadtest.metrics import meets_slos
from search.loadtest.workload import SharedPrefix
from search.profile import LaunchProfile, render
from search.settings import DEFAULT, Settings
from search.space import MAX_RATE, Space
from search.storage import Outcome

CLEAN_TIMEOUT_S = 60.0  # how long a trial waits for a previous server's port and GPUs
STOP_GRACE_S = 10.0
TELEMETRY_INTERVAL_S = 1.0  # nvidia-smi sampling during the load test
HEALTH_POLL_S = 0.5  # how often the server's log and process are checked during the load test
SLO_KEYS = ("p99_ttft_ms", "p99_itl_ms")  # Space.slos field -> the LevelResult key it bounds

OnLevel = Callable[[LevelResult], bool]


@dataclass
class TrialResult:
    outcome: Outcome
    artifacts: Path
    marker: str
    startup: Startup | None = None
    failure: Failure | None = None  # why it crashed or hit the infrastructure (also mid-ladder)
    levels: list[LevelResult] = field(default_factory=list)
    answers: list[str] | None = None
    answers_differ: bool | None = None  # None: no baseline to compare with
    objective: float | None = None  # the space's objective metric, best over the levels meeting the SLOs
    # The level that gave it: its concurrency, or an open-loop level's request rate.
    peak_concurrency: float | None = None
    slo_ok: bool = False  # some level met the SLOs
    gpu_seconds: float = 0.0  # wall time the trial held the GPUs (startup + load test + teardown)
    teardown: str | None = None  # the host was left dirty: the next trial's ensure_clean will wait
    gpu: list[dict[str, Any]] = field(default_factory=list)  # per level: concurrency + GpuWindow.record()

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "failure": self.failure.to_dict() if self.failure else None,
            "phases": phases_dict(self.startup.phases) if self.startup else {},
            "levels": [level.to_dict() for level in self.levels],
            "answers_differ": self.answers_differ,
            "objective": self.objective,
            "peak_output_throughput": self.objective,
            "peak_concurrency": self.peak_concurrency,
            "slo_ok": self.slo_ok,
            "gpu_seconds": self.gpu_seconds,
            "teardown": self.teardown,
            "gpu": self.gpu,
            "artifacts": str(self.artifacts),
            "marker": self.marker,
        }


def ladder_spec(space: Space, settings: Settings = DEFAULT) -> LadderSpec:
    """The space's load test as the ladder runs it (with the rate search for ``max_rate_under_slo``)."""
    lt, wl = space.load_test, space.workload
    prefix = (SharedPrefix(wl.groups, wl.prompts_per_group, wl.system_prompt_len, wl.question_len)
              if wl.groups and wl.prompts_per_group and wl.system_prompt_len and wl.question_len else None)
    dataset = space.dataset_path()
    return LadderSpec(concurrency=tuple(lt.concurrency), input_len=prefix.input_len if prefix else lt.input_len,
                      output_len=lt.output_len, duration_s=lt.duration_s, requests=lt.requests,
                      warmup_s=lt.warmup_s, api=lt.api, workers=lt.workers, range_ratio=wl.range_ratio,
                      dataset=str(dataset) if dataset else None, shared_prefix=prefix,
                      goodput={str(k): v for k, v in (space.objective.goodput_slos_ms or {}).items()} or None,
                      request_rates=tuple(lt.request_rates), burstiness=lt.burstiness,
                      rate_slos={k: v for k, v in slos_of(space).items() if v is not None} or None
                      if space.objective.metric == MAX_RATE else None,
                      rate_search_steps=settings.rate_search_steps if space.objective.metric == MAX_RATE else 0)


def slos_of(space: Space) -> dict[str, float | None]:
    """The space's SLOs as ``{LevelResult key: limit or None}``."""
    return {key: getattr(space.slos, key, None) for key in SLO_KEYS}


def level_score(space: Space, level: LevelResult, gpus: int = 1) -> float:
    """What a level is worth to the space's objective, as each is reported (and pruned on).

    The objective's own figure (output tok/s, goodput req/s...), divided by ``gpus`` (the trial's
    layout's, for a per-GPU objective; else 1); for ``max_rate_under_slo`` the level's rate when
    it met the SLOs, else 0.
    """
    if space.objective.metric == MAX_RATE:
        return (level.request_rate or 0.0) if meets_slos(level, slos_of(space)) else 0.0
    return float(getattr(level, space.objective.level_key) or 0.0) / gpus


def run_trial(space: Space, config: Mapping[str, Any], host: Host, *, trial_dir: Path, marker: str,
              on_event: OnEvent | None = None, on_level: OnLevel | None = None,
              baseline_answers: list[str] | None = None) -> TrialResult:
    """Run ``config`` of ``space`` on ``host``; artifacts go to ``trial_dir``.

    The server is torn down whatever happens, KeyboardInterrupt included (then re-raised).
    """
    profile = host.adapt(render(space, dict(config)))
    artifacts = TrialArtifacts(trial_dir, profile.secret_env)
    artifacts.write_profile(profile)
    result = TrialResult(outcome=Outcome.INFRASTRUCTURE, artifacts=trial_dir, marker=marker)
    handle: ServerHandle | None = None
    began = time.monotonic()
    try:
        try:
            host.ensure_clean(profile, timeout=CLEAN_TIMEOUT_S)
            timeouts = {str(phase): seconds for phase, seconds in space.timeouts.items()}
            handle, startup = start_server(host, profile, marker=marker, log_path=artifacts.server_log,
                                           timeouts=timeouts, on_event=on_event)
            result.startup = startup
        except InfrastructureFault as exc:
            result.failure = Failure("infrastructure", "starting", str(exc), True, str(exc))
            return result
        artifacts.write_json("phases.json", phases_dict(startup.phases))
        if startup.failure is not None:
            result.failure = startup.failure
            result.outcome = Outcome.INFRASTRUCTURE if startup.failure.infrastructure else Outcome.CRASHED
            return result
        assert startup.watch is not None, "a started server is being watched"
        _measure(space, host, profile, startup.watch, result, artifacts, on_level, baseline_answers)
        return result
    finally:
        if handle is not None:
            try:
                handle.stop(grace=STOP_GRACE_S)
            except InfrastructureFault as exc:
                result.teardown = str(exc)
        result.gpu_seconds = time.monotonic() - began
        artifacts.scrub_log()
        artifacts.write_json("result.json", result.to_dict())


def _measure(space: Space, host: Host, profile: LaunchProfile, watch: Watch, result: TrialResult, artifacts: TrialArtifacts,
             on_level: OnLevel | None, baseline_answers: list[str] | None) -> None:
    """Correctness prompts, then the ladder under GPU telemetry; fills ``result``.

    Requests go to the server's URL as its host reaches it (an SSH host's address), not the
    profile's ``--host``, which for ``0.0.0.0`` names this machine.
    """
    url = watch.handle.url
    spec = ladder_spec(space)
    try:
        result.answers = correctness.collect_answers(url, spec.api)
    except RunFailed as exc:
        _crashed(result, watch, watch.abort_reason() or str(exc))
        return
    artifacts.write_json("answers.json", result.answers)
    if baseline_answers is not None:
        result.answers_differ = bool(correctness.compare(baseline_answers, result.answers))
    def level_done(level: LevelResult) -> bool:
        result.levels.append(level)  # what result.json keeps if Ctrl-C or a hang-up stops the ladder
        return on_level(level) if on_level is not None else True

    with _LevelTelemetry(host, profile, result.gpu) as telemetry, _HealthCheck(watch) as health:
        ladder = run_ladder(url, spec, on_level=telemetry.wrap(level_done), should_abort=health.reason)
    health.raise_fault()
    artifacts.write_json("loadtest.json", ladder.to_dict())
    result.levels = ladder.levels
    slos = slos_of(space)
    passing = [level for level in ladder.levels if meets_slos(level, slos)]
    if passing:
        gpus = gpus_needed(profile.args) if space.objective.per_gpu else 1
        best = max(passing, key=lambda level: level_score(space, level, gpus))
        result.objective = level_score(space, best, gpus)
        result.peak_concurrency = best.at
    result.slo_ok = bool(passing)
    if ladder.aborted:
        _crashed(result, watch, ladder.aborted)
    else:
        result.outcome = Outcome.PRUNED if ladder.pruned else Outcome.COMPLETED


class _HealthCheck(Background):
    """The server's log and process checked in a thread while the ladder runs.

    The ladder polls ``should_abort`` every 50 ms inside the load generator's event loop; on an
    SSH host one check is an SFTP read and remote commands, long enough to starve the load
    generator and halve what it measures. So the check runs here and the ladder reads its latest
    verdict. A host fault during a check stops the ladder and is raised after it (the trial is
    then an infrastructure fault, not the config's). So is any other error: a thread that died
    quietly would leave the ladder measuring a server nobody watches.
    """

    def __init__(self, watch: Watch) -> None:
        self._watch = watch
        self._reason: str | None = None
        self._fault: Exception | None = None
        super().__init__("server-health")

    def _run(self) -> None:
        while self._reason is None and not self._stop.wait(HEALTH_POLL_S):
            try:
                self._reason = self._watch.abort_reason()
            except Exception as exc:  # noqa: BLE001 - raised on the trial's thread by raise_fault
                self._fault, self._reason = exc, str(exc) or type(exc).__name__

    def reason(self) -> str | None:
        """Why the server can no longer be measured, as of the last check; None while it is fine."""
        return self._reason

    def raise_fault(self) -> None:
        if self._fault is not None:
            raise self._fault


class _LevelTelemetry:
    """The server's GPUs sampled every second during the ladder; one record per level into ``records``.

    Only the trial knows both where a level begins and ends and which GPUs are the server's
    (other GPUs of the host may be busy with someone else's work), so the record is made here.
    A level too short to catch a periodic sample takes one at its end: every level gets a record
    where the host reports power at all.
    """

    def __init__(self, host: Host, profile: LaunchProfile, records: list[dict[str, Any]]) -> None:
        self._host = host
        self._profile = profile
        self._gpus = host.trial_gpus(profile)
        self._records = records
        self._telemetry = gpu.Telemetry(self._sample, self._gpus, TELEMETRY_INTERVAL_S)
        self._mark = 0

    def _sample(self) -> list[GpuSample] | None:
        # The trial's environment, not the controller's: it names the emulator's state dir.
        return self._host.gpu_samples(self._profile.env)

    def __enter__(self) -> _LevelTelemetry:
        self._telemetry.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._telemetry.__exit__(*exc)

    def _level_done(self, level: LevelResult) -> None:
        window = self._telemetry.since(self._mark)
        self._mark = self._telemetry.mark()
        if window is None:
            try:
                window = gpu.summarize([self._sample() or []], self._gpus)
            except InfrastructureFault:  # telemetry explains a result; it never fails a trial
                window = None
        if window is not None and window.power_w is not None:
            self._records.append({"concurrency": level.at, **window.record()})

    def wrap(self, on_level: OnLevel | None) -> OnLevel:
        """``on_level`` preceded by this level's GPU record."""

        def level_done(level: LevelResult) -> bool:
            self._level_done(level)
            return on_level(level) if on_level is not None else True

        return level_done


def _crashed(result: TrialResult, watch: Watch, reason: str) -> None:
    """The server died (or broke) after it was ready: the classifier's failure when it saw one."""
    event = watch.failure
    result.outcome = Outcome.CRASHED
    if event is not None:
        result.failure = Failure.from_event(event, watch.classifier.advice)
    elif reason == NO_PROGRESS:  # it took requests and sent nothing: hung while serving, not a rate of 0
        result.failure = Failure("stall", "ready", reason, False, f"stalled while serving: {reason}")
    else:
        result.failure = Failure("crash", "ready", reason, False, f"crashed while serving: {reason}")
