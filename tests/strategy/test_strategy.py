"""The strategy's telling, pruning, warm start and sampler factory, and a small benchmark run."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from search.errors import BadInput
from search.plan import Batch, sweep_values, worth_running
from search.settings import DEFAULT, Settings
from search.storage import Attr, Outcome, Plan
from search.strategy import SAMPLERS, Strategy, make_sampler
from tests.strategy.fixture import LADDER, FixtureSpace, to_flags

ROOT = Path(__file__).resolve().parents[2]


def _study(strategy: Strategy) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize", sampler=strategy.sampler)


def _started(settings: Settings = DEFAULT) -> tuple[FixtureSpace, Strategy, optuna.Study]:
    """A fresh study of the fixture space with its baseline enqueued."""
    space = FixtureSpace()
    strategy = Strategy(space, seed=0, settings=settings)
    study = _study(strategy)
    strategy.start(study)
    return space, strategy, study


def test_baseline_runs_first_then_known_configs() -> None:
    space = FixtureSpace()
    strategy = Strategy(space, seed=0)
    study = _study(strategy)
    known = {**space.baseline, "--max-running-requests": 512}
    strategy.start(study, known=[known, space.baseline])
    trial, config = strategy.ask(study)
    assert config == space.baseline and trial.user_attrs["strategy"] == "baseline"
    strategy.tell(study, trial, "completed", objective=900.0)
    _, second = strategy.ask(study)
    assert second == known
    strategy.start(study)  # a resumed study is not enqueued again
    assert sum(t.state == TrialState.WAITING for t in study.get_trials()) == 0


def test_crash_is_pruned_with_constraint_and_others_are_not() -> None:
    _, strategy, study = _started()
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "crashed", failure={"kind": "oom", "phase": "cuda_graph", "line": "x", "message": "m"})
    crashed = study.trials[0]
    assert crashed.state == TrialState.PRUNED and crashed.constraints["crashed"] == 1.0
    assert crashed.user_attrs["failure"]["phase"] == "cuda_graph"
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "completed", objective=1000.0, slo_ok=False)
    done = study.trials[1]
    assert done.state == TrialState.COMPLETE
    assert done.constraints == {"crashed": 0.0, "slo": 1.0, "correctness": 0.0}


def test_infrastructure_fault_fails_and_reenqueues_same_params() -> None:
    _, strategy, study = _started()
    trial, config = strategy.ask(study)
    strategy.tell(study, trial, "infrastructure", failure={"kind": "gpu_busy", "phase": "starting", "line": "", "message": ""})
    assert study.trials[0].state == TrialState.FAIL
    retry, again = strategy.ask(study)
    assert again == config and retry.user_attrs["retry_of"] == 0


def test_pruning_below_target_and_well_below_completed_trials() -> None:
    strategy = Strategy(FixtureSpace(), seed=0)
    study = _study(strategy)
    trial = study.ask()
    assert strategy.on_level(study, trial, 0, 64, 250.0) is False  # target at 64 is 300
    assert "below the target" in trial.user_attrs["pruned_because"]
    for value in (1000.0, 1100.0):
        done = study.ask()
        assert strategy.on_level(study, done, 1, 256, value)
        strategy.tell(study, done, "completed", objective=value)
    trial = study.ask()
    assert strategy.on_level(study, trial, 1, 256, 700.0) is True
    assert strategy.on_level(study, trial, 1, 256, 600.0) is False  # under 60% of 1100
    plain = Strategy(FixtureSpace(), "random", seed=0, guided=False)
    assert plain.on_level(study, study.ask(), 0, 64, 1.0) is True


def test_the_ladder_rules_are_an_optuna_pruner() -> None:
    """`LadderPruner` prunes through Optuna's own ``trial.should_prune()``, by the same rules."""
    from search.pruner import LadderPruner
    study = optuna.create_study(direction="maximize", pruner=LadderPruner(FixtureSpace().targets))
    trial = study.ask()
    trial.report(250.0, 0)
    assert trial.should_prune() is False  # no concurrency recorded for the level: nothing to judge
    trial.set_user_attr("level_concurrency", [64])
    assert trial.should_prune() is True  # target at 64 is 300
    assert Strategy(FixtureSpace(), seed=0, pruning=False).pruner is None


def test_without_the_memory_a_repeat_runs() -> None:
    """``memory=False`` ablates the filter alone: the same repeat the memory tells is asked and run."""
    for memory, runs in ((True, False), (False, True)):
        space = FixtureSpace()
        strategy = Strategy(space, seed=0, memory=memory)
        study = _study(strategy)
        strategy.start(study)
        baseline, config = strategy.ask(study)
        strategy.tell(study, baseline, "completed", objective=900.0)
        study.enqueue_trial(dict(config), user_attrs={"strategy": "sampler"})
        trial, again = strategy.ask(study)
        assert (again == config) is runs


def test_sweep_varies_one_parameter_of_the_incumbent() -> None:
    space, strategy, study = _started()
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "completed", objective=900.0)
    trial, config = strategy.ask(study)
    assert trial.user_attrs["strategy"] == "sweep"
    changed = [k for k in config if config[k] != space.baseline.get(k)]
    assert changed == [trial.user_attrs["sweep_param"]]


def test_sampler_factory() -> None:
    space = FixtureSpace()
    assert isinstance(make_sampler("tpe", space, 1), optuna.samplers.TPESampler)
    assert isinstance(make_sampler("gp", space, 1), optuna.samplers.GPSampler)
    assert isinstance(make_sampler("random", space, 1), optuna.samplers.RandomSampler)
    assert isinstance(make_sampler("grid", space, 1), optuna.samplers.GridSampler)
    assert set(SAMPLERS) == {"tpe", "gp", "random", "grid"}
    with pytest.raises(BadInput, match="unknown sampler"):
        make_sampler("cmaes", space)


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_search", ROOT / "scripts" / "bench_search.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_search"] = module
    spec.loader.exec_module(module)
    return module


def test_small_bench_ours_beats_random() -> None:
    bench = _bench_module()
    problem = bench.load_problem(ROOT / "scripts" / "landscapes" / "space.yaml")  # the studies run through StudyRun
    landscape = bench.load_landscape(ROOT / "scripts" / "landscapes" / "backend_crash.py")
    result = json.loads(json.dumps(bench.bench(problem, landscape, trials=15, seeds=2, noise=0.025,
                                               samplers=("ours", "random")), default=str))
    assert result["optimum"]["value"] > 0 and result["optimum"]["config"]["--moe-runner-backend"] == "cutlass"
    for kind in ("ours", "random"):
        keys = set(result["samplers"][kind])
        assert {"trials_to_95", "trials_to_99", "gpu_hours_to_95", "gpu_hours_to_99", "best_fraction"} <= keys
    assert result["samplers"]["ours"]["best_fraction"] > result["samplers"]["random"]["best_fraction"]


