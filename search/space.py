"""Space files: what to launch, what to search, how to judge it.

A space is YAML validated here by pydantic (structure), then by `search.space_check` against
an SGLang flag manifest (meaning), so a night is never spent on a flag the target rejects.
Every problem becomes one `Problem` line: file, key, what is wrong, what is allowed.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import optuna
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from search.errors import BadInput
from search.grid import reachable_highs
from search.manifests import DEFAULT_VERSION
from search.yaml_keys import duplicate_keys

Scalar = StrictBool | StrictInt | StrictFloat | StrictStr
Choice = Scalar | None
FlagValue = Scalar | list[StrictInt | StrictFloat | StrictStr] | None

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
PHASE_TIMEOUTS: dict[str, float] = {
    "starting": 300.0,
    "loading": 1800.0,
    "kv_cache": 600.0,
    "autotune": 900.0,
    "cuda_graph": 900.0,
    "warmup": 600.0,
}
DEFAULT_LAUNCHER = ("python3", "-m", "sglang.launch_server")


def is_flag(name: str) -> bool:
    """Param and fixed names starting with `--` are SGLang flags; the rest are env vars."""
    return name.startswith("--")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Condition = dict[str, Choice | list[Choice]]


class _Param(_Model):
    when: Condition = Field(default_factory=dict, description="param -> value or list of values")


class IntParam(_Param):
    type: Literal["int"]
    low: StrictInt
    high: StrictInt
    step: PositiveInt = 1
    log: StrictBool = False

    @model_validator(mode="after")
    def _range(self) -> IntParam:
        _check_range(self.low, self.high, self.step, self.log)
        return self

    def contains(self, value: Any) -> bool:
        return _is_int(value) and self.low <= value <= self.high and (value - self.low) % self.step == 0

    def allowed(self) -> str:
        return f"int {self.low}..{self.high}" + (f" step {self.step}" if self.step != 1 else "")

    def distribution(self) -> optuna.distributions.BaseDistribution:
        return optuna.distributions.IntDistribution(self.low, self.high, log=self.log, step=self.step)


class FloatParam(_Param):
    type: Literal["float"]
    low: StrictFloat | StrictInt
    high: StrictFloat | StrictInt
    step: PositiveFloat | None = None
    log: StrictBool = False

    @model_validator(mode="after")
    def _range(self) -> FloatParam:
        _check_range(self.low, self.high, self.step, self.log)
        return self

    def contains(self, value: Any) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return False
        if not self.low - 1e-12 <= value <= self.high + 1e-12:
            return False
        if self.step is None:
            return True
        k = (value - self.low) / self.step
        return abs(k - round(k)) < 1e-6

    def allowed(self) -> str:
        return f"float {self.low}..{self.high}" + (f" step {self.step}" if self.step else "")

    def distribution(self) -> optuna.distributions.BaseDistribution:
        return optuna.distributions.FloatDistribution(self.low, self.high, log=self.log, step=self.step)

    def clean(self, value: float) -> float:
        """Snap to the step's decimals so 0.8500000000000001 renders and compares as 0.85."""
        if self.step is None:
            return value
        decimals = max(0, -math.floor(math.log10(self.step)) + 3)
        return round(value, decimals)


