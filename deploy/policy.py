"""A trained run's deterministic actor as plain arrays: the one source every exporter reads.

`load_policy(run_dir)` rebuilds the run from its folder (config.json + latest checkpoint) and
returns a `DensePolicy`: float32 weights, the observation normalizer, the action-history convention
and the metadata that lets another program drive the policy without our code. `forward` is the
numpy reference of what every artifact (ONNX, C) must compute; `record_rollouts` records the
observations a policy sees in closed loop (calibration and held-out parity sets) and
`closed_loop_eval` flies any host policy function in our simulator under the run's eval protocol."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from algos.evaluate import eval_steps, rollout, summarize
from algos.presets import TrainConfig
from algos.run_folder import Run, RunError, config_hash, load_run, make_env_and_network
from policies import make_policy
from sim.quadrotor.env import OBS_FIELDS
from sim.quadrotor.params import get_params

NORMALIZER_STD_FLOOR = 1e-3
NORMALIZER_CLIP = 10.0

# Frame and unit of each actor-observation field of the quadrotor env (sim/quadrotor/env.py).
_FIELD_DOC = {
    "position_error": ("world", "m", "position − target position"),
    "rotation_matrix": ("body→world", "1", "R(q), row-major"),
    "velocity_error": ("world", "m/s", "velocity − target velocity"),
    "angular_velocity": ("body", "rad/s", "gyro rates"),
}


@dataclasses.dataclass(frozen=True, eq=False)
class DensePolicy:
    """obs [.., obs_size] → action [.., 4] in [-1, 1]:

    x = clip((obs − obs_mean) / obs_std, ±obs_clip); x = act(x·W_i + b_i) for hidden layers;
    action = clip(x·W_last + b_last, −1, 1). The observation is `state_size` state values followed
    by the last `action_history` actions (most recent first, 4 each); a controller that keeps the
    history itself resets it to `hover_action` on every motor.
    """

    weights: tuple[np.ndarray, ...]
    """[in, out] float32 per layer."""
    biases: tuple[np.ndarray, ...]
    """[out] float32 per layer."""
    activation: str
    obs_mean: np.ndarray
    obs_std: np.ndarray
    """Normalizer σ, already floored at NORMALIZER_STD_FLOOR."""
    obs_clip: float
    state_size: int
    action_history: int
    hover_action: float
    metadata: dict[str, Any]
    """JSON-able description: observation layout, action mapping, rates, parameter set, hash."""

    @property
    def obs_size(self) -> int:
        return int(self.weights[0].shape[0])

    @property
    def action_size(self) -> int:
        return int(self.weights[-1].shape[1])

    @property
    def macs(self) -> int:
        return int(sum(w.size for w in self.weights))


ACTIVATIONS_NP: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    "silu": lambda x: x / (1 + np.exp(-x)),
}


def normalize_obs(policy: DensePolicy, obs: np.ndarray) -> np.ndarray:
    x = (np.asarray(obs, np.float32) - policy.obs_mean) / policy.obs_std
    return np.clip(x, -policy.obs_clip, policy.obs_clip)


def forward(policy: DensePolicy, obs: np.ndarray) -> np.ndarray:
    """The float32 numpy reference: obs [..., obs_size] → action [..., 4]."""
    x = normalize_obs(policy, obs)
    act = ACTIVATIONS_NP[policy.activation]
    for i, (w, b) in enumerate(zip(policy.weights, policy.biases, strict=True)):
        x = x @ w + b
        if i < len(policy.weights) - 1:
            x = act(x)
    return np.clip(x, -1.0, 1.0).astype(np.float32)


def load_policy(run_dir: Path) -> DensePolicy:
    """The deterministic actor of a run's latest checkpoint (RunError on a bad run folder)."""
    return policy_from_run(load_run(Path(run_dir)))