OOM_LINE = ("Exception: Capture cuda graph failed: CUDA out of memory. Possible solutions: "
            "1. set --mem-fraction-static to a smaller value 2. set --cuda-graph-max-bs to a smaller value")


def test_named_in_finds_flags_by_prefix_and_env_vars() -> None:
    from search.distributions import discover
    from search.moves import named_in
    dists = discover(FixtureSpace())
    assert named_in(OOM_LINE, dists) == ["--cuda-graph-max-bs-decode", "--mem-fraction-static"]
    assert named_in("NCCL WARN NCCL_MIN_NCHANNELS ignored", dists) == ["NCCL_MIN_NCHANNELS"]
    assert named_in("RuntimeError: flashinfer autotune failed", dists) == []


def test_crashed_baseline_tries_every_fix_its_failure_line_names() -> None:
    """Out of memory at the baseline: each value its failure line advises runs (smaller graph
    batches and memory fractions); larger ones would run out too, and the plan leaves them out."""
    space, strategy, study = _started()
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "crashed", failure={"kind": "oom", "phase": "cuda_graph", "line": OOM_LINE, "message": ""})
    fixes: list[dict[str, object]] = []
    while True:
        trial, config = strategy.ask(study)
        if trial.user_attrs.get("sweep_param") != "named by the crash":
            break
        fixes.append({k: v for k, v in config.items() if v != space.baseline.get(k)})
        strategy.tell(study, trial, "crashed", failure={"kind": "crash", "phase": "starting", "line": "x", "message": ""})
    assert {k for fix in fixes for k in fix} == {"--cuda-graph-max-bs-decode", "--mem-fraction-static"}
    assert all(len(fix) == 1 and all(v < space.baseline[k] for k, v in fix.items()) for fix in fixes), fixes


def test_value_that_crashed_alone_is_retried_with_a_partner_change() -> None:
    """The sweep finds a large graph batch crashes (out of memory) and a low memory fraction runs;
    the partner move combines them."""
    space, strategy, study = _started()
    for _ in range(40):
        trial, config = strategy.ask(study)
        if trial.user_attrs["strategy"] == "partner":
            break
        if config.get("--cuda-graph-max-bs-decode", 0) >= 1024:
            strategy.tell(study, trial, Outcome.CRASHED,
                          failure={"kind": "oom", "phase": "cuda_graph", "line": "CUDA out of memory", "message": ""})
        else:
            strategy.tell(study, trial, "completed", objective=1000.0)
    assert trial.user_attrs["strategy"] == "partner"
    assert trial.user_attrs["partner_of"] == "--cuda-graph-max-bs-decode=1024"
    changed = {k for k in config if config[k] != space.baseline.get(k)}
    assert "--cuda-graph-max-bs-decode" in changed and len(changed) == 2


def test_centre_ignores_a_change_that_only_won_by_noise() -> None:
    space, strategy, study = _started()
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "completed", objective=1000.0)
    trial, config = strategy.ask(study)  # first sweep variant
    strategy.tell(study, trial, "completed", objective=1010.0)  # within noise of the baseline
    assert strategy.history(study).centre == (space.baseline, True)
    trial, config = strategy.ask(study)
    strategy.tell(study, trial, "completed", objective=1500.0)
    assert strategy.history(study).centre == (config, True)


def test_screen_values_pick_the_most_different_value() -> None:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from search.moves import screen_values
    assert screen_values(CategoricalDistribution([None, 64, 128]), 64) == [None]
    assert screen_values(CategoricalDistribution(["auto", "triton", "cutlass"]), "cutlass") == ["auto"]
    assert screen_values(CategoricalDistribution(["auto", "triton"]), "auto") == ["triton"]
    assert screen_values(CategoricalDistribution([False, True]), False) == [True]
    assert screen_values(IntDistribution(32, 2048, log=True), 64) == [2048]
    assert screen_values(FloatDistribution(0.80, 0.95, step=0.01), 0.92) == [0.80]


def test_screening_expands_only_parameters_whose_screen_mattered() -> None:
    """Each parameter is screened once; then only the ones that moved throughput beyond noise (here
    the MoE backend) get their other values swept, before the sampler takes over."""
    space, strategy, study = _started()
    screened: list[str] = []
    swept: list[str] = []
    for _ in range(12):
        trial, config = strategy.ask(study)
        tag, name = trial.user_attrs["strategy"], trial.user_attrs.get("sweep_param")
        if tag == "sweep" and trial.user_attrs["sweep_pass"] == -1:
            screened.append(name)
        elif tag == "sweep":
            swept.append(name)
        value = 1000.0 if config["--moe-runner-backend"] == "flashinfer_cutlass" else 700.0
        strategy.tell(study, trial, "completed", objective=value)
    assert screened == list(strategy._dists)
    assert swept and set(swept) == {"--moe-runner-backend"}


def test_parameter_inactive_at_the_centre_is_swept_where_it_is_active() -> None:
    """Graphs off wins, so the graph batch cap drops out of the centre; it is still swept, from the
    best config that captures graphs."""
    space, strategy, study = _started()
    for _ in range(20):
        trial, config = strategy.ask(study)
        if trial.user_attrs.get("sweep_param") == "--cuda-graph-max-bs-decode" and trial.user_attrs["sweep_pass"] == 0:
            break
        strategy.tell(study, trial, "completed", objective=1500.0 if config["--disable-cuda-graph"] else 1000.0)
    assert strategy.history(study).centre[0]["--disable-cuda-graph"] is True
    assert trial.user_attrs.get("sweep_param") == "--cuda-graph-max-bs-decode"
    assert config["--disable-cuda-graph"] is False


@pytest.mark.parametrize("kind, known", [("oom", False), ("crash", True)])
def test_a_choice_that_ran_out_of_memory_alone_is_not_a_known_crash(kind: str, known: bool) -> None:
    _, strategy, study = _started()
    for _ in range(10):
        trial, config = strategy.ask(study)
        if trial.user_attrs.get("sweep_param") == "--moe-runner-backend":
            strategy.tell(study, trial, "crashed", failure={"kind": kind, "phase": "autotune", "line": "x", "message": ""})
            break
        strategy.tell(study, trial, "completed", objective=1000.0)
    assert (strategy.memory.known_crashes(study.get_trials()) == {"--moe-runner-backend": [config["--moe-runner-backend"]]}) is known


