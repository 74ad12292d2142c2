"""Importing the packages must not start JAX's backend: XLA_FLAGS set after the imports (the
command-buffer default in `algos`, the arm's process-wide CPU options in
`benchmarks/sac_vs_ppo.py`) are read only when the backend starts. A jnp constant at module level
in `sim.quadrotor.controller` once started it, and brax SAC then ran the arm with XLA:CPU's fusion
emitters (minutes per epoch instead of seconds)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
sys.path.insert(0, "benchmarks")
import algos, deploy, firmware_export, hoverfly, hoverfly.cli, policies, sim, vla
import kernel_profile, residual_manipulator, sac_vs_ppo, sim_throughput, time_to_success
from jax._src import xla_bridge
started = sorted(xla_bridge._backends)
assert not started, f"importing the packages started JAX backends {started}"
"""


def _passes(probe: str) -> None:
    r = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_imports_do_not_start_the_jax_backend():
    _passes(PROBE)


LIGHT = """
import sys
import hoverfly.cli, sim
heavy = sorted({"mujoco.mjx", "warp", "torch"} & set(sys.modules))
assert not heavy, f"importing the CLI imported {heavy}"
"""


def test_the_cli_imports_neither_mjx_nor_torch():
    """The CLI parses configs and reports bad input before any command runs: mjx with MuJoCo
    Warp (~3 s) and torch load only when an arm env is built or a VLA command runs."""
    _passes(LIGHT)
