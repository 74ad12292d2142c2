"""Residual wrapper configuration: the residual-scale schedule and observation augmentation."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True)
class ResidualScale:
    """Bound on the correction, scheduled over training progress p ∈ [0, 1]:
    s(p) = start + (end − start)·min(p / ramp, 1) (ramp 0: s = end throughout)."""

    start: float = 0.3
    """Scale at progress 0 (|correction| ≤ start per motor command)."""
    end: float = 0.3
    """Scale from progress `ramp` on, and at evaluation (envs reset with progress 1)."""
    ramp: float = 0.0
    """Progress over which the scale moves from `start` to `end`."""

    def validate(self) -> None:
        if not (0 <= self.start <= 2 and 0 <= self.end <= 2):
            raise ValueError(f"residual scale must be in [0, 2], got {self.start}, {self.end}")
        if not 0 <= self.ramp <= 1:
            raise ValueError(f"residual scale ramp must be in [0, 1], got {self.ramp}")


@dataclasses.dataclass(frozen=True)
class ObsAugmentation:
    """Noise and dropout on named slices of the actor observation (the object-centric residual-RL
    recipe: object-pose noise and dropout), applied before the base and/or the residual sees them.

    Dropout holds the last delivered value of a field (a lost detection repeats the previous
    pose), one Bernoulli draw per field and step. The critic's privileged observation stays clean.
    """

    fields: tuple[str, ...] = ()
    """Names of the observation fields to corrupt (keys of the wrapper's layout)."""
    noise_std: float = 0.0
    """σ of the Gaussian noise added to those fields, in observation units (m for positions)."""
    dropout_prob: float = 0.0
    """Per-step probability that a field is not updated (its last delivered value is held)."""
    targets: tuple[Literal["base", "residual"], ...] = ("base", "residual")
    """Who sees the corrupted observation; the others see the env's observation."""

    def validate(self) -> None:
        if self.noise_std < 0 or not 0 <= self.dropout_prob <= 1:
            raise ValueError("augmentation noise_std must be ≥ 0 and dropout_prob in [0, 1]")
        bad = set(self.targets) - {"base", "residual"}
        if bad:
            raise ValueError(
                f"augmentation targets must be 'base' or 'residual', got {sorted(bad)}"
            )


VLA_BASES = ("vla", "vla_view")
"""The bases that `vla.residual` registers (a frozen VLA checkpoint as `base_run`)."""


@dataclasses.dataclass(frozen=True)
class ResidualConfig:
    """A residual run: the frozen base the learner corrects ("none": a plain run).

    Bases: "controller", the cascaded PID/geometric Crazyflie controller
    (`sim.quadrotor.controller`, quadrotor tasks); "scripted", the scripted pick-and-place policy
    (`sim.manipulator.scripted`, arm tasks with cartesian actions); "run", the deterministic actor
    of the trained run folder `base_run` (same task family and observation); "vla", the frozen
    VLA checkpoint `base_run` (built by the factory `vla.residual` registers: algos does not
    import vla, see `algos.residual.register_base`); "vla_view", the same VLA, and the residual
    sees what the VLA sees instead of the env observation (`vla.residual.make_vla_base`'s view).
    """

    base: Literal["none", "controller", "scripted", "run", "vla", "vla_view"] = "none"
    """Frozen base policy."""
    base_run: str = ""
    """Run folder of the base when base is "run"; VLA checkpoint folder when base is a VLA."""
    scale: ResidualScale = ResidualScale()
    augmentation: ObsAugmentation = ObsAugmentation()

    def validate(self) -> None:
        self.scale.validate()
        self.augmentation.validate()
        if (self.base == "run" or self.base in VLA_BASES) != bool(self.base_run):
            raise ValueError(
                'residual.base_run is needed exactly when residual.base is "run" or a VLA'
            )