def test_a_config_asking_more_memory_than_one_that_ran_out_is_a_known_crash() -> None:
    """Out of memory at 0.92 with graphs of up to 256: 0.93, or 0.92 with a larger graph batch, run
    out too (both against the failure's advice); a smaller fraction or batch, graphs off, or another
    backend (its own buffers move the edge) may not, and run."""
    space = FixtureSpace()
    strategy = Strategy(space, seed=0)
    study = _study(strategy)
    crashed = {**space.baseline, "--mem-fraction-static": 0.92, "--cuda-graph-max-bs-decode": 256}
    strategy.start(study, known=[crashed])
    for outcome in ("completed", "crashed"):
        trial, _ = strategy.ask(study)
        strategy.tell(study, trial, outcome, objective=1000.0, failure={
            "kind": "oom", "phase": "cuda_graph", "line": "Capture cuda graph failed: CUDA out of memory.",
            "message": "", "advice": ["1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
                                      "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
                                      "4. disable CUDA graph by --disable-cuda-graph."]})
    trials = study.get_trials()

    def reason(**changes: object) -> str | None:
        return strategy.memory.reason(trials, strategy.history(study).active({**crashed, **changes}))

    assert "ran out" in str(reason(**{"--mem-fraction-static": 0.93}))
    assert "ran out" in str(reason(**{"--mem-fraction-static": 0.95, "--cuda-graph-max-bs-decode": 512}))
    assert reason(**{"--mem-fraction-static": 0.91}) is None
    assert reason(**{"--mem-fraction-static": 0.93, "--cuda-graph-max-bs-decode": 128}) is None
    assert reason(**{"--mem-fraction-static": 0.93, "--disable-cuda-graph": True}) is None
    assert reason(**{"--mem-fraction-static": 0.93, "--moe-runner-backend": "triton"}) is None
    assert reason(**{"--mem-fraction-static": 0.93, "NCCL_MIN_NCHANNELS": 8}) is None
    # The model's small moves read the numbers the advice leaves out (a channel count, a cap) as free,
    # the choices (backend, graphs) not: 0.93 runs out at 8 channels too, on triton it may not.
    history = strategy.history(study)
    assert history.past_oom(history.active({**crashed, "--mem-fraction-static": 0.93, "NCCL_MIN_NCHANNELS": 8}))
    assert not history.past_oom(history.active({**crashed, "--mem-fraction-static": 0.91, "NCCL_MIN_NCHANNELS": 8}))
    assert not history.past_oom(history.active({**crashed, "--mem-fraction-static": 0.93, "--moe-runner-backend": "triton"}))

    # So do the sampler's own proposals (a planned sweep's are matched exactly): one asking 0.93 at
    # another cap is told crashed without running, and the next proposal runs.
    past = history.active({**crashed, "--mem-fraction-static": 0.93, "--max-running-requests": 512})
    proposals = iter([past, history.active({**crashed, "--mem-fraction-static": 0.90})])
    trial, config = strategy.memory.ask(study, lambda _trial: next(proposals))
    told = study.get_trials()[-2]
    assert config["--mem-fraction-static"] == 0.90 and told.number == trial.number - 1
    assert told.state == TrialState.PRUNED and "ran out" in told.user_attrs["skipped"]
    assert reason(**{"--mem-fraction-static": 0.93, "--max-running-requests": 512}) is None


def test_a_move_from_a_crashing_baseline_teaches_no_known_crash() -> None:
    """The baseline's backend fails, so its screens crash too until one changes the backend: those
    crashes are the baseline's fault, not their values', and stay open for the sampler."""
    _, strategy, study = _started()
    for _ in range(8):
        trial, config = strategy.ask(study)
        if config["--moe-runner-backend"] != "flashinfer_cutlass":
            break
        strategy.tell(study, trial, "crashed", failure={"kind": "crash", "phase": "autotune", "line": "x", "message": ""})
    crashed = [t for t in study.trials if t.user_attrs.get("outcome") == "crashed"]
    assert any(t.params.get("--disable-cuda-graph") for t in crashed)
    assert strategy.memory.known_crashes(study.get_trials()) == {}


def test_bench_flag_composer_matches_render_and_parse() -> None:
    from search.strategy import configs_of, grid_space
    bench = _bench_module()
    space = FixtureSpace()
    problem = bench.Problem(space=space, concurrency=LADDER, level_seconds=120, to_flags=to_flags)
    grid = grid_space(space, 3)
    composer = bench.FlagComposer(bench.Simulator(problem, object()), grid)
    configs = configs_of(grid, space)
    assert any("--cuda-graph-max-bs-decode" not in c for c in configs)
    assert composer.verified(configs)
    assert composer.flags(configs[-1]) == to_flags(configs[-1])


def test_changes_that_each_won_within_noise_are_tried_together() -> None:
    """Two screens beat the baseline by 2% (noise: the centre stays), so one trial combines them."""
    space, strategy, study = _started()
    for _ in range(12):
        trial, config = strategy.ask(study)
        if trial.user_attrs.get("sweep_param") == "combined":
            break
        gain = 20.0 * (config["NCCL_MIN_NCHANNELS"] == 32) + 20.0 * (config["--mem-fraction-static"] == 0.80)
        strategy.tell(study, trial, "completed", objective=1000.0 + gain)
    assert trial.user_attrs.get("sweep_param") == "combined"
    assert config == {**space.baseline, "NCCL_MIN_NCHANNELS": 32, "--mem-fraction-static": 0.80}


def test_a_running_sampler_trial_does_not_hold_up_the_sweep() -> None:
    """With several hosts a sampler trial is nearly always running; the planned sweep must go on."""
    space, strategy, study = _started()
    baseline, _ = strategy.ask(study)
    sampler_trial, _ = strategy.ask(study)  # a second host starts while the baseline runs
    assert sampler_trial.user_attrs["strategy"] == "sampler"
    strategy.tell(study, baseline, "completed", objective=900.0)
    planned, _ = strategy.ask(study)  # the sampler trial is still RUNNING
    assert planned.user_attrs["strategy"] == "sweep"
    assert study.trials[sampler_trial.number].state == TrialState.RUNNING


SEED_OOM_ADVICE = [  # what the log watcher keeps after SGLang's graph-capture OOM (tests/fixtures/logs)
    "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
    "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
    "3. disable torch compile by not using --enable-torch-compile",
    "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)",
]


def test_advice_reads_direction_and_value_per_flag() -> None:
    from optuna.distributions import CategoricalDistribution

    from search.distributions import discover
    from search.moves import advice
    dists = discover(FixtureSpace())
    assert advice("\n".join(SEED_OOM_ADVICE), dists) == {
        "--mem-fraction-static": ("down", None), "--cuda-graph-max-bs-decode": ("down", None),
        "--disable-cuda-graph": ("set", True)}
    assert advice("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
                  "self.server_args.mem_fraction_static=0.95", dists) == {"--mem-fraction-static": ("up", None)}
    assert advice("NCCL WARN NCCL_MIN_NCHANNELS ignored", dists) == {"NCCL_MIN_NCHANNELS": ("any", None)}
    graphs = {"--cuda-graph-backend-decode": CategoricalDistribution(["full", "breakable", "disabled"]),
              "--enable-torch-compile": CategoricalDistribution([False, True])}
    assert advice("4. disable CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended)\n"
                  "3. disable torch compile by not using --enable-torch-compile", graphs) == {
        "--cuda-graph-backend-decode": ("set", "disabled"), "--enable-torch-compile": ("set", False)}