def policy_from_run(run: Run) -> DensePolicy:
    cfg = run.config
    if cfg.algo == "sac":
        raise RunError(
            f"{run.path}: exporting {cfg.algo} runs is not supported yet (its actor ends in "
            "tanh, not a clip); export a PPO or APG run"
        )
    env_cfg = cfg.env
    net = cfg.learner.network
    dense = run.params["actor"]["params"]
    names = sorted(dense, key=lambda n: int(n.rsplit("_", 1)[1]))
    weights = tuple(np.asarray(dense[n]["kernel"], np.float32) for n in names)
    biases = tuple(np.asarray(dense[n]["bias"], np.float32) for n in names)
    norm = run.params["obs_norm"]
    std = np.maximum(np.sqrt(np.asarray(norm.var, np.float32)), np.float32(NORMALIZER_STD_FLOOR))
    nominal = get_params(env_cfg.params)
    hover_action = float(2.0 * nominal.hover_u - 1.0)
    state_size = sum(n for _, n in OBS_FIELDS)
    if weights[0].shape[0] != state_size + 4 * env_cfg.action_history:
        raise RunError(
            f"{run.path}: actor input {weights[0].shape[0]} does not match the observation "
            f"({state_size} state + {env_cfg.action_history}×4 history)"
        )
    layout, offset = [], 0
    for name, size in OBS_FIELDS:
        frame, units, meaning = _FIELD_DOC[name]
        layout.append(dict(name=name, offset=offset, size=size, frame=frame, units=units))
        layout[-1]["meaning"] = meaning
        offset += size
    layout.append(
        dict(
            name="action_history",
            offset=offset,
            size=4 * env_cfg.action_history,
            frame="motor",
            units="normalized command [-1, 1]",
            meaning=(
                f"the last {env_cfg.action_history} actions sent, most recent first, 4 motors "
                f"each; {hover_action:.6f} on every motor after a reset"
            ),
        )
    )
    metadata = {
        "task": cfg.task,
        "observation": layout,
        "action": {
            "size": 4,
            "motor_order": "M1 front-right, M2 back-right, M3 back-left, M4 front-left",
            "range": [-1.0, 1.0],
            "to_rpm": f"rpm = {float(nominal.rpm_max):g} * (action + 1) / 2",
            "rpm_max": float(nominal.rpm_max),
            "hover_action": hover_action,
        },
        "control_rate_hz": 1.0 / env_cfg.ctrl_dt,
        "action_history": env_cfg.action_history,
        "action_delay_steps": env_cfg.action_delay,
        "parameter_set": env_cfg.params,
        "config_hash": config_hash(cfg),
        "checkpoint_update": int(run.update),
        "activation": net.activation,
        "hidden": list(net.actor_hidden),
    }
    return DensePolicy(
        weights=weights,
        biases=biases,
        activation=net.activation,
        obs_mean=np.asarray(norm.mean, np.float32),
        obs_std=std.astype(np.float32),
        obs_clip=NORMALIZER_CLIP,
        state_size=state_size,
        action_history=env_cfg.action_history,
        hover_action=hover_action,
        metadata=metadata,
    )


def record_rollouts(run: Run, episodes: int, key: jax.Array) -> dict[str, np.ndarray]:
    """Flies the run's deterministic JAX policy for `episodes` eval-length episodes.

    Returns host arrays: `obs` [N, obs] and `action` [N, 4] of every alive step, and `episode_obs`
    [T, B, obs] (all steps, for replay through stateful controllers).
    """
    steps, _ = eval_steps(run.config.eval, run.env.dt)
    policy = make_policy(run.network, run.params, deterministic=True)
    traj = jax.jit(lambda k: rollout(run.env, policy, k, episodes, steps, record_obs=True))(key)
    traj = jax.device_get(traj)
    alive = traj["done"] == 0
    return {
        "obs": np.asarray(traj["obs"][alive], np.float32),
        "action": np.asarray(traj["action"][alive], np.float32),
        "episode_obs": np.asarray(traj["obs"], np.float32),
    }


def closed_loop_eval(
    run: Run,
    policy_fn: Callable[[np.ndarray], np.ndarray],
    episodes: int | None = None,
) -> dict[str, float]:
    """Flies a host policy (obs [B, obs] float32 → action [B, 4]) in the run's env under its
    eval protocol (same seed and episodes as `hoverfly eval`). Returns the eval summary.

    The rollout is compiled once per (config, episodes) and reused: the host function is looked
    up at call time, so exporting several variants of one run costs one compilation."""
    cfg = run.config
    n = cfg.eval.episodes if episodes is None else episodes
    _, settle = eval_steps(cfg.eval, run.env.dt)
    _HOST_POLICY[0] = policy_fn
    try:
        traj = _host_rollout(cfg, n)(jax.random.key(cfg.eval.seed))
    finally:
        _HOST_POLICY[0] = None
    return summarize(traj, settle, cfg.eval.tolerance)


_HOST_POLICY: list[Callable | None] = [None]


def _call_host_policy(obs: np.ndarray) -> np.ndarray:
    return np.asarray(_HOST_POLICY[0](np.asarray(obs, np.float32)), np.float32)


@functools.lru_cache(maxsize=4)
def _host_rollout(cfg: TrainConfig, episodes: int) -> Callable:
    env, _ = make_env_and_network(cfg)
    steps, _ = eval_steps(cfg.eval, env.dt)
    out = jax.ShapeDtypeStruct((episodes, env.action_size), jnp.float32)

    def policy(obs, key):
        return jax.pure_callback(_call_host_policy, out, obs), {}

    return jax.jit(lambda key: rollout(env, policy, key, episodes, steps))
