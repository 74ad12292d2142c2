"""Residual RL as an env wrapper (STYLE.md §4): the learner's action is a bounded correction on top
of a frozen base policy, so PPO and SAC train it unchanged (Johannink et al., "Residual
Reinforcement Learning for Robot Control", ICRA 2019; Silver et al., "Residual Policy Learning",
2018).

    applied = clip(base(obs_b) + s(progress)·clip(residual, −1, 1), −1, 1)

The base runs inside the env step on the (optionally corrupted) observation and its carry (e.g. PID
integrators) lives in `state.info["base_state"]`, so the auto-reset wrapper resets it with the
episode. The actor observation is the residual's view of the env observation (or the base's own
view, `BasePolicy.observe`) with the base action appended (the common practice: the residual sees
what it corrects); the privileged critic observation gets the base action appended too.
`default_action` is zeros, so PPO's actor starts at "no correction" and the untrained wrapper
behaves as the base alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from algos.residual.config import ObsAugmentation, ResidualScale
from sim import Env, State, Wrapper

_NO_SCHEDULE = ResidualScale()
_NO_AUGMENTATION = ObsAugmentation()


def field_layout(fields: Sequence[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    """{name: (start, stop)} of consecutive observation fields, e.g. from
    `sim.quadrotor.OBS_FIELDS` (("position_error", 3), ...)."""
    layout, start = {}, 0
    for name, size in fields:
        layout[name] = (start, start + size)
        start += size
    return layout


def residual_scale(cfg: ResidualScale, progress: jax.Array) -> jax.Array:
    """s(p) = start + (end − start)·min(p / ramp, 1); `end` when ramp is 0. progress: [] or [B]."""
    if cfg.ramp == 0:
        return jnp.full_like(progress, cfg.end, dtype=jnp.float32)
    t = jnp.clip(progress / cfg.ramp, 0.0, 1.0)
    return cfg.start + (cfg.end - cfg.start) * t


class ResidualWrapper(Wrapper):
    """Unbatched env whose action [A] is the residual; wrap before `sim.wrap_for_training`.

    base: a base policy (`algos.residual.BasePolicy`, `sim.quadrotor.controller.Controller`, ...);
    one with `needs_state` also gets the wrapped env's State (after reset and after each step).
    scale: the residual-scale schedule. augmentation: observation corruption (needs `layout`).
    layout: {field name: (start, stop)} of the actor observation (see `field_layout`).

    info keys: "base_state" (the base's carry), "base_action" [A] (the base's command for the next
    step), "held_obs" [obs] (last delivered corrupted observation, for dropout), "inner_obs" (the
    wrapped env's observation dict). metrics: "residual/scale" [] and "residual/correction" []
    (mean |applied − base| of the last step).
    """

    def __init__(
        self,
        env: Env,
        base: Any,
        scale: ResidualScale = _NO_SCHEDULE,
        augmentation: ObsAugmentation = _NO_AUGMENTATION,
        layout: Mapping[str, tuple[int, int]] | None = None,
    ):
        super().__init__(env)
        scale.validate()
        augmentation.validate()
        self.base, self.scale, self.augmentation = base, scale, augmentation
        self._needs_state = bool(getattr(base, "needs_state", False))
        self._observe = getattr(base, "observe", None)
        self._view_size = getattr(base, "view_size", None) if self._observe else None
        n = env.observation_size["state"][0]
        want = getattr(base, "obs_size", None)
        if want is not None and want != n:
            raise ValueError(f"the base policy expects {want} observations, the env gives {n}")
        missing = sorted(set(augmentation.fields) - set(layout or {}))
        if missing:
            raise ValueError(f"augmentation fields {missing} are not in the observation layout")
        mask = jnp.zeros(n, bool)
        self._field_masks = []
        for name in augmentation.fields:
            start, stop = layout[name]
            if not 0 <= start < stop <= n:
                raise ValueError(f"observation field {name!r} {start}:{stop} is outside [0, {n})")
            self._field_masks.append(mask.at[start:stop].set(True))
        self._noise_mask = jnp.stack(self._field_masks).any(0) if self._field_masks else mask

    # -- observation corruption and the base -----------------------------------------------------
    def _corrupt(self, obs: jax.Array, held: jax.Array, key: jax.Array, first: bool) -> jax.Array:
        """Corrupted obs [obs]: Gaussian noise on the fields, then per-field dropout that repeats
        `held` (the last corrupted obs; not on an episode's first step: nothing to hold)."""
        aug = self.augmentation
        if not self._field_masks:
            return obs
        key_noise, key_drop = jax.random.split(key)
        noisy = obs + aug.noise_std * jax.random.normal(key_noise, obs.shape) * self._noise_mask
        if aug.dropout_prob > 0 and not first:
            drop = jax.random.bernoulli(key_drop, aug.dropout_prob, (len(self._field_masks),))
            held_mask = jnp.any(jnp.stack(self._field_masks) & drop[:, None], axis=0)
            noisy = jnp.where(held_mask, held, noisy)
        return noisy

    def _wrap(self, inner: State, carry: Any, held: jax.Array, first: bool) -> State:
        """Corrupts the new observation, runs the base on it, builds the wrapped state."""
        rng, key_aug = jax.random.split(inner.info["rng"])
        obs = inner.obs["state"]
        corrupted = self._corrupt(obs, held, key_aug, first)
        targets = self.augmentation.targets
        base_obs = corrupted if "base" in targets else obs
        if self._needs_state:
            base_action, carry = self.base.apply(base_obs, carry, inner)
        else:
            base_action, carry = self.base.apply(base_obs, carry)
        base_action = jnp.clip(base_action, -1.0, 1.0)
        if self._observe is not None:
            actor_obs = self._observe(base_obs, carry)
        else:
            actor_obs = corrupted if "residual" in targets else obs
        wrapped = {
            **inner.obs,
            "state": jnp.concatenate([actor_obs, base_action]),
            "privileged_state": jnp.concatenate([inner.obs["privileged_state"], base_action]),
        }
        info = {
            **inner.info,
            "rng": rng,
            "base_state": carry,
            "base_action": base_action,
            "held_obs": corrupted,
            "inner_obs": inner.obs,
        }
        return inner.replace(obs=wrapped, info=info)

    # -- contract -------------------------------------------------------------------------------
    def reset(self, rng: jax.Array) -> State:
        inner = self.env.reset(rng)
        z = jnp.zeros(())
        inner = inner.replace(
            metrics={**inner.metrics, "residual/scale": z, "residual/correction": z}
        )
        obs = inner.obs["state"]
        carry = self.base.init(inner) if self._needs_state else self.base.init()
        return self._wrap(inner, carry, jnp.zeros_like(obs), first=True)

    def _scale(self, state: State) -> jax.Array:
        return residual_scale(self.scale, state.info.get("progress", jnp.ones(())))

    def applied_action(self, state: State, action: jax.Array) -> jax.Array:
        """The command [A] that `step(state, action)` sends to the wrapped env."""
        s = self._scale(state)
        return jnp.clip(state.info["base_action"] + s * jnp.clip(action, -1.0, 1.0), -1.0, 1.0)

    def step(self, state: State, action: jax.Array) -> State:
        return self.step_command(state, self.applied_action(state, action))

    def step_command(self, state: State, command: jax.Array) -> State:
        """Sends `command` [A] to the wrapped env, as `step` does with `applied_action(state,
        action)`, or with another policy's command while it drives (the base keeps its carry,
        `state.info["base_state"]`, and plans for the next step)."""
        info = state.info
        inner = self.env.step(state.replace(obs=info["inner_obs"]), command)
        metrics = {
            **inner.metrics,
            "residual/scale": self._scale(state),
            "residual/correction": jnp.mean(jnp.abs(command - info["base_action"])),
        }
        inner = inner.replace(metrics=metrics)
        return self._wrap(inner, info["base_state"], info["held_obs"], first=False)

    @property
    def observation_size(self) -> dict[str, tuple[int, ...]]:
        sizes = dict(self.env.observation_size)
        a = self.env.action_size
        return {
            **sizes,
            "state": ((self._view_size or sizes["state"][0]) + a,),
            "privileged_state": (sizes["privileged_state"][0] + a,),
        }

    @property
    def default_action(self) -> jax.Array:
        """Zeros: no correction."""
        return jnp.zeros(self.env.action_size)