def test_toward_moves_one_grid_step_the_advised_way() -> None:
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    from search.moves import toward
    fraction = FloatDistribution(0.80, 0.95, step=0.01)
    assert toward(fraction, 0.92, ("down", None)) == 0.91  # grid 0.80, 0.84, 0.87, 0.91, 0.95
    assert toward(fraction, 0.88, ("down", None)) == 0.87
    assert toward(fraction, 0.80, ("down", None)) is None
    assert toward(fraction, 0.88, ("up", None)) == 0.91
    batches = CategoricalDistribution([None, 64, 128, 256, 512])
    assert toward(batches, 256, ("down", None)) == 128
    assert toward(batches, None, ("down", None)) == 64  # SGLang's own choice: the smallest fixes most
    assert toward(CategoricalDistribution([False, True]), False, ("set", True)) is True
    assert toward(CategoricalDistribution([False, True]), True, ("set", True)) is None


def _oom(advice: list[str]) -> dict:
    return {"kind": "oom", "phase": "cuda_graph", "message": "",
            "line": "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 448.00 MiB.",
            "advice": advice}


def test_a_move_that_runs_out_of_memory_is_repaired_at_once_the_way_the_advice_says() -> None:
    """Removing the cap crashes in graph capture; the very next trials retry it with a smaller memory
    fraction, a smaller graph batch and graphs off, before any other parameter is screened."""
    space, strategy, study = _started()
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "completed", objective=900.0)
    trial, config = strategy.ask(study)
    assert trial.user_attrs["sweep_param"] == "--max-running-requests"
    strategy.tell(study, trial, "crashed", failure=_oom(SEED_OOM_ADVICE))
    repairs = []
    for _ in range(3):
        repair, fixed = strategy.ask(study)
        assert repair.user_attrs["strategy"] == "partner" and fixed["--max-running-requests"] == config["--max-running-requests"]
        repairs.append({k: v for k, v in fixed.items() if k != "--max-running-requests" and v != space.baseline.get(k)})
        strategy.tell(study, repair, "crashed", failure=_oom(SEED_OOM_ADVICE))
    assert repairs == [{"--mem-fraction-static": 0.87}, {"--cuda-graph-max-bs-decode": 76}, {"--disable-cuda-graph": True}]
    # They all crashed too: the numeric ones go one step further; graphs off is not tried twice.
    further = []
    for _ in range(2):
        repair, fixed = strategy.ask(study)
        further.append((fixed["--mem-fraction-static"], fixed.get("--cuda-graph-max-bs-decode")))
        strategy.tell(study, repair, "crashed", failure=_oom(SEED_OOM_ADVICE))
    assert further == [(0.84, 128), (0.88, 32)]
    nxt, _ = strategy.ask(study)
    assert nxt.user_attrs["strategy"] == "sweep" and nxt.user_attrs["sweep_param"] != "--max-running-requests"


def _after_screen_crashes(param: str, settings: Settings) -> str:
    """The plan's tag of the trial after ``param``'s screen ran out of memory (every other trial
    completes at 900 tok/s)."""
    _, strategy, study = _started(settings)
    for _ in range(20):  # the screens come right after the baseline, one parameter each
        trial, _ = strategy.ask(study)
        if trial.user_attrs.get("sweep_param") == param and trial.user_attrs.get("sweep_pass") == -1:
            strategy.tell(study, trial, "crashed", failure=_oom(SEED_OOM_ADVICE))
            return str(strategy.ask(study)[0].user_attrs["strategy"])
        strategy.tell(study, trial, "completed", objective=900.0)
    raise AssertionError(f"{param} was never screened")


@pytest.mark.parametrize(("param", "repaired"), [("--mem-fraction-static", False), ("--cuda-graph-max-bs-decode", True)])
def test_a_screen_whose_failure_first_advises_undoing_it_is_not_repaired(param: str, repaired: bool) -> None:
    """The memory fraction's screen (its top end) ran out of memory, and SGLang's first fix is a smaller
    memory fraction: no repair keeps that value (in traces of tuning landscapes, 91 of 92 such repairs
    ran out too); the grid closes in instead. A graph batch's screen that ran out is repaired as
    before, since the first fix is another flag's (a smaller memory fraction leaves the graphs room)."""
    assert _after_screen_crashes(param, Settings(undo_repairs=True)) == Plan.PARTNER
    assert (_after_screen_crashes(param, DEFAULT) == Plan.PARTNER) == repaired


def test_an_oom_that_names_no_flag_gets_sglangs_usual_advice() -> None:
    space, strategy, study = _started()
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "completed", objective=900.0)
    trial, config = strategy.ask(study)
    strategy.tell(study, trial, "crashed", failure=_oom([]))
    repair, fixed = strategy.ask(study)
    assert repair.user_attrs["strategy"] == "partner"
    assert fixed == {**config, "--mem-fraction-static": 0.87}


@pytest.mark.parametrize(("phase", "repaired"), [
    ("cuda_graph", [{"--cuda-graph-max-bs-decode": 76}, {"--disable-cuda-graph": True}]),
    ("loading", []),
])
def test_a_hang_in_graph_capture_is_retried_with_smaller_graphs_and_without(phase: str, repaired: list[dict]) -> None:
    """A hang prints no line to read advice from. In graph capture it gets the graph lines of
    SGLang's capture advice (a backend that hangs there may run with graphs off, and be the best:
    generated landscapes 29 and 40 never found theirs); elsewhere nothing is suspect."""
    space, strategy, study = _started()
    trial, _ = strategy.ask(study)
    strategy.tell(study, trial, "completed", objective=900.0)
    trial, config = strategy.ask(study)
    hang = {"kind": "stall", "phase": phase, "line": "", "message": "", "advice": []}
    strategy.tell(study, trial, "crashed", failure=hang)
    repairs = []
    while (repair := strategy.ask(study))[0].user_attrs["strategy"] == "partner":
        fixed = repair[1]
        assert fixed[trial.user_attrs["sweep_param"]] == config[trial.user_attrs["sweep_param"]]
        repairs.append({k: v for k, v in fixed.items() if k in ("--cuda-graph-max-bs-decode", "--disable-cuda-graph")
                        and v != space.baseline.get(k)})
        strategy.tell(study, repair[0], "completed", objective=900.0)
    assert repairs == repaired


def test_a_win_on_an_old_centre_is_tried_again_on_the_new_one() -> None:
    """The backend's screen wins 3% (within noise: the centre stays); a lower memory fraction then
    doubles throughput and moves the centre, so the backend change is tried again on the new centre."""
    space, strategy, study = _started()
    for _ in range(12):
        trial, config = strategy.ask(study)
        if trial.user_attrs.get("sweep_pass") == "revisit":
            break
        value = 1000.0 * (2.0 if config["--mem-fraction-static"] == 0.80 else 1.0) \
            * (1.03 if config["--moe-runner-backend"] == "auto" else 1.0)
        strategy.tell(study, trial, "completed", objective=value)
    assert trial.user_attrs.get("sweep_pass") == "revisit"
    assert config == {**space.baseline, "--mem-fraction-static": 0.80, "--moe-runner-backend": "auto"}


