"""The fused rollout (`sim.quadrotor.fused`) against the XLA training stack it fuses.

On the CPU the kernel's code runs through XLA (`use_pallas=False`, one jitted call per step), and
its Pallas form is lowered to Triton IR for the GPU and compiled to PTX as on a GPU."""

from __future__ import annotations

import dataclasses
import sys
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltr

from policies.actor_critic import NetworkConfig, make_actor_critic, make_policy
from sim import ObservationSubset, make_env, wrap_for_training
from sim.quadrotor import QuadrotorConfig, fused_compile
from sim.quadrotor.fused import DenseActor, make_fused_rollout

B = 256


def _setup(task: str, config: QuadrotorConfig, randomized: bool, episode_length: int):
    kwargs = {} if randomized else {"randomization": None}
    env = wrap_for_training(
        ObservationSubset(make_env(task, config, **kwargs)), episode_length, batch_axis=-1
    )
    state = jax.jit(env.reset)(jax.random.split(jax.random.key(0), B))
    size = env.observation_size["state"][0]
    ac = make_actor_critic(NetworkConfig(), size, size, 4, float(env.default_action[0]))
    params = ac.init(jax.random.key(1))
    # larger weights: actions far from hover, so that some episodes terminate
    params["actor"] = jax.tree.map(lambda w: 3.0 * w, params["actor"])
    return env, state, ac, params


def _xla_rollout(env, ac, params, state, steps):
    policy = jax.vmap(make_policy(ac, params, True), in_axes=(-1, None), out_axes=-1)

    def body(carry, _):
        s, resets = carry
        s = env.step(s, policy(s.obs["state"], jax.random.key(0))[0])
        return (s, resets + s.done), None

    init = (state, jnp.zeros_like(state.done))
    return jax.jit(lambda c: jax.lax.scan(body, c, None, length=steps)[0])(init)


def _raw(tree):
    def raw(x):
        return jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x

    return jax.tree.leaves_with_path(jax.tree.map(raw, tree))


def test_fused_rollout_equals_the_training_stack():
    """Tracking (the phase draw), domain randomization, a 1-step action delay and 2 substeps."""
    steps, episode_length = 12, 7  # every env truncates once; some terminate first
    config = QuadrotorConfig(action_delay=1, substeps=2)
    env, state, ac, params = _setup("quadrotor-track", config, True, episode_length)
    ref, ref_resets = _xla_rollout(env, ac, params, state, steps)
    rollout = make_fused_rollout(env, steps, use_pallas=False)
    out, resets = rollout(state, DenseActor.from_params(params))

    np.testing.assert_array_equal(np.asarray(resets), np.asarray(ref_resets))
    assert float(jnp.sum(resets)) >= B  # resets ran (the reset branch is exercised)
    ref_leaves, out_leaves = _raw(ref), _raw(out)
    assert [p for p, _ in ref_leaves] == [p for p, _ in out_leaves]
    for (path, a), (_, b) in zip(ref_leaves, out_leaves, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, jax.tree_util.keystr(path)
        if a.dtype.kind in "iu":  # keys, counters: exact
            np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
        else:  # the actor's sums run in another order: rounding only
            np.testing.assert_allclose(
                b, a, rtol=2e-5, atol=2e-5, err_msg=jax.tree_util.keystr(path)
            )


def test_dense_actor_is_the_deterministic_policy():
    env, state, ac, params = _setup("quadrotor-hover", QuadrotorConfig(), True, 500)
    obs = state.obs["state"].T
    expected = make_policy(ac, params, True)(obs, jax.random.key(0))[0]
    got = DenseActor.from_params(params)(obs)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_fused_rollout_lowers_to_a_triton_kernel():
    env, state, ac, params = _setup("quadrotor-hover", QuadrotorConfig(), True, 500)
    rollout = make_fused_rollout(env, steps=100)
    lowered = jax.jit(rollout).trace(state, DenseActor.from_params(params))
    text = lowered.lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 1  # one kernel for the 100 steps
    assert "fused_quadrotor_rollout" in text


def _custom_calls(lowered) -> list:
    """The `stablehlo.custom_call` ops of a lowered program that carry a backend config."""
    calls = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for o in block.operations:
                    if o.operation.name == "stablehlo.custom_call":
                        calls.append(o)
                    walk(o.operation)

    walk(lowered.compiler_ir("stablehlo").operation)
    return [c for c in calls if "mhlo.backend_config" in c.attributes]


def _triton_module(lowered) -> bytes:
    """The Triton IR (jaxlib bytecode) of the one Pallas kernel in a program lowered for CUDA."""
    (call,) = _custom_calls(lowered)
    return call.attributes["mhlo.backend_config"]["ir"].value_bytes


@pytest.mark.slow
def test_fused_kernel_compiles_to_ptx_without_the_coalesce_pass():
    """The kernel's Triton IR through the `triton` package's pipeline without coalesce, to PTX
    for an H100/H200 (~15 s; XLA's Triton, with coalesce, did not finish in 8 min)."""
    pytest.importorskip("triton")
    env, state, ac, params = _setup("quadrotor-hover", QuadrotorConfig(), True, 500)
    lowered = jax.jit(make_fused_rollout(env, steps=10)).trace(
        state, DenseActor.from_params(params)
    )
    module = _triton_module(lowered.lower(lowering_platforms=("cuda",)))
    ptx, smem = fused_compile.compile_to_ptx(module, 90, num_warps=4)
    assert ".entry fused_quadrotor_rollout(" in ptx and ".target sm_90a" in ptx
    assert "wgmma.mma_async" in ptx  # the hidden layers on the tensor cores
    assert smem > 0


def _add_one(name: str):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1.0

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((128,), jnp.float32),
        name=name,
        compiler_params=pltr.CompilerParams(num_warps=4, num_stages=1),
    )


