"""Launch profiles: a space's fixed launch plus one config, as argv and environment.

The profile is what a host starts and what a user takes home (shell script, SGLang
`--config` YAML, JSON). Secrets are only ever named (`secret_env`), never written: the rules
for what counts as a secret live here, next to `render`, which refuses a space that would
write one.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from typing import Any

import yaml

from search.errors import BadInput
from search.shell_words import one_line, shell_word
from search.space import Problem, Space, is_flag

# Names that hold credentials, by how they end (HF_TOKEN, OPENAI_API_KEY, PGPASSWORD, --api-key,
# --ssl-keyfile-password): referenced from the controller's environment, never written. Counts,
# paths and units are not (--max-total-tokens, HF_TOKEN_PATH, --bucket-time-to-first-token,
# --kt-max-deferred-experts-per-token).
SECRET_NAME = re.compile(
    r"(PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIALS?|APIKEY|(^|_)(?<!FIRST_)(?<!PER_)(TOKEN|KEY))\Z", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """True for names that look like credentials (HF_TOKEN, OPENAI_API_KEY, --api-key, DB_PASSWORD)."""
    return bool(SECRET_NAME.search(name.lstrip("-").replace("-", "_")))


def secret_problems(space: Space) -> list[Problem]:
    """Where `space` would write a secret's value into a profile: check_space reports these, render refuses.

    A fixed flag named like a secret with a value, or a searched param (flag or env var) named like one."""
    out = [space._problem(f"launch.flags.{option}", "a secret value would be written into every rendered profile",
                          "pass it to SGLang through an env var listed in launch.secret_env")
           for option, value in space.launch.flags.items() if is_secret(option) and value not in (None, False)]
    for name in filter(is_secret, space.params):
        fix = ("a flag's value is on the command line, so keep secret flags out of the space" if is_flag(name) else
               f"export {name} in your environment and list it in launch.secret_env")
        out.append(space._problem(f"params.{name}", "a secret is never searched: its values would be written "
                                  "into every rendered profile and log", f"drop it from params and baseline; {fix}"))
    return out



@dataclass
class LaunchProfile:
    launcher: list[str]
    args: list[str]
    env: dict[str, str]
    secret_env: list[str]
    host: str
    port: int
    sglang_version: str

    @property
    def argv(self) -> list[str]:
        return [*self.launcher, *self.args]

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    def on_port(self, port: int) -> LaunchProfile:
        """This profile listening on ``port`` (its ``--port`` replaced or added): a host's own port, a slot's."""
        if port == self.port:
            return self
        args = list(self.args)
        if "--port" in args:
            args[args.index("--port") + 1] = str(port)
        else:
            args += ["--port", str(port)]
        return replace(self, args=args, port=port)

    def on_gpus(self, gpus: list[int]) -> LaunchProfile:
        """This profile confined to ``gpus`` (its ``CUDA_VISIBLE_DEVICES``): a slot of a host."""
        return replace(self, env={**self.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))})


def format_value(value: Any) -> str:
    """A value as SGLang's parser reads it back: floats in shortest round-trip form."""
    return repr(value) if isinstance(value, float) else str(value)


def flag_tokens(option: str, value: Any) -> list[str]:
    """argv for one flag: true -> present, false/None -> absent, list -> nargs values."""
    if value is None or value is False:
        return []
    if value is True:
        return [option]
    if isinstance(value, list):
        return [option, *map(format_value, value)]
    return [option, format_value(value)]


def env_value(value: Any) -> str | None:
    """An env param's string: None -> unset, bools as 1/0."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    return format_value(value)


def render(space: Space, config: dict[str, Any]) -> LaunchProfile:
    """The fixed launch plus the active params of `config`; inactive params are ignored."""
    if problems := secret_problems(space):
        raise BadInput(f"secret values are never written, so this space does not render: {problems[0]}")
    launch = space.launch
    args = [token for _, option, value in launch.options() for token in flag_tokens(option, value)]
    for option, value in launch.flags.items():
        args += flag_tokens(option, value)
    secrets = list(dict.fromkeys(launch.secret_env))
    env: dict[str, str] = {}
    for name, value in launch.env.items():
        if is_secret(name):
            secrets.append(name)  # check_space reports the written value; never pass it on
        else:
            env[name] = format_value(value)
    for name, value in space.active(config).items():
        if is_flag(name):
            args += flag_tokens(name, value)
        elif (text := env_value(value)) is not None:
            env[name] = text
    return LaunchProfile(
        launcher=list(launch.launcher), args=args, env=env, secret_env=list(dict.fromkeys(secrets)),
        host=launch.host, port=launch.port, sglang_version=space.sglang_version,
    )


def to_shell(profile: LaunchProfile) -> str:
    """A bash script that launches the profile; secrets pass through from the caller's env."""
    env = [shell_word(f"{k}={v}") for k, v in profile.env.items()]
    # ${NAME+"NAME=$NAME"}: passed only when set in the caller's shell, never written here.
    env += [f'${{{name}+"{name}=${{{name}}}"}}' for name in profile.secret_env]
    head = " ".join(["exec", "env", *env, *map(shell_word, profile.launcher)])
    lines = [head] + [" ".join(map(shell_word, group)) for group in _groups(profile.args)]
    secrets = f"# Read from your environment, never stored: {one_line(', '.join(profile.secret_env))}\n" if profile.secret_env else ""
    return (
        "#!/usr/bin/env bash\n"
        f"# SGLang {one_line(profile.sglang_version)} launch profile written by `search`.\n"
        f"{secrets}set -e\n" + " \\\n  ".join(lines) + "\n"
    )


def _groups(args: list[str]) -> list[list[str]]:
    """args split at each option: [["--tp-size", "8"], ["--trust-remote-code"], ...]."""
    groups: list[list[str]] = []
    for token in args:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


_INT = re.compile(r"-?\d+\Z")


def _yaml_scalar(token: str) -> Any:
    """Numbers as YAML numbers when str() gives the token back (SGLang str()s every value)."""
    if _INT.match(token):
        return int(token)
    try:
        number = float(token)
    except ValueError:
        return token
    return number if repr(number) == token else token


def to_sglang_config(profile: LaunchProfile) -> str:
    """SGLang `--config` YAML: dash-form keys, switches as true, lists as YAML lists.

    SGLang's ConfigArgumentMerger turns each key back into `--key value...`; deprecated
    switches (e.g. --disable-cuda-graph on 0.5.23) are refused there, so keep them out of spaces
    meant for export. The environment goes in the header comment, since YAML cannot carry it.
    """
    data: dict[str, Any] = {}
    for group in _groups(profile.args):
        key, values = group[0].removeprefix("--"), [_yaml_scalar(v) for v in group[1:]]
        data[key] = True if not values else values[0] if len(values) == 1 else values
    command = " ".join(["env", *(shell_word(f"{k}={v}") for k, v in profile.env.items()),
                        *map(shell_word, profile.launcher), "--config", "THIS_FILE.yaml"])
    header = f"# SGLang {one_line(profile.sglang_version)} server config written by `search`. Launch with:\n#   {command}\n"
    if profile.secret_env:
        header += f"# Read from your environment, never stored: {one_line(', '.join(profile.secret_env))}\n"
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def to_json(profile: LaunchProfile) -> str:
    return json.dumps(asdict(profile), indent=2) + "\n"


def from_json(text: str) -> LaunchProfile:
    try:
        data = json.loads(text)
        return LaunchProfile(**data)
    except (ValueError, TypeError) as exc:
        raise BadInput(f"not a launch profile JSON ({exc}); write one with `search space render --format json`") from None