def test_a_level_that_cannot_catch_the_best_is_pruned() -> None:
    """Completed trials grew at most 2x from the first level to their objective: a trial whose first
    level is a third of theirs cannot win, and one at the same level is kept."""
    strategy = Strategy(FixtureSpace(), seed=0)
    study = _study(strategy)
    for levels in ([1000.0, 1500.0, 2000.0], [900.0, 1000.0, 1100.0]):
        done = study.ask()
        for step, value in enumerate(levels):
            strategy.on_level(study, done, step, LADDER[step], value)
        strategy.tell(study, done, "completed", objective=levels[-1])
    keep = study.ask()
    assert strategy.on_level(study, keep, 0, 64, 1000.0) is True
    slow = study.ask()
    assert strategy.on_level(study, slow, 0, 64, 700.0) is False  # 700 x 2 x 1.08 < 2000
    assert "would reach 1512, under the best 2000" in slow.user_attrs["pruned_because"]
    last = study.ask()
    assert strategy.on_level(study, last, 2, 512, 1200.0) is True  # no level after it: not pruned by reach


def _completed(space: FixtureSpace, strategy: Strategy, study: optuna.Study, runs: list[tuple[dict, float]]) -> None:
    """Tell each run completed: the baseline with ``change``, measured ``value``."""
    for change, value in runs:
        study.enqueue_trial({**space.baseline, **change})
        trial = study.ask()
        space.suggest(trial)
        strategy.tell(study, trial, "completed", objective=value)


def test_top_ranks_by_the_pooled_estimate_not_the_luckiest_measurement() -> None:
    """cutlass was measured four times around 1000 and once at 1100 (a lucky run); a flashinfer_cutlass
    config measured 1060 twice is really better. The measured maximum would pick the lucky run."""
    space = FixtureSpace()
    strategy = Strategy(space, seed=0)
    study = _study(strategy)
    runs = [("cutlass", 64, v) for v in (1000.0, 990.0, 1010.0, 1000.0, 1100.0)] + \
        [("flashinfer_cutlass", 128, 1060.0), ("flashinfer_cutlass", 128, 1060.0)]
    _completed(space, strategy, study, [({"--moe-runner-backend": backend, "--cuda-graph-max-bs-decode": batch}, value)
                                        for backend, batch, value in runs])
    best = strategy.top(study, 1)[0]
    assert best.params["--moe-runner-backend"] == "flashinfer_cutlass"
    assert max(study.trials, key=lambda t: t.value).params["--moe-runner-backend"] == "cutlass"


def test_running_peak_is_read_only_inside_the_ladder() -> None:
    from search.moves import running_peak
    peak = running_peak([(64.0, 900.0), (256.0, 2000.0), (512.0, 1800.0), (1024.0, 1000.0)])
    assert peak is not None and 64.0 < peak < 512.0
    assert running_peak([(64.0, 900.0), (256.0, 1500.0), (512.0, 1800.0)]) is None  # still rising
    assert running_peak([(64.0, 900.0), (256.0, 2000.0), (512.0, 1980.0)]) is None  # flat within noise


def _run_ladder(strategy: Strategy, study: optuna.Study,
                values: list[float] | Callable[[dict], list[float]]) -> tuple[optuna.Trial, dict]:
    """Ask the next trial, report ``values`` (or ``values(config)``) up the fixture's ladder, and
    tell it completed."""
    trial, config = strategy.ask(study)
    measured = values(config) if callable(values) else values
    for step, (concurrency, value) in enumerate(zip(LADDER, measured, strict=True)):
        strategy.on_level(study, trial, step, concurrency, value)
    strategy.tell(study, trial, "completed", objective=max(measured))
    return trial, config


def test_the_cap_is_read_off_the_ladder_and_a_capped_trial_is_no_centre() -> None:
    """An uncapped config's ladder peaks at 256 running requests and falls past it (KV pressure):
    the next move caps it near the peak. That capped trial measuring higher does not become the
    centre while the uncapped config works: its ladder would hide the curve from other flags."""
    space = FixtureSpace()
    strategy = Strategy(space, seed=0)
    study = _study(strategy)
    uncapped = {**space.baseline, "--max-running-requests": 2048}
    strategy.start(study, known=[uncapped])
    _run_ladder(strategy, study, [900.0] * 4)  # the baseline: capped at 64, every level runs 64
    _run_ladder(strategy, study, [900.0, 2000.0, 1800.0, 1000.0])
    trial, config = _run_ladder(strategy, study, [900.0, 2000.0, 2100.0, 2100.0])
    assert trial.user_attrs["sweep_pass"] == "ladder"
    assert 64 < config["--max-running-requests"] < 512
    assert config == {**uncapped, "--max-running-requests": config["--max-running-requests"]}
    assert strategy.history(study).centre == (uncapped, True)
    nxt, _ = strategy.ask(study)
    assert nxt.user_attrs.get("sweep_pass") != "ladder"  # read once per slice


def test_a_change_whose_revisit_lost_is_not_revisited_again() -> None:
    """The backend won 3% on the baseline but loses on the centre with a lower memory fraction;
    when NCCL channels move the centre again, the backend is not tried a third time."""
    space, strategy, study = _started()
    revisits = []
    for _ in range(30):
        trial, config = strategy.ask(study)
        if trial.user_attrs.get("sweep_pass") == "revisit":
            revisits.append({k: v for k, v in config.items() if v != space.baseline.get(k)})
        low_mem = config["--mem-fraction-static"] == 0.80
        value = 1000.0 * (2.0 if low_mem else 1.0) * (1.5 if config["NCCL_MIN_NCHANNELS"] == 32 else 1.0) \
            * (1.03 if config["--moe-runner-backend"] == "auto" and not low_mem else 1.0)
        strategy.tell(study, trial, "completed", objective=value)
    centre, _ = strategy.history(study).centre
    assert centre["NCCL_MIN_NCHANNELS"] == 32 and centre["--mem-fraction-static"] == 0.80
    assert [r.get("--moe-runner-backend") for r in revisits].count("auto") == 1


def test_a_config_already_running_is_not_started_twice() -> None:
    """Parallel asks: a planned or sampled config equal to a running trial's is told, not run."""
    space, strategy, study = _started()
    running, config = strategy.ask(study)
    study.enqueue_trial(dict(config), user_attrs={"strategy": "sweep"})
    other, _ = strategy.ask(study)
    skipped = study.trials[running.number + 1]
    assert skipped.state == TrialState.FAIL and skipped.user_attrs["skipped"] == f"same config as running trial {running.number}"
    assert other.number > skipped.number and study.trials[running.number].state == TrialState.RUNNING