class CategoricalParam(_Param):
    type: Literal["categorical"]
    choices: Annotated[list[Choice], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique(self) -> CategoricalParam:
        seen = [repr(c) for c in self.choices]
        if len(set(seen)) != len(seen):
            raise ValueError(f"choices repeat a value: {self.choices}")
        return self

    def contains(self, value: Any) -> bool:
        return any(value == c and type(value) is type(c) for c in self.choices) or (
            _is_int(value) and any(isinstance(c, float) and c == value for c in self.choices)
        )

    def allowed(self) -> str:
        return ", ".join("null (flag omitted)" if c is None else str(c) for c in self.choices)

    def distribution(self) -> optuna.distributions.BaseDistribution:
        return optuna.distributions.CategoricalDistribution(self.choices)


class BoolParam(_Param):
    type: Literal["bool"]

    def contains(self, value: Any) -> bool:
        return isinstance(value, bool)

    def allowed(self) -> str:
        return "true, false"

    def distribution(self) -> optuna.distributions.BaseDistribution:
        return optuna.distributions.CategoricalDistribution([False, True])


Param = Annotated[IntParam | FloatParam | CategoricalParam | BoolParam, Field(discriminator="type")]


class Launch(_Model):
    """The fixed part of the launch: everything the search does not change."""

    launcher: Annotated[list[StrictStr], Field(min_length=1)] = list(DEFAULT_LAUNCHER)
    model: StrictStr
    tp: PositiveInt | None = 1  # null: the layout is searched (a `--tp-size` param) or left to SGLang
    quantization: StrictStr | None = None
    host: StrictStr = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 30000
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[str, StrictStr | StrictInt | StrictFloat] = Field(default_factory=dict)
    secret_env: list[StrictStr] = Field(default_factory=lambda: ["HF_TOKEN"])

    def options(self) -> list[tuple[str, str, Any]]:
        """(key, SGLang option, value) of each fixed field that renders as a flag, in argv order."""
        fields = [("launch.model", "--model-path", self.model), ("launch.tp", "--tp-size", self.tp),
                  ("launch.quantization", "--quantization", self.quantization),
                  ("launch.host", "--host", self.host), ("launch.port", "--port", self.port)]
        return [field for field in fields if field[2] is not None]


class LoadTest(_Model):
    """One level per concurrency of the ladder, each for `duration_s` seconds or `requests` requests.

    ``request_rates`` makes the levels open-loop instead: requests sent at that many per second
    (Poisson arrivals, or gamma with ``burstiness`` below 1 for bursts), whatever the server's speed,
    so queueing shows in TTFT as it does under real traffic.
    """

    api: Literal["completions", "chat", "generate"] = "completions"
    input_len: PositiveInt = 1024
    output_len: PositiveInt = 1024
    concurrency: Annotated[list[PositiveInt], Field(min_length=1)] = [64, 256, 512, 1024]
    duration_s: PositiveFloat | None = None
    requests: PositiveInt | None = None
    warmup_s: Annotated[float, Field(ge=0)] = 10.0
    # Client processes the streams run in; null: one, more for a level where it used a whole core.
    workers: PositiveInt | None = None
    request_rates: list[PositiveFloat] = Field(default_factory=list)
    burstiness: PositiveFloat = 1.0

    @model_validator(mode="after")
    def _per_level(self) -> LoadTest:
        if self.duration_s is not None and self.requests is not None:
            raise ValueError("give duration_s or requests per level, not both")
        if self.duration_s is None and self.requests is None:
            object.__setattr__(self, "duration_s", 120.0)
        return self

    @field_validator("concurrency", "request_rates")
    @classmethod
    def _rising(cls, ladder: list[Any], info: ValidationInfo) -> list[Any]:
        if sorted(set(ladder)) != ladder:
            raise ValueError(f"{info.field_name} must rise strictly, got {ladder}")
        return ladder

    @model_validator(mode="after")
    def _rates_in_one_process(self) -> LoadTest:
        if self.request_rates and self.workers not in (None, 1):
            raise ValueError("request_rates levels run in one client process; drop workers")
        return self

    @property
    def levels(self) -> list[float]:
        """Where each level sits on the ladder (`search.loadtest.metrics.level_at`): rates, else concurrencies."""
        return [float(r) for r in self.request_rates] or [float(c) for c in self.concurrency]

    @property
    def level_name(self) -> str:
        """What the levels are: ``request rate`` or ``concurrency``."""
        return "request rate" if self.request_rates else "concurrency"

    @property
    def axis(self) -> str:
        """The levels' name and unit, for a chart's axis."""
        return f"{self.level_name} ({'req/s' if self.request_rates else 'requests'})"

    def level_text(self, at: float) -> str:
        """One level as people say it: ``4 req/s`` or ``concurrency 256``."""
        return f"{at:g} req/s" if self.request_rates else f"concurrency {at:g}"


class Workload(_Model):
    """The requests every level sends, as ``sglang.bench_serving``'s datasets (docs/loadtest.md).

    ``random``: ``load_test.input_len`` x ``output_len`` random tokens, each length drawn from
    [``range_ratio`` x len, len]; ``dataset``: a JSON/JSONL ``file`` (path relative to the space
    file) of ShareGPT conversations or one request a line; ``shared_prefix``: ``groups`` x
    ``prompts_per_group`` prompts, a group's ``system_prompt_len``-token system prompt then a
    ``question_len``-token question.
    """

    kind: Literal["random", "dataset", "shared_prefix"] = "random"
    range_ratio: Annotated[float, Field(gt=0, le=1)] = 1.0
    file: StrictStr | None = None
    groups: PositiveInt | None = None
    prompts_per_group: PositiveInt | None = None
    system_prompt_len: PositiveInt | None = None
    question_len: PositiveInt | None = None

    @model_validator(mode="after")
    def _keys_of_its_kind(self) -> Workload:
        prefix = ("groups", "prompts_per_group", "system_prompt_len", "question_len")
        wanted = {"random": (), "dataset": ("file",), "shared_prefix": prefix}[self.kind]
        if missing := [k for k in wanted if getattr(self, k) is None]:
            raise ValueError(f"a {self.kind} workload needs {', '.join(missing)}")
        if stray := [k for k in ("file", *prefix) if k not in wanted and getattr(self, k) is not None]:
            raise ValueError(f"{', '.join(stray)} do not apply to a {self.kind} workload")
        return self


GOODPUT = "goodput"
MAX_RATE = "max_rate_under_slo"
PER_GPU = "_per_gpu"


class Objective(_Model):
    """Default: the highest output tok/s over the ladder, among levels that meet the SLOs.

    ``goodput`` is bench_serving's: requests/s whose TTFT, TPOT and E2E each meet ``goodput_slos_ms``.
    ``max_rate_under_slo``: the highest request rate (of ``load_test.request_rates``, refined by a
    bisection inside the trial) whose p99 TTFT and ITL meet ``slos``, as vLLM's ``serve_sla``.
    ``output_throughput_per_gpu`` divides output tok/s by the GPUs the trial's layout takes
    (`search.layout`), so layouts of different sizes compare fairly; the ladder's pruner and
    ``targets`` then read per-GPU figures too.
    """

    metric: Literal["output_throughput", "output_throughput_per_gpu", "total_throughput", "request_throughput",
                    "goodput", "max_rate_under_slo"] = "output_throughput"
    over_levels: Literal["max"] = "max"
    require_slos: StrictBool = True
    goodput_slos_ms: dict[Literal["ttft", "tpot", "e2el"], PositiveFloat] | None = None

    @model_validator(mode="after")
    def _goodput_has_slos(self) -> Objective:
        if (self.metric == GOODPUT) != bool(self.goodput_slos_ms):
            raise ValueError("metric goodput needs goodput_slos_ms (e.g. {ttft: 2000, tpot: 50}), "
                             "and goodput_slos_ms applies only to it")
        return self

    @property
    def level_key(self) -> str:
        """The LevelResult field the objective reads (divided by the trial's GPUs when :attr:`per_gpu`)."""
        return {GOODPUT: "request_goodput", MAX_RATE: "request_rate"}.get(self.metric, self.metric.removesuffix(PER_GPU))

    @property
    def per_gpu(self) -> bool:
        """Whether a level's figure is divided by the GPUs the trial's layout takes."""
        return self.metric.endswith(PER_GPU)

    @property
    def unit(self) -> str:
        if self.metric in ("request_throughput", GOODPUT, MAX_RATE):
            return "req/s"
        return "tok/s/GPU" if self.per_gpu else "tok/s"

    def format(self, value: float) -> str:
        """A value with its unit: ``4,210 tok/s``, ``526 tok/s/GPU``, ``3.25 req/s``."""
        return f"{value:,.2f} req/s" if self.unit == "req/s" else f"{value:,.0f} {self.unit}"

    @property
    def name(self) -> str:
        """How views name it: ``goodput (ttft<=2000ms, tpot<=50ms)``, ``output throughput``."""
        given = self.goodput_slos_ms or {}
        slos = ", ".join(f"{k}<={given[k]:g}ms" for k in ("ttft", "tpot", "e2el") if k in given)
        return self.metric.replace("_", " ") + (f" ({slos})" if slos else "")


class Slos(_Model):
    p99_ttft_ms: PositiveFloat | None = None
    p99_itl_ms: PositiveFloat | None = None


Phase = Literal["starting", "loading", "kv_cache", "autotune", "cuda_graph", "warmup"]


class Space(_Model):
    sglang_version: StrictStr
    launch: Launch
    params: dict[str, Param] = Field(default_factory=dict)
    baseline: dict[str, Choice] | None = None
    load_test: LoadTest = Field(default_factory=LoadTest)
    workload: Workload = Field(default_factory=Workload)
    objective: Objective = Field(default_factory=Objective)
    slos: Slos = Field(default_factory=Slos)
    targets: dict[PositiveInt, PositiveFloat] = Field(default_factory=dict)
    timeouts: dict[Phase, PositiveFloat] = Field(default_factory=dict)

    _source: str = PrivateAttr(default="<space>")

    @model_validator(mode="after")
    def _fill_timeouts(self) -> Space:
        object.__setattr__(self, "timeouts", {**PHASE_TIMEOUTS, **self.timeouts})
        return self

    @model_validator(mode="after")
    def _rate_search_has_rates_and_slos(self) -> Space:
        if self.objective.metric == MAX_RATE and not (self.load_test.request_rates and
                                                      (self.slos.p99_ttft_ms or self.slos.p99_itl_ms)):
            raise ValueError("objective max_rate_under_slo needs load_test.request_rates and slos "
                             "(p99_ttft_ms and/or p99_itl_ms)")
        return self

    @property
    def source(self) -> str:
        """The file this space came from, for messages."""
        return self._source

    def dataset_path(self) -> Path | None:
        """The workload's dataset file, a relative path read from the space file's directory."""
        if self.workload.file is None:
            return None
        path = Path(self.workload.file).expanduser()
        return path if path.is_absolute() or self._source.startswith("<") else Path(self._source).parent / path

    def order(self) -> list[str]:
        """Param names with every condition's param before the params it gates (file order otherwise)."""
        done: list[str] = []
        pending = list(self.params)
        while pending:
            ready = [n for n in pending if all(d in done or d not in self.params or d == n for d in self.params[n].when)]
            if not ready:  # a cycle; check_space reports it, keep file order so sampling still ends
                ready = pending[:1]
            done.extend(ready)
            pending = [n for n in pending if n not in ready]
        return done

    def is_active(self, name: str, config: dict[str, Any]) -> bool:
        """Whether `name` applies given the other values (every `when` entry must hold)."""
        for other, wanted in self.params[name].when.items():
            if other not in config:
                return False
            options = wanted if isinstance(wanted, list) else [wanted]
            if not any(config[other] == o and isinstance(config[other], bool) == isinstance(o, bool) for o in options):
                return False
        return True

    def active(self, config: dict[str, Any]) -> dict[str, Any]:
        """`config` without the params whose conditions fail (and without unknown names)."""
        out: dict[str, Any] = {}
        for name in self.order():
            if name in config and self.is_active(name, {**out, **{k: v for k, v in config.items() if k not in self.params}}):
                out[name] = config[name]
        return out

    def suggest(self, trial: optuna.trial.BaseTrial) -> dict[str, Any]:
        """Sample a config; inactive params are not suggested and stay absent."""
        config: dict[str, Any] = {}
        for name in self.order():
            if not self.is_active(name, config):
                continue
            p = self.params[name]
            if isinstance(p, IntParam):
                config[name] = trial.suggest_int(name, p.low, p.high, step=p.step, log=p.log)
            elif isinstance(p, FloatParam):
                config[name] = p.clean(trial.suggest_float(name, p.low, p.high, step=p.step, log=p.log))
            elif isinstance(p, BoolParam):
                config[name] = trial.suggest_categorical(name, [False, True])
            else:
                config[name] = trial.suggest_categorical(name, p.choices)
        return config

    def clean(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """A config from stored Optuna params, floats snapped to their step as `suggest` returned them."""
        return {k: p.clean(v) if isinstance(p := self.params.get(k), FloatParam) else v for k, v in params.items()}

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """Optuna distributions by param name (for enqueueing and grids)."""
        return {name: p.distribution() for name, p in self.params.items()}

    def config_problems(self, config: dict[str, Any], key: str, *, complete: bool = True) -> list[Problem]:
        """What makes `config` not a point of this space (unknown names, values, conditions).

        `complete=False` accepts a partial config (params left at SGLang's defaults)."""
        out: list[Problem] = []
        for name, value in config.items():
            if name not in self.params:
                out.append(self._problem(f"{key}.{name}", "not a param of this space", ", ".join(self.params)))
            elif not self.params[name].contains(value):
                out.append(self._problem(f"{key}.{name}", f"{value!r} is outside the param", self.params[name].allowed()))
            elif not self.is_active(name, config):
                when = ", ".join(f"{k}={v}" for k, v in self.params[name].when.items())
                out.append(self._problem(f"{key}.{name}", "set although its condition fails", f"only when {when}"))
        for name in self.order() if complete else ():
            if name not in config and self.is_active(name, config):
                out.append(self._problem(f"{key}.{name}", "missing: the param applies here", self.params[name].allowed()))
        return out

    def _problem(self, key: str, message: str, allowed: str | None = None, warning: bool = False) -> Problem:
        return Problem(self.source, key, message, allowed, warning)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(low: float, high: float, step: float | None, log: bool) -> None:
    if low > high:
        _range_error(f"empty range: low {low} > high {high}", f"low <= high, e.g. low: {high}, high: {low}")
    if log and low <= 0:
        _range_error(f"log scale needs low > 0, got {low}", "low > 0, or log: false")
    if log and step not in (None, 1):
        _range_error("log scale cannot have a step", "no step with log: true, or log: false")
    if step is not None and step > high - low and low != high:
        _range_error(f"step {step} is wider than the range {low}..{high}", f"step <= {high - low} (high - low)")
    if step is not None and (ends := reachable_highs(low, high, step)):
        _range_error(f"step {step} from low {low} never reaches high {high}",
                     f"high: {ends[0]} (the nearest below) or {ends[1]}")


def _range_error(message: str, allowed: str) -> NoReturn:
    # A custom error carries the hint to `_pydantic_problem` (a ValueError could only carry the message).
    raise PydanticCustomError("bad_range", message, {"allowed": allowed})


@dataclass(frozen=True)
class Problem:
    """One line of a check: `file: key: message (allowed: ...)`."""

    file: str
    key: str
    message: str
    allowed: str | None = None
    warning: bool = False

    def __str__(self) -> str:
        tail = f" (allowed: {self.allowed})" if self.allowed else ""
        return f"{self.file}: {self.key}: {self.message}{tail}"


@dataclass
class CheckReport:
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if not p.warning]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.warning]

    @property
    def ok(self) -> bool:
        return not self.errors


