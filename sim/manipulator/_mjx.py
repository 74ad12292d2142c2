"""`mujoco.mjx`, imported on first use with its optional-backend notices sent to stderr, and
`put_scene`.

Importing mjx without NVIDIA Warp installed prints "Failed to import warp" to stdout, which would
break the CLI's one-JSON-object `--json` output; everything in the project imports mjx from here.
`from sim.manipulator._mjx import mjx` imports it then; modules that only need it when an env is
built or stepped read `_mjx.mjx` there, so importing `sim` (and the `hoverfly` CLI, which only
parses configs before it fails on bad input) does not pay the ~3 s of mjx and MuJoCo Warp.
"""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import jax
import mujoco

if TYPE_CHECKING:
    from mujoco import mjx

    from sim.manipulator.model import SceneConfig


def __getattr__(name: str):
    if name != "mjx":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with contextlib.redirect_stdout(sys.stderr):
        from mujoco import mjx
    globals()["mjx"] = mjx
    return mjx


def put_scene(m: mujoco.MjModel, scene: SceneConfig) -> tuple[mjx.Model, mjx.Data]:
    """The MJX model and a blank data of `scene.impl`.

    Warp: one contact pool of `warp_envs` × `warp_contacts` slots serves the whole vmapped
    batch (its leaves carry no batch axis, see `sim.wrappers.batch_where`); each env gets
    constraint rows for `warp_contacts` pyramidal contacts plus its limits and equalities.
    `ValueError` if warp-lang is missing or `warp_envs` is unset."""
    from sim.manipulator._mjx import mjx

    if scene.impl == "jax":
        return mjx.put_model(m), mjx.make_data(m)
    if scene.warp_envs is None or scene.warp_envs < 1:
        raise ValueError(
            f"scene.warp_envs is {scene.warp_envs}: Warp needs the most envs stepped as one batch"
        )
    try:
        import warp
    except ImportError:
        raise ValueError(
            'scene.impl "warp" needs NVIDIA Warp: pip install "hoverfly[warp]"'
        ) from None
    warp.config.log_level = warp.LOG_WARNING  # else a banner and a line per kernel module
    # rows per pyramidal contact, then a bound on the limit and equality rows
    per_contact = max(1, 2 * (int(m.geom_condim.max()) - 1))
    rows = scene.warp_contacts * per_contact + m.njnt + m.ntendon + 6 * m.neq
    with contextlib.redirect_stdout(sys.stderr):
        model = mjx.put_model(m, impl="warp")
        data = mjx.make_data(
            m, impl="warp", naconmax=scene.warp_envs * scene.warp_contacts, njmax=rows
        )
    # No kernel printf when the solver stops at its iteration limit, as it does by design; pool
    # overflows are still reported.
    opt = model.opt._impl.replace(warn_overflow=model.opt._impl.warn_overflow & ~_ITERATION_LIMITS)
    return model.replace(opt=model.opt.replace(_impl=opt)), data


_ITERATION_LIMITS = 512 | 1024
"""MuJoCo Warp's `OverflowType.ITERATIONS | LS_ITERATIONS` bits: the solver stopped at its
iteration limit (by design, not an overflow)."""


def warp_overflow(data: mjx.Data) -> jax.Array:
    """[...] bool, per env of a Warp data: its contacts or constraint rows overflowed a buffer
    in the last step (they were dropped)."""
    return (data._impl.overflow & ~_ITERATION_LIMITS) != 0


__all__ = ["mjx", "put_scene", "warp_overflow"]