def test_a_run_of_repeats_ends_with_one_that_runs() -> None:
    """A sampler proposing only configs already run (a small space used up) is told ``max_skips``
    repeats, then its next proposal runs: the ask never hands back a trial it already told."""
    space, strategy, study = _started(Settings(max_skips=3))
    baseline, config = strategy.ask(study)
    strategy.tell(study, baseline, "completed", objective=900.0)
    for _ in range(5):
        study.enqueue_trial(dict(config), user_attrs={"strategy": "sweep"})
    trial, again = strategy.ask(study)
    assert again == config and study.trials[trial.number].state == TrialState.RUNNING
    told = [t for t in study.trials if t.user_attrs.get("skipped")]
    assert len(told) == 3 and all(t.state == TrialState.FAIL for t in told)
    trial.set_user_attr("host", "gpu-0")  # still open to the driver's records


def test_a_planned_move_equal_to_a_waiting_retry_is_not_enqueued() -> None:
    """A trial lost to an infrastructure fault waits to be retried with its config; a sweep move
    planned meanwhile with the same config would run it twice."""
    space, strategy, study = _started()
    baseline, _ = strategy.ask(study)
    lost, config = strategy.ask(study)  # a second host takes a sampler trial, then loses it
    strategy.tell(study, lost, "infrastructure", failure={"kind": "worker_lost", "phase": "starting", "line": "",
                                                          "message": ""})
    strategy.tell(study, baseline, "completed", objective=900.0)
    assert strategy.memory.reason(study.get_trials(), config) == f"same config as waiting trial {lost.number + 1}"
    assert not worth_running(strategy.history(study), Batch([config], {Attr.PLAN: Plan.SWEEP}))
    asked = [strategy.ask(study)[1] for _ in range(3)]
    assert asked[0] == config and config not in asked[1:]


def _drive(strategy: Strategy, study: optuna.Study, trials: int, level: Callable[[dict, int], float]) -> list[optuna.Trial]:
    """Run ``trials`` trials up the fixture's ladder, each level measuring ``level(config, running)``
    where a level runs min(concurrency, cap) requests; returns the trials asked."""
    def values(config: dict) -> list[float]:
        return [level(config, min(c, config["--max-running-requests"])) for c in LADDER]

    return [_run_ladder(strategy, study, values)[0] for _ in range(trials)]


def test_the_cap_sweep_skips_caps_the_centres_ladder_measured() -> None:
    """An uncapped run's levels measured every cap inside the ladder: sweeping them repeats that
    curve. Only a cap below the lowest level is new, and only worth it when the curve fell from its
    first level on."""
    space = FixtureSpace()
    uncapped = {**space.baseline, "--max-running-requests": 2048}
    for ladder, left in (([900.0, 1500.0, 1800.0, 2000.0], []), ([900.0, 800.0, 700.0, 600.0], [32])):
        strategy = Strategy(space, seed=0)
        study = _study(strategy)
        strategy.start(study, known=[uncapped])
        _run_ladder(strategy, study, [900.0] * 4)
        _run_ladder(strategy, study, ladder)
        assert sweep_values(strategy.history(study), uncapped, "--max-running-requests", 0) == left
    assert sweep_values(strategy.history(study), space.baseline, "--max-running-requests", 0) == [32, 256, 2048]


def test_the_sweep_skips_a_value_next_to_the_centres_and_one_that_lost_by_far() -> None:
    """A cap removed doubles throughput and 32 NCCL channels add 10%, so the centre moves twice. The
    memory fraction's screen, 0.80, halved throughput on the way: the sweep from the last centre
    tries only 0.95 of its grid, not 0.80 again nor 0.87, next to the centre's 0.88."""
    from search.moves import grid_values
    space, strategy, study = _started()
    assert grid_values(strategy._dists["--mem-fraction-static"], DEFAULT.numeric_points) == [0.80, 0.87, 0.95]

    def level(config: dict, running: int) -> float:
        return (running * (2.0 if config["--max-running-requests"] >= 1024 else 1.0)
                * (0.5 if config["--mem-fraction-static"] == 0.80 else 1.0)
                * (1.1 if config["NCCL_MIN_NCHANNELS"] == 32 else 1.0))

    asked = _drive(strategy, study, 16, level)
    memory_sweep = [t for t in asked if t.user_attrs.get("sweep_param") == "--mem-fraction-static"
                    and t.user_attrs["sweep_pass"] == 0]
    assert strategy.history(study).centre[0]["NCCL_MIN_NCHANNELS"] == 32
    assert [study.trials[t.number].params["--mem-fraction-static"] for t in memory_sweep] == [0.95]


def test_running_kink_meets_the_lines_either_side_of_the_highest_point() -> None:
    from search.moves import running_kink

    def rate(running: float) -> float:  # rises to a kink at 160 running requests, then falls steeply
        return 2600 * running / (running + 60) * min(1.0, (160 / running) ** 0.8)

    points = [(r, rate(r)) for r in (64.0, 143.0, 256.0, 512.0)]
    assert 150 < running_kink(points) < 175  # type: ignore[operator]
    assert running_kink([(r, rate(r)) for r in (64.0, 180.0, 256.0, 512.0)]) is not None
    assert running_kink(points[:3]) is None
    assert running_kink([(64.0, 900.0), (256.0, 1500.0), (512.0, 1800.0), (1024.0, 2000.0)]) is None  # no peak


def test_the_final_centres_cap_is_read_again_where_its_curve_kinks() -> None:
    """Throughput peaks sharply at 160 running requests. The first read of the uncapped centre's
    ladder lands short of it; once the sweep is done, a second read through the capped run's point
    lands closer, and no third read follows."""
    space = FixtureSpace()
    strategy = Strategy(space, seed=0)
    study = _study(strategy)
    strategy.start(study, known=[{**space.baseline, "--max-running-requests": 2048}])

    def level(config: dict, running: int) -> float:
        return 2600 * running / (running + 60) * min(1.0, (160 / running) ** 0.8)

    asked = _drive(strategy, study, 30, level)
    reads = [(t.user_attrs.get("sweep_pass"), study.trials[t.number].params["--max-running-requests"])
             for t in asked if t.user_attrs.get("sweep_pass") in ("ladder", "kink")]
    assert [kind for kind, _ in reads] == ["ladder", "kink"]
    assert abs(reads[1][1] - 160) < abs(reads[0][1] - 160) and 150 <= reads[1][1] <= 175