class SpaceError(BadInput):
    """A space file that does not load; `problems` holds every line."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        more = f" (and {len(problems) - 1} more; run `search space check`)" if len(problems) > 1 else ""
        super().__init__(f"{problems[0]}{more}")


def load_space(path: str | Path) -> Space:
    """Read and validate a space file; SpaceError lists every structural problem."""
    return parse_space(read_space(path), str(path))


def read_space(path: str | Path) -> dict[str, Any]:
    """The YAML mapping of a space file; BadInput when it cannot be read, SpaceError when it is no mapping."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except OSError as exc:
        raise BadInput(f"cannot read space file {path}: {exc.strerror or exc}; "
                       "give the path of a spaces/*.yaml file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise SpaceError([Problem(str(path), "(yaml)", f"not valid YAML: {exc}".replace("\n", " "))]) from None
    if twice := duplicate_keys(text):
        raise SpaceError([Problem(str(path), dup.key, dup.message) for dup in twice])
    if not isinstance(data, dict):
        raise SpaceError([Problem(str(path), "(top)", "a space file is a mapping", ", ".join(Space.model_fields))])
    return data


def parse_space(data: dict[str, Any], source: str = "<space>") -> Space:
    """Validate a space given as data (tests, generated spaces)."""
    space, problems = salvage_space(data, source)
    if problems:
        raise SpaceError(problems)
    return space


# Keys a space cannot do without: after reporting their problem, these stand in so the rest is checked.
_STAND_INS: dict[tuple[str, ...], Any] = {
    ("sglang_version",): DEFAULT_VERSION, ("launch",): {"model": "MODEL"}, ("launch", "model"): "MODEL"}


def salvage_space(data: dict[str, Any], source: str = "<space>") -> tuple[Space, list[Problem]]:
    """The space with every entry that breaks the schema left out, and a problem for each.

    `space check` goes on to check what is left against the manifest, so one run reports every
    problem. What leans on a dropped entry goes too (the baseline when a param breaks, targets
    with the ladder, conditions on the param), so nothing is blamed on the gap. SpaceError when
    nothing can be left out (the file's structure itself)."""
    data = copy.deepcopy(data)
    problems: list[Problem] = []
    while True:
        try:
            space = Space.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors()
            problems += [_pydantic_problem(source, err) for err in errors]
            if not _drop_broken(data, [tuple(err["loc"]) for err in errors]):
                raise SpaceError(problems) from None
            continue  # validators that only run on valid parts may find more
        space._source = source
        return space, problems


def _drop_broken(data: dict[str, Any], locs: list[tuple[Any, ...]]) -> bool:
    """Leave out (or stand in for) the entry at each error location and what depends on it; changed?"""
    before = copy.deepcopy(data)
    for loc in locs:
        entry = _entry(loc)
        if not entry:
            continue
        parent: Any = data
        for part in entry[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            if entry in _STAND_INS:
                parent[entry[-1]] = copy.deepcopy(_STAND_INS[entry])
            else:
                parent.pop(entry[-1], None)
        if entry[0] in ("params", "baseline"):
            data.pop("baseline", None)
        if entry[0] == "params" and len(entry) == 2 and isinstance(data.get("params"), dict):
            for param in data["params"].values():
                if isinstance(param, dict) and isinstance(param.get("when"), dict):
                    param["when"].pop(entry[1], None)
        if entry in (("load_test",), ("load_test", "concurrency")):
            data.pop("targets", None)
    return data != before


def _entry(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The smallest entry an error location lies in: one param, flag or target, else the key."""
    if not loc:
        return ()
    if loc[0] == "launch" and loc[1:2] in (("flags",), ("env",)):
        return loc[:3]
    return loc[:2] if loc[0] in ("params", "baseline", "targets", "timeouts", "launch", "load_test", "objective",
                                 "slos", "workload") else loc[:1]


_TAGS = {"int", "float", "categorical", "bool"}


def _pydantic_problem(source: str, err: Any) -> Problem:
    loc = [str(part) for part in err["loc"]]
    # Drop the union tag and pydantic's type-branch names so keys read like the YAML.
    if len(loc) >= 3 and loc[0] == "params" and loc[2] in _TAGS:
        del loc[2]
    loc = [p for p in loc if not re.fullmatch(r"(str|int|float|bool|list\[.*\]|none|function-.*)", p)]
    key = ".".join(loc) or "(top)"
    msg = str(err["msg"]).removeprefix("Value error, ")
    ctx = err.get("ctx") or {}
    allowed = ctx.get("allowed")
    if err["type"] == "literal_error":
        msg, allowed = f"unknown value {err['input']!r}", str(ctx.get("expected"))
    elif err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        allowed = "int, float, categorical, bool"
        msg = ("missing or unknown param type" if err["type"] == "union_tag_not_found"
               else f"unknown param type {err['input'].get('type')!r}")
    elif err["type"] == "extra_forbidden":
        msg = "unknown key"
        allowed = _allowed_keys(err["loc"])
    elif err["type"] == "missing":
        msg = "required key missing"
    return Problem(source, key, msg, allowed)


_PARAM_MODELS: dict[str, type[BaseModel]] = {"int": IntParam, "float": FloatParam, "categorical": CategoricalParam,
                                             "bool": BoolParam}
_SECTION_MODELS: dict[str, type[BaseModel]] = {"launch": Launch, "load_test": LoadTest, "objective": Objective,
                                               "slos": Slos, "workload": Workload}


def _allowed_keys(loc: Iterable[Any]) -> str | None:
    """The keys the model around an unknown key accepts, found by walking the schema."""
    parts = list(loc)[:-1]
    model: type[BaseModel] = Space
    if parts[:1] == ["params"] and len(parts) >= 3 and parts[2] in _TAGS:
        model = _PARAM_MODELS[parts[2]]
    elif parts:
        sub = _SECTION_MODELS.get(str(parts[0]))
        if sub is None:
            return None
        model = sub
    return ", ".join(model.model_fields)
