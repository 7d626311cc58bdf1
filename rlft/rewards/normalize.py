"""Reward shaping after scoring: whitening with running statistics (``reward.normalize``) and clipping
(``reward.clip``), as TRL's ``use_score_scaling``/``use_score_norm``/``score_clip``.

The statistics cover every scored reply of the run so far: each batch updates them first (Chan et
al.'s parallel combination of count, mean and sum of squared deviations, in float64), then the
batch is whitened with them, ``(r - mean) / (std + EPS)``, std the unbiased one. They are host
floats, saved in the checkpoint's JSON (Python writes a float exactly), so a resumed run continues
with the same numbers. Under data parallelism the rollout gathers every rank's scores before this
runs, so each rank updates the same statistics from the same batch, as one process would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

EPS = 1e-6


@dataclass
class RunningMoments:
    """Count, mean and sum of squared deviations (M2) of every value seen."""

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def std(self) -> float:
        """Unbiased std of the values seen (1.0 before there are two)."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 1.0

    def update(self, values: Tensor) -> None:
        """Fold in the finite entries of ``values`` (NaN: unscored, left out)."""
        v = values[values.isfinite()].double()
        n = float(v.numel())
        if n == 0:
            return
        mean_b = float(v.mean())
        m2_b = float(((v - mean_b) ** 2).sum())
        total = self.count + n
        delta = mean_b - self.mean
        self.mean += delta * n / total
        self.m2 += m2_b + delta * delta * self.count * n / total
        self.count = total

    def to_json(self) -> list[float]:
        return [self.count, self.mean, self.m2]

    @staticmethod
    def from_json(values: list[float]) -> RunningMoments:
        return RunningMoments(*(float(x) for x in values))


def shape_rewards(totals: Tensor, moments: RunningMoments, normalize: bool, clip: float) -> tuple[Tensor, int]:
    """``totals`` whitened (after updating ``moments`` with them) and clipped to [-clip, clip] (0: off);
    and how many scored entries the clip changed. NaN entries stay NaN."""
    out = totals
    if normalize:
        moments.update(totals)
        out = ((totals.double() - moments.mean) / (moments.std + EPS)).to(totals.dtype)
    clipped = 0
    if clip > 0:
        clipped = int((out.abs() > clip).sum())  # NaN compares False
        out = out.clamp(-clip, clip)  # NaN stays NaN
    return out, clipped
