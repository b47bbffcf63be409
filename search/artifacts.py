"""A trial's files: ``trials/<study>/<trial number>/``, everything needed to redo or debug it.

``command.sh``, ``config.yaml`` (for SGLang's ``--config``) and ``profile.json`` say what ran;
``server.log`` is the full log; ``phases.json`` says where the restart time went (weights,
autotune, graph capture), which users ask about first; ``loadtest.json``, ``answers.json`` and
``result.json`` follow. Secrets never reach these files: profiles only name them, and every
file is scrubbed of the secret values, the server log included (a server may echo its env).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from search.names import checked_study_name, checked_trials_dir
from search.profile import LaunchProfile, to_json, to_sglang_config, to_shell

REDACTED = "<redacted>"
_MIN_SECRET_LEN = 4  # shorter values ("1", "on") would redact ordinary text


class TrialArtifacts:
    """The directory of one trial; writes go through here so that they are all scrubbed."""

    def __init__(self, root: Path, secret_names: Iterable[str] = ()) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        values = (os.environ.get(name, "") for name in secret_names)
        self._secrets = sorted({v for v in values if len(v) >= _MIN_SECRET_LEN}, key=len, reverse=True)

    @classmethod
    def next_in(cls, trials_dir: Path, study: str, secret_names: Iterable[str] = ()) -> TrialArtifacts:
        """A fresh ``trials_dir/study/<n>`` for a trial run outside a study (n = last + 1)."""
        base = checked_trials_dir(trials_dir) / checked_study_name(study)
        taken = [int(p.name) for p in base.glob("*") if p.name.isdigit()] if base.is_dir() else []
        return cls(base / str(max(taken, default=-1) + 1), secret_names)

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    def _scrub(self, text: str) -> str:
        for value in self._secrets:
            text = text.replace(value, REDACTED)
        return text

    def write_text(self, name: str, text: str) -> Path:
        path = self.root / name
        path.write_text(self._scrub(text), encoding="utf-8")
        return path

    def write_json(self, name: str, data: Any) -> Path:
        return self.write_text(name, json.dumps(data, indent=2, sort_keys=False) + "\n")

    def write_profile(self, profile: LaunchProfile) -> None:
        """``command.sh`` (executable), ``config.yaml`` and ``profile.json``."""
        self.write_text("command.sh", to_shell(profile)).chmod(0o755)
        self.write_text("config.yaml", to_sglang_config(profile))
        self.write_text("profile.json", to_json(profile))

    def scrub_log(self) -> None:
        """Redact secret values from ``server.log`` once the server has stopped writing it."""
        if self._secrets and self.server_log.is_file():
            text = self.server_log.read_text(encoding="utf-8", errors="replace")
            if any(value in text for value in self._secrets):
                self.write_text(self.server_log.name, text)
