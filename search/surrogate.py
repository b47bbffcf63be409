"""What the measurements so far say about any config: a small Gaussian-process regression.

Each trial is measured once and throughput varies a few percent between runs, so the trial with
the highest measured value is often a lucky one (the winner's curse): after a night of trials near
the optimum, the top measurement is mostly noise. A Gaussian process with a noise term pools the
evidence of similar configs (the same backend, nearby caps); its posterior mean is the estimate to
rank measured configs by, and its mean and spread at an untried config say how promising it is
(`expected_improvement`). Optuna's `GPSampler` fits one internally but exposes no posterior and
proposes over the whole space; this one is numpy and scipy.

Model: log throughput, an RBF kernel with one length scale per parameter (a categorical's one-hot
columns share it; an inactive conditional parameter is its own column), a constant mean, signal
and noise variance fitted by maximum marginal likelihood.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

# Bounds of the fitted relative noise: measurements on real servers vary 1-10%.
NOISE_BOUNDS = (0.005, 0.1)
MIN_POINTS = 3  # fewer measurements than this: no model, the measurements stand as they are


def encode(dists: Mapping[str, BaseDistribution], config: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A config as features in [0, 1] and, per feature, the index of the parameter it belongs to."""
    values: list[float] = []
    groups: list[int] = []
    for index, (name, dist) in enumerate(dists.items()):
        present = name in config
        if isinstance(dist, CategoricalDistribution):
            values += [float(present and config[name] == c) for c in dist.choices]
            groups += [index] * len(dist.choices)
            continue
        assert isinstance(dist, (IntDistribution, FloatDistribution))
        to = math.log if dist.log else float
        span = to(dist.high) - to(dist.low) or 1.0
        values += [(to(config[name]) - to(dist.low)) / span if present else 0.0, float(not present)]
        groups += [index, index]
    return np.array(values), np.array(groups)


@dataclass
class Surrogate:
    """A fitted model of log throughput over configs."""

    dists: Mapping[str, BaseDistribution]
    x: np.ndarray
    groups: np.ndarray
    inverse_scales: np.ndarray  # 1 / length scale^2 per parameter
    signal: float
    noise: float
    alpha: np.ndarray  # (K + noise I)^-1 z
    chol: np.ndarray  # Cholesky factor of K + noise I
    mean: float
    scale: float

    def _cross(self, x: np.ndarray) -> np.ndarray:
        d = np.stack([((x[:, None, self.groups == g] - self.x[None, :, self.groups == g]) ** 2).sum(-1)
                      for g in range(len(self.inverse_scales))])
        return self.signal * np.exp(-0.5 * np.tensordot(self.inverse_scales, d, axes=1))

    def predict(self, configs: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation of log throughput at each config."""
        x = np.stack([encode(self.dists, c)[0] for c in configs])
        k = self._cross(x)
        mean = self.mean + self.scale * (k @ self.alpha)
        v = np.linalg.solve(self.chol, k.T)
        var = np.maximum(self.signal - (v * v).sum(0), 1e-12)
        return mean, self.scale * np.sqrt(var)

    def expected_improvement(self, configs: Sequence[Mapping[str, Any]], best: float) -> np.ndarray:
        """How much each config is expected to beat ``best`` (a log throughput) by, in log throughput:
        high where the mean is high or the model is unsure, so a proposal both exploits and explores."""
        mean, sd = self.predict(configs)
        from scipy.special import ndtr  # the standard normal's cdf; see `load`

        z = (mean - best) / sd
        gain: np.ndarray = (mean - best) * ndtr(z) + sd * np.exp(-z**2 / 2.0) / np.sqrt(2 * np.pi)
        return gain


def fit(dists: Mapping[str, BaseDistribution], configs: Sequence[Mapping[str, Any]],
        values: Sequence[float]) -> Surrogate | None:
    """The model of ``values`` (throughput, > 0) measured at ``configs``; None with too few."""
    if len(configs) < MIN_POINTS:
        return None
    from scipy.optimize import minimize  # see `load`
    encoded = [encode(dists, c) for c in configs]
    x = np.stack([e[0] for e in encoded])
    groups = encoded[0][1]
    y = np.log(np.asarray(values, dtype=float))
    mean, scale = float(y.mean()), float(y.std()) or 1.0
    z = (y - mean) / scale
    n_groups = int(groups.max()) + 1
    # Squared distances per parameter, so a length scale per parameter costs one weighted sum.
    per_group = np.stack([((x[:, None, groups == g] - x[None, :, groups == g]) ** 2).sum(-1)
                          for g in range(n_groups)])

    def parts(theta: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
        inverse = np.exp(-2.0 * theta[:n_groups])
        k = np.exp(theta[n_groups]) * np.exp(-0.5 * np.tensordot(inverse, per_group, axes=1))
        return inverse, float(np.exp(theta[n_groups + 1])), k

    def neg_log_likelihood(theta: np.ndarray) -> float:
        _, noise, k = parts(theta)
        try:
            chol = np.linalg.cholesky(k + (noise + 1e-9) * np.eye(len(z)))
        except np.linalg.LinAlgError:
            return 1e10
        alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
        return float(0.5 * z @ alpha + np.log(np.diag(chol)).sum())

    low_noise, high_noise = (2 * math.log(b / scale) for b in NOISE_BOUNDS)
    start = np.array([0.0] * n_groups + [0.0, (low_noise + high_noise) / 2])
    bounds = [(-3.0, 3.0)] * n_groups + [(-3.0, 3.0), (low_noise, high_noise)]
    theta = minimize(neg_log_likelihood, start, method="L-BFGS-B", bounds=bounds).x
    inverse, noise, k = parts(theta)
    chol = np.linalg.cholesky(k + (noise + 1e-9) * np.eye(len(z)))
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, z))
    return Surrogate(dists, x, groups, inverse, float(np.exp(theta[n_groups])), noise, alpha, chol, mean, scale)


def posterior_means(dists: Mapping[str, BaseDistribution], configs: Sequence[Mapping[str, Any]],
                    values: Sequence[float]) -> list[float]:
    """The model's estimate of each measured config's throughput (the measurements with too few)."""
    model = fit(dists, configs, values)
    if model is None:
        return [float(v) for v in values]
    return [float(math.exp(m)) for m in model.predict(configs)[0]]


def load() -> None:
    """Import the scipy parts the model uses now. They are imported where used, not with this
    module: `scipy.optimize` took ~1 s of CPU on a 2-core box, paid by every `search` command that
    ends before a model is fitted (bad input, an empty study); a study imports them before its
    first trial, so the import never stalls a load test's clock running beside a fit."""
    from scipy.optimize import minimize  # noqa: F401
    from scipy.special import ndtr  # noqa: F401