def test_trials_far_below_the_best_do_not_move_the_ranking_of_the_top() -> None:
    """Nine uncapped configs within a few percent of each other differ in NCCL channels and memory
    fraction; seven capped ones run at 30-85% of them. Fitted on all sixteen, the model spends its
    length scales on the cap and reorders the top; fitted on the band near the best, it does not."""
    def run(n: int, mem: float, cap: int = 2048) -> dict:
        return {"--moe-runner-backend": "cutlass", "--max-running-requests": cap, "NCCL_MIN_NCHANNELS": n,
                "--mem-fraction-static": mem}

    top = [(run(n, m), v) for n, m, v in [(4, .88, 3000), (16, .90, 3200), (32, .88, 2950), (8, .92, 3100),
                                          (12, .95, 3180), (24, .85, 3050), (2, .90, 2900), (16, .95, 3150), (20, .88, 3120)]]
    far = [(run(n, .88, cap), v) for cap, n, v in [(100, 16, 1200), (200, 4, 1900), (300, 32, 2300), (400, 12, 2500),
                                                 (150, 8, 1500), (600, 20, 2600), (64, 16, 900)]]

    def ranking(runs: list[tuple[dict, float]], settings: Settings = DEFAULT) -> list[tuple[int, float]]:
        space = FixtureSpace()
        strategy = Strategy(space, seed=0, settings=settings)
        study = _study(strategy)
        _completed(space, strategy, study, runs)
        return [(t.params["NCCL_MIN_NCHANNELS"], t.params["--mem-fraction-static"]) for t in strategy.top(study, 3)]

    assert ranking(top + far) == ranking(top)
    every = Settings(rank_band=1.0)  # the band is every trial: the old ranking
    assert ranking(top + far, every) != ranking(top, every)


def test_expected_improvement_rewards_a_higher_mean_and_more_doubt() -> None:
    from search.surrogate import fit
    space = FixtureSpace()
    dists = Strategy(space, seed=0)._dists
    configs = [{**space.baseline, "NCCL_MIN_NCHANNELS": n} for n in (1, 2, 4, 8)]
    model = fit(dists, configs, [1000.0, 1100.0, 1200.0, 1300.0])
    assert model is not None
    best = float(model.predict(configs)[0].max())
    gain = model.expected_improvement([{**space.baseline, "NCCL_MIN_NCHANNELS": n} for n in (1, 8, 32)], best)
    assert gain[0] < gain[1] < gain[2]  # far below < at the best < past the best, unmeasured


@pytest.mark.parametrize("flip_every", [DEFAULT.model_flip_every, 1], ids=["default", "flips"])
def test_after_the_plan_every_other_trial_is_the_models_proposal(flip_every: int) -> None:
    """Once the plan is done and enough trials are near the best, the model proposes every other
    trial: a config one or two numeric changes from a measured one (or, among the candidates that
    ``model_flip_every`` makes flips, one choice flag set another way), never a repeat; the sampler
    takes the turns between."""
    space, strategy, study = _started(Settings(model_flip_every=flip_every))
    settings = strategy.settings
    backend = {"cutlass": 1.0, "auto": 0.85, "triton": 0.7, "flashinfer_cutlass": 0.8, "flashinfer_trtllm": 0.9}

    def level(config: dict, running: int) -> float:  # an interior NCCL optimum at 16, the cap saturating
        nccl = 1.0 - 0.08 * abs(config["NCCL_MIN_NCHANNELS"] - 16) / 16
        return 5000.0 * running / (running + 500) * nccl * backend[config["--moe-runner-backend"]]

    asked = _drive(strategy, study, 45, level)
    kinds = [t.user_attrs["strategy"] for t in asked]
    assert "model" in kinds and all(a != "model" or b != "model" for a, b in zip(kinds, kinds[1:], strict=False))
    first = kinds.index("model")
    done = [study.trials[t.number] for t in asked[:first] if study.trials[t.number].state == TrialState.COMPLETE]
    best = max(t.value for t in done)
    assert sum(t.value >= best * (1 - settings.rank_band) for t in done) >= settings.band_min_points
    numeric = {"--max-running-requests", "--cuda-graph-max-bs-decode", "--mem-fraction-static", "NCCL_MIN_NCHANNELS"}
    choice = {"--disable-cuda-graph", "--moe-runner-backend"}
    for t in asked:
        if t.user_attrs["strategy"] != "model":
            continue
        config = study.trials[t.number].params
        earlier = [study.trials[e.number].params for e in asked if e.number < t.number]
        assert config not in earlier
        changes = [{k for k in set(config) | set(e) if config.get(k) != e.get(k)} for e in earlier]
        small = [c for c in changes if 0 < len(c) <= 2 and c <= numeric]
        # a flip: one choice flag set another way, less what it turned off (graphs off: the graph batch cap)
        flipped = [c for c, e in zip(changes, earlier, strict=True) if len(c & set(config)) == 1 and c & set(config) <= choice
                   and c - set(config) <= set(e)]
        if flip_every == 1:  # every candidate a flip: so is every proposal
            assert flipped, f"model trial {t.number}: {config}"
        else:
            assert small or flipped, f"model trial {t.number}: {config}"


def test_a_flip_sets_one_choice_another_way_and_never_leaves_a_parameter_unset() -> None:
    """`flip` changes one categorical parameter to another of its choices; a flip that turns graphs
    on from a graphs-off config lacks the graph batch cap that turns on with them, and `complete`
    (`History.complete`) keeps it from the candidates."""
    import numpy as np

    from search.plan import flip
    space, strategy, study = _started()
    h = strategy.history(study)
    rng = np.random.default_rng(0)
    for _ in range(50):
        out = flip(h, space.baseline, rng)
        changed = [k for k in out if out[k] != space.baseline[k]]
        assert len(changed) == 1 and changed[0] in ("--disable-cuda-graph", "--moe-runner-backend")
    graphs_off = h.active({**space.baseline, "--disable-cuda-graph": True})
    assert "--cuda-graph-max-bs-decode" not in graphs_off and h.complete(graphs_off) == graphs_off
    assert h.complete({**graphs_off, "--disable-cuda-graph": False}) is None
    assert h.complete(space.baseline) == space.baseline


def test_a_config_measured_far_below_the_best_is_not_ranked_first() -> None:
    """Whatever the model estimates (here a fit that collapsed and ranks backwards, as one can on a
    sharp optimum), the first of the ranking was measured within ``rank_guard`` of the best."""
    from search.ranking import Ranking
    from search.storage import views
    space = FixtureSpace()
    strategy = Strategy(space, seed=0)
    study = _study(strategy)
    _completed(space, strategy, study, [({"NCCL_MIN_NCHANNELS": n}, v) for n, v in
                                        [(1, 850.0), (2, 1000.0), (4, 980.0), (8, 880.0), (16, 920.0)]])
    backwards = Ranking(strategy.ranking.dists, estimator=lambda dists, configs, values: [-v for v in values])
    ranked = [t.value for t in backwards.top(views(study), 5)]
    assert ranked[:3] == [920.0, 980.0, 1000.0]  # within 10% of 1000, by the (backwards) estimate
    assert sorted(ranked[3:]) == [850.0, 880.0]


