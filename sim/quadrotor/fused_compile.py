"""Compiles the fused rollout's Triton kernel with Triton's own compiler, without its coalesce pass.

XLA compiles a Pallas kernel's Triton IR with its own Triton, whose pass pipeline starts with
TritonGPU's *coalesce* pass. For every load and store it collects the connected slice of the
kernel around it (`multiRootGetSlice`, which takes the backward and forward slice of every op in
the slice again): quadratic in the kernel's size per memory op. The fused rollout has ~280
memory ops before, inside and after one loop of ~20 k ops, so the pass alone ran for over 8
minutes and was never seen to finish (README, "Fused rollout"). Without it the whole pipeline to
PTX takes ~12 s on two CPU cores.

Coalesce only picks the layout of each load and store (how many contiguous elements a thread
moves); the layouts the kernel starts with are already valid, and for the fused kernel's
`[block]` rows (one env per thread, consecutive envs in consecutive threads) they are the
coalesced ones. Pallas (jax 0.10 and 0.11) lowers a kernel to a `__gpu$xla.gpu.triton` custom call
that XLA compiles; `install()` wraps Pallas' GPU lowering rule so that the call of a kernel named
`NAME` is rewritten, at lowering time, into jaxlib's `triton_kernel_call_ffi` (the launcher
jax-triton uses) with PTX from `compile_to_ptx`: the `triton` package's NVIDIA pipeline with the
coalesce pass left out. Every other kernel is left to XLA. The `triton` package (the one PyTorch's
CUDA wheels bring) must be importable on the GPU host.
"""

from __future__ import annotations

import os
import tempfile
import threading
import zlib

NAME = "fused_quadrotor_rollout"
_lock = threading.Lock()


def _as_text(module: bytes) -> str:
    """jaxlib's Triton bytecode as MLIR text (the `triton` package may read another bytecode
    version)."""
    from jax._src.lib import triton as jt
    from jax._src.lib.mlir import ir

    ctx = ir.Context()
    jt.dialect.register_dialect(ctx)
    with ctx:
        return ir.Module.parse(module).operation.get_asm(enable_debug_info=False)


def compile_to_ptx(
    module: bytes, capability: int, num_warps: int, num_ctas: int = 1, num_stages: int = 1
) -> tuple[str, int]:
    """(PTX, shared memory bytes) of a Triton IR module (jaxlib bytecode) for an NVIDIA GPU of
    compute `capability` (e.g. 90), through the `triton` package's pipeline without the
    coalesce pass. Needs no GPU."""
    from triton._C.libtriton import ir, passes
    from triton.backends.compiler import GPUTarget, Language
    from triton.backends.nvidia.compiler import CUDABackend

    backend = CUDABackend(GPUTarget("cuda", capability, 32))
    options = backend.parse_options(
        {"num_warps": num_warps, "num_ctas": num_ctas, "num_stages": num_stages}
    )
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend.load_dialects(ctx)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ttir")
        with open(path, "w") as f:
            f.write(_as_text(module))
        mod = ir.parse_mlir_module(path, ctx)
    mod.context = ctx
    stages: dict = {}
    backend.add_stages(stages, options, Language.TRITON)
    metadata: dict = {}
    with _lock:  # the pass list is module state of the triton package
        coalesce = passes.ttgpuir.add_coalesce
        passes.ttgpuir.add_coalesce = lambda pm: None
        try:
            for stage in ("ttir", "ttgir", "llir", "ptx"):
                mod = stages[stage](mod, metadata)
        finally:
            passes.ttgpuir.add_coalesce = coalesce
    return mod, metadata["shared"]


def _capability() -> int:
    """Compute capability of the first CUDA device, e.g. 90 for an H100 or H200."""
    import jax

    return int(jax.devices("cuda")[0].compute_capability.replace(".", ""))


def _reroute(op, gpu_triton) -> None:
    """Turns Pallas' `__gpu$xla.gpu.triton` custom call `op` into a `triton_kernel_call_ffi`
    one running PTX from `compile_to_ptx` (the operands, results, layouts and aliases kept)."""
    from jax._src.lib.mlir import ir

    config = op.attributes["mhlo.backend_config"]
    num_warps, num_stages = config["num_warps"].value, config["num_stages"].value
    grid = [config[f"grid_{axis}"].value for axis in "xyz"]
    capability = _capability()
    ptx, smem = compile_to_ptx(config["ir"].value_bytes, capability, num_warps, 1, num_stages)
    kernel = gpu_triton.TritonKernel(NAME, num_warps, 1, smem, ptx, "", capability)
    params = [gpu_triton.create_array_parameter(0, 16)] * (len(op.operands) + len(op.results))
    call = gpu_triton.TritonKernelCall(kernel, *grid, params)
    opaque = zlib.compress(call.to_proto(NAME, b""))
    op.attributes["call_target_name"] = ir.StringAttr.get("triton_kernel_call_ffi")
    op.attributes["mhlo.backend_config"] = ir.DictAttr.get(
        {"name": ir.StringAttr.get(NAME), "opaque": ir.StringAttr.get(opaque)}
    )


def install() -> None:
    """Wraps Pallas' GPU lowering rule (once): the custom call of a kernel named `NAME` runs PTX
    from `compile_to_ptx` through jaxlib's Triton launcher, any other kernel is left to XLA.
    Raises RuntimeError naming what is missing: the `triton` package, or jaxlib's CUDA plugin
    (its Triton launcher)."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            "the fused rollout compiles through the `triton` package (pip install "
            "triton==3.6.0; PyTorch's CUDA wheels bring it): XLA's own Triton does not "
            "finish compiling the kernel"
        ) from e
    from jax._src.lib import gpu_triton

    if not hasattr(gpu_triton, "TritonKernelCall"):
        raise RuntimeError(
            "the fused rollout launches through jaxlib's Triton kernel call, which comes with "
            "its CUDA plugin (the `cuda` extra: jax[cuda13]); none is installed"
        )
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas.triton import core as triton_core
    from jax._src.pallas.triton import pallas_call_registration  # noqa: F401  (registers the rule)

    inner = pallas_core.get_lowering_rule(triton_core.CompilerParams, "gpu")
    if getattr(inner, "_hoverfly", False):
        return

    def rule(ctx, *in_nodes, **params):
        results = inner(ctx, *in_nodes, **params)
        op = results[0].owner
        if op.attributes["mhlo.backend_config"]["name"].value == NAME:
            _reroute(op, gpu_triton)
        return results

    rule._hoverfly = True
    pallas_core.register_lowering_rule(triton_core.CompilerParams, rule, "gpu")
