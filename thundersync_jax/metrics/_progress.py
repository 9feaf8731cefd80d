"""A tqdm progress bar over training steps that shows reward and step time."""

from __future__ import annotations

import math
from typing import Any

from tqdm import tqdm  # plain bars: tqdm.auto needs ipywidgets inside notebooks


class StepProgress:
    """Progress over `total` steps; `update(metrics)` advances one step.

    The postfix shows the last step's `reward_mean` and `step_time_s` (when
    present in the metrics) and the running mean step time.
    """

    def __init__(self, total: int, desc: str = "train", disable: bool | None = False, **kw):
        if total < 0:
            raise ValueError(f"total={total} must be >= 0")
        self._bar = tqdm(total=total, desc=desc, disable=disable, unit="step", **kw)
        self._step_times: list[float] = []

    def update(self, metrics: dict[str, Any]) -> dict[str, str]:
        """Advances by one step; returns the postfix fields shown."""
        postfix: dict[str, str] = {}
        reward = metrics.get("reward_mean")
        if reward is not None and math.isfinite(float(reward)):
            postfix["reward"] = f"{float(reward):.3f}"
        step_time = metrics.get("step_time_s")
        if step_time is not None and math.isfinite(float(step_time)):
            self._step_times.append(float(step_time))
            postfix["step_s"] = f"{float(step_time):.2f}"
            postfix["mean_step_s"] = f"{sum(self._step_times) / len(self._step_times):.2f}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(1)
        return postfix

    @property
    def n(self) -> int:
        """Steps completed so far."""
        return self._bar.n

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