def test_a_goodput_objective_is_pruned_on_goodput_and_not_on_tok_s_targets() -> None:
    """Levels report what the objective reads (req/s of goodput here): the tok/s target at 64 does
    not apply, and the relative rule names the unit."""
    from search.space import Objective

    class GoodputSpace(FixtureSpace):
        objective = Objective(metric="goodput", goodput_slos_ms={"ttft": 500})

    strategy = Strategy(GoodputSpace(), seed=0)
    study = _study(strategy)
    assert strategy.on_level(study, study.ask(), 0, 64, 2.5) is True  # 2.5 req/s: no 300 tok/s target here
    for value in (10.0, 11.0):
        done = study.ask()
        strategy.on_level(study, done, 0, 64, value)
        strategy.tell(study, done, "completed", objective=value)
    slow = study.ask()
    assert strategy.on_level(study, slow, 0, 64, 4.0) is False
    assert slow.user_attrs["pruned_because"] == "4.00 req/s, under 60% of the best 11.00 at 64"


def test_the_model_proposes_nothing_past_a_memory_fraction_that_ran_out() -> None:
    """Throughput climbs with the memory fraction up to an edge at 0.90 where graph capture runs
    out, at any cap or channel count. Fitted on working configs only, the model's expected gain is
    highest just past that edge; once a config of some choices ran out there, no model proposal of
    those choices asks as much memory again, whatever its cap or channels."""
    space, strategy, study = _started()
    oom = _oom(SEED_OOM_ADVICE)
    for _ in range(60):
        trial, config = strategy.ask(study)
        if config["--mem-fraction-static"] > 0.90 + 1e-9:
            strategy.tell(study, trial, "crashed", failure=oom)
            continue
        memory = 1.0 + 4 * (config["--mem-fraction-static"] - 0.80)
        for step, concurrency in enumerate(LADDER):
            running = min(concurrency, config["--max-running-requests"])
            strategy.on_level(study, trial, step, concurrency, 3000.0 * memory * running / (running + 300))
        strategy.tell(study, trial, "completed", objective=3000.0 * memory)
    trials = [t for t in study.trials if "skipped" not in t.user_attrs]
    model = [t for t in trials if t.user_attrs.get("strategy") == "model"]
    assert model, "the model never proposed"
    choices = ("--disable-cuda-graph", "--moe-runner-backend")
    for t in model:
        if t.user_attrs.get("outcome") != "crashed":
            continue
        earlier = [e for e in trials if e.number < t.number and e.user_attrs.get("outcome") == "crashed"
                   and all(e.params.get(n) == t.params.get(n) for n in choices)
                   and e.params["--mem-fraction-static"] <= t.params["--mem-fraction-static"]
                   and e.params.get("--cuda-graph-max-bs-decode", 0) <= t.params.get("--cuda-graph-max-bs-decode", 0)]
        assert not earlier, f"model trial {t.number} asked more memory than crashed trial {earlier[0].number}"


MEM = "--mem-fraction-static"


def _edge_study(gain: float, settings: Settings = DEFAULT, n_trials: int = 24) -> list[tuple[str, float, bool]]:
    """(sweep pass, memory fraction, crashed) of each trial of a study where only the memory fraction
    matters: ``gain`` tok/s per 0.01 of it, and it runs out of memory in graph capture above 0.93."""
    _, strategy, study = _started(settings)
    seen = []
    for _ in range(n_trials):
        trial, config = strategy.ask(study)
        mem = config[MEM]
        if mem > 0.93 + 1e-9:
            strategy.tell(study, trial, "crashed", failure=_oom(SEED_OOM_ADVICE))
        else:
            strategy.tell(study, trial, "completed", objective=1000.0 + gain * round((mem - 0.80) * 100))
        seen.append((str(trial.user_attrs.get("sweep_pass")), mem, mem > 0.93 + 1e-9))
    return seen


def test_the_memory_fraction_is_bisected_up_to_its_edge_while_it_keeps_gaining() -> None:
    """Throughput grows with the memory fraction (more KV cache) up to an out-of-memory edge at 0.93.
    The sweep's grid finds the top end crashing (SGLang's first advice: a smaller fraction; not
    repaired) and the baseline's value winning over the bottom end; the edge source then halves the
    gap between the best value and the nearest crash until one step is left, so 0.93 runs right
    after the grid instead of whenever the sampler happens on it. Without a gain toward the crash
    there is nothing to bisect."""
    seen = _edge_study(gain=40.0)
    first = next(i for i, (p, _, _) in enumerate(seen) if p == "edge")
    assert seen[first - 1] == ("0", 0.95, True)  # right after the grid's crash, no repairs of it between
    assert [(mem, crashed) for p, mem, crashed in seen if p == "edge"] == [(0.91, False), (0.93, False), (0.94, True)]
    without = _edge_study(gain=40.0, settings=Settings(plan_off=("edge",)))
    assert seen.index(("edge", 0.93, False)) < min(i for i, (_, mem, c) in enumerate(without) if mem == 0.93 and not c)
    assert all(p != "edge" for p, _, _ in _edge_study(gain=0.0))


def test_a_sweep_skips_values_past_an_edge_or_past_a_loss_on_the_centres_line() -> None:
    """The centre's memory fraction of 0.88 beat 0.86 by 24%, and 0.95 ran out of memory (SGLang's
    first fix: a smaller fraction). The first pass's grid (0.80, 0.875, 0.95) leaves out the crash
    (the edge source closes in on it); the second pass's neighbour below the centre (0.84) lies past
    the loss, so only the one above (0.92) is tried. ``skip_past=False`` tries them all."""
    from search.plan import History

    def values(settings: Settings, sweep_pass: int) -> list[object]:
        strategy = Strategy(FixtureSpace(), seed=0, settings=settings)
        study = _study(strategy)
        for change, value in (({}, 1000.0), ({MEM: 0.86}, 760.0), ({MEM: 0.95}, None)):
            study.enqueue_trial({**FixtureSpace.baseline, **change},
                                user_attrs={Attr.PLAN: Plan.SWEEP, Attr.SWEEP_PARAM: MEM, Attr.SWEEP_PASS: 0,
                                            Attr.SWEEP_FROM_WORKING: True, Attr.CENTRE_SCORE: 1000.0})
            trial = study.ask()
            FixtureSpace().suggest(trial)
            if value is None:
                strategy.tell(study, trial, "crashed", failure=_oom(SEED_OOM_ADVICE))
            else:
                strategy.tell(study, trial, "completed", objective=value)
        h: History = strategy.history(study)
        return sweep_values(h, h.centre[0], MEM, sweep_pass)
    assert values(DEFAULT, 0) == [0.8]  # 0.875 is next to the centre's 0.88
    assert values(Settings(skip_past=False), 0) == [0.8, 0.95]
    assert values(DEFAULT, 1) == [0.92]
    assert values(Settings(skip_past=False), 1) == [0.84, 0.92]
