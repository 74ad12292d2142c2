"""Compiles the fused rollout's Triton kernel with Triton's own compiler, without its coalesce pass.

XLA compiles a Pallas kernel's Triton IR with the Triton inside jaxlib (`jax._src.lib.triton`'s
CUDA handler), whose pass pipeline starts with TritonGPU's *coalesce* pass. For every load and
store it collects the connected slice of the kernel around it (`multiRootGetSlice`, which takes
the backward and forward slice of every op in the slice again): quadratic in the kernel's size
per memory op. The fused rollout has ~280 memory ops before, inside and after one loop of
~20 k ops, so the pass alone ran for over 8 minutes and was never seen to finish (README,
"Fused rollout"). Without it the whole pipeline to PTX takes ~12 s on two CPU cores.

Coalesce only picks the layout of each load and store (how many contiguous elements a thread
moves); the layouts the kernel starts with are already valid, and for the fused kernel's
`[block]` rows (one env per thread, consecutive envs in consecutive threads) they are the
coalesced ones. So `install()` wraps the compile that Pallas calls: a kernel whose name is in
`NAMES` goes through the `triton` package's NVIDIA backend with the coalesce pass left out,
every other kernel to jaxlib's Triton unchanged. jaxlib then loads the PTX as it does its own.
The `triton` package (the one PyTorch's CUDA wheels bring) must be importable on the GPU host.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading

NAMES = (b"fused_quadrotor_rollout",)
_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class CompilationResult:
    """What jaxlib's Pallas lowering reads of a compiled kernel."""

    asm: str
    smem_bytes: int
    hsaco_path: str = ""
    cluster_dim_x: int = 1
    cluster_dim_y: int = 1
    cluster_dim_z: int = 1


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


def install() -> None:
    """Wraps the Triton compile that Pallas calls (`jax._src.lib.triton.compile`, once): a
    CUDA kernel named in `NAMES` goes through `compile_to_ptx`, any other to jaxlib. Raises
    RuntimeError naming what is missing: the `triton` package, or that compile in jaxlib."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            "the fused rollout compiles through the `triton` package (pip install "
            "triton==3.6.0; PyTorch's CUDA wheels bring it): jaxlib's own Triton does not "
            "finish compiling the kernel"
        ) from e
    from jax._src.lib import triton as jt

    inner = getattr(jt, "compile", None)
    if inner is None:
        raise RuntimeError("this jaxlib has no jax._src.lib.triton.compile to route the kernel")
    if getattr(inner, "_hoverfly", False):
        return

    def compile(platform, module, arch_name, *, num_warps, num_ctas, num_stages):
        if platform.upper() != "CUDA" or not any(name in module for name in NAMES):
            return inner(
                platform,
                module,
                arch_name,
                num_warps=num_warps,
                num_ctas=num_ctas,
                num_stages=num_stages,
            )
        capability = int(arch_name.replace(".", ""))
        ptx, smem = compile_to_ptx(module, capability, num_warps, num_ctas, num_stages)
        return CompilationResult(asm=ptx, smem_bytes=smem)

    compile._hoverfly = True
    jt.compile = compile


def require_gpu_path() -> None:
    """`install()` where Pallas will call it: jaxlib ≤ 0.10.2 hands the kernel's IR to XLA's own
    Triton instead (a custom call compiled by XLA), which this cannot route."""
    from jax._src.lib import version as jaxlib_version

    if jaxlib_version <= (0, 10, 2):
        raise RuntimeError(
            f"the fused rollout needs jaxlib > 0.10.2 on the GPU (found {jaxlib_version}): older "
            "ones compile Pallas kernels inside XLA, whose Triton does not finish this one"
        )
    install()
