"""Videos of a run's deterministic policy (arm tasks), rendered by MuJoCo's renderer."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax

from algos.run_folder import RunError, load_run, make_run_policy, make_train_env


def render_run(
    run_dir: Path,
    out: Path,
    task: str | None = None,
    episodes: int = 1,
    camera: tuple[str, ...] = ("front",),
    seed: int = 0,
    height: int = 240,
    width: int = 320,
) -> dict[str, Any]:
    """Writes an mp4 of `episodes` episodes of the run's latest checkpoint on `task` (default: the
    run's own; another arm task with the same observation and action sizes also works), the
    cameras side by side. Returns {"video", "task", "episodes", "frames", "camera"}."""
    from sim.manipulator.render import policy_video

    run = load_run(run_dir)
    cfg = run.config
    if cfg.family != "arm":
        raise RunError(f"rendering needs an arm run; {run_dir} trained {cfg.task}")
    env = run.env
    if task is not None and task != cfg.task:
        try:
            env = make_train_env(dataclasses.replace(cfg, task=task))
        except ValueError as e:
            raise RunError(str(e)) from None
        if env.observation_size != run.env.observation_size or (
            env.action_size != run.env.action_size
        ):
            raise RunError(f"{task} does not have the observation and action sizes of {cfg.task}")
    if episodes < 1:
        raise RunError(f"episodes must be ≥ 1, got {episodes}")
    policy = make_run_policy(cfg.algo, run.network, run.params, deterministic=True)
    try:
        path = policy_video(
            env, policy, jax.random.key(seed), out, episodes, None, camera, height, width
        )
    except ValueError as e:  # unknown camera, odd image size
        raise RunError(str(e)) from None
    steps = env.unwrapped.config.episode_steps
    return {
        "video": str(path),
        "task": task or cfg.task,
        "episodes": episodes,
        "frames": episodes * (steps + 1),
        "camera": list(camera),
    }