def test_install_routes_the_named_kernel_through_jaxlibs_triton_launcher(monkeypatch):
    """After `install()`, lowering for CUDA turns the call of a kernel named `NAME` into jaxlib's
    `triton_kernel_call_ffi` with the PTX of `compile_to_ptx` (here a small kernel of that name);
    other kernels stay XLA's Triton custom calls."""
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas.triton import core as triton_core
    from jax._src.pallas.triton import pallas_call_registration  # noqa: F401  (registers the rule)

    rules = pallas_core._backend_lowering_rules
    monkeypatch.setitem(rules, triton_core.CompilerParams, rules[triton_core.CompilerParams])
    monkeypatch.setattr(fused_compile, "_capability", lambda: 90)
    try:
        fused_compile.install()
    except RuntimeError as e:  # no `triton`, or no jaxlib CUDA plugin (it imports without a GPU)
        pytest.skip(str(e))
    fused_compile.install()  # once: a second call keeps the wrapped rule
    x = jnp.zeros((128,), jnp.float32)
    (call,) = _custom_calls(
        jax.jit(_add_one(fused_compile.NAME)).trace(x).lower(lowering_platforms=("cuda",))
    )
    assert call.attributes["call_target_name"].value == "triton_kernel_call_ffi"
    opaque = zlib.decompress(call.attributes["mhlo.backend_config"]["opaque"].value_bytes)
    assert b".entry fused_quadrotor_rollout(" in opaque and b".target sm_90a" in opaque
    (other,) = _custom_calls(
        jax.jit(_add_one("other")).trace(x).lower(lowering_platforms=("cuda",))
    )
    assert other.attributes["call_target_name"].value == "__gpu$xla.gpu.triton"


def test_install_names_what_it_lacks(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` fails
    with pytest.raises(RuntimeError, match="compiles through the `triton` package"):
        fused_compile.install()


def test_fused_rollout_refuses_other_stacks():
    quad = make_env("quadrotor-hover")
    with pytest.raises(ValueError, match="batch on the last axis"):
        make_fused_rollout(wrap_for_training(ObservationSubset(quad), 500), 10)
    with pytest.raises(ValueError, match="ObservationSubset"):
        make_fused_rollout(wrap_for_training(quad, 500, batch_axis=-1), 10)
    with pytest.raises(ValueError, match="steps"):
        make_fused_rollout(wrap_for_training(ObservationSubset(quad), 500, batch_axis=-1), 0)
    env, state, ac, params = _setup("quadrotor-hover", QuadrotorConfig(), True, 500)
    with pytest.raises(ValueError, match="multiple of block_size"):
        make_fused_rollout(env, 10, block_size=512)(state, DenseActor.from_params(params))
    small = dataclasses.replace(QuadrotorConfig(), action_history=2)
    other = wrap_for_training(ObservationSubset(make_env("quadrotor-hover", small)), 500, -1)
    with pytest.raises(ValueError, match="actor reads 50 observations, the env gives 26"):
        s = jax.jit(other.reset)(jax.random.split(jax.random.key(0), B))
        make_fused_rollout(other, 10)(s, DenseActor.from_params(params))
