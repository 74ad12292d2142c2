"""The `hoverfly` command: tyro subcommands, each a few lines calling `algos.runner`.

  hoverfly train TASK --out RUN [--algo apg|ppo|sac] [--preset cpu|gpu] [--seed 3] [--apg.horizon N]
  hoverfly eval RUN [--episodes N] [--json]
  hoverfly export RUN --format onnx [--precision fp32|fp16|int8|fp8] --out FILE [--force]
  hoverfly render RUN --out video.mp4 [--task arm-push] [--camera front wrist] [--episodes N]
  hoverfly firmware-export RUN --target stm32f405|host|crazyflie --precision f32|int8 --out DIR
  hoverfly deploy hil RUN --firmware DIR [--seconds S] [--json]
  hoverfly deploy crazyflie RUN --uri URI
  hoverfly vla collect --out DATA [--episodes N] [--image-size 96 96] [--seed S] [--expert RES_RUN]
  hoverfly vla sft --data DATA [DATA ...] --out RUN [--preset test|small|base] [--init CKPT]
  hoverfly vla rl SFT_RUN --out RUN [--algo ppo|grpo|rft] [--iterations N] [--sft-coef λ]
  hoverfly vla residual --checkpoint SFT_RUN --out RUN [--algo ppo|sac]   # frozen-VLA base

Every `TrainConfig` field is an option whose default is the chosen preset's value: the command
line is parsed once to learn the task, the preset and the algo (default: apg on the quadrotor,
ppo on the arms), then again with that preset (for that algo) as the default.
Bad input (unknown task, bad run folder) exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Annotated, Literal, Union

import tyro
from tyro.constructors import ConstructorRegistry, StructConstructorSpec, StructTypeInfo

from algos import PRESETS, TrainConfig, get_preset, runner
from algos.presets import ALGOS
from algos.residual import VLA_BASES
from algos.run_folder import RunError
from sim import TASKS
from vla.collect import CollectConfig
from vla.configuration_residual import VLAResidualConfig
from vla.configuration_rl import RLConfig
from vla.configuration_sft import SFTConfig

Preset = Literal[tuple(sorted(PRESETS))]  # type: ignore[valid-type]
ARM_SECTIONS = ("arm", "arm_randomization", "arm_perturbation")


@dataclasses.dataclass(frozen=True)
class Train:
    """Train a policy into a run folder; the same command again resumes it from its checkpoint."""

    task: Annotated[
        str,
        tyro.conf.Positional,
        tyro.conf.arg(metavar="TASK", help=f"Task: {', '.join(sorted(TASKS))}."),
    ]
    out: Path
    """Run folder (created, or resumed if it holds this config)."""
    preset: Preset = "cpu"
    """Hyperparameter preset that supplies every default below (cpu, or gpu for an H200)."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""
    config: Annotated[TrainConfig, tyro.conf.arg(name="")] = TrainConfig()


@dataclasses.dataclass(frozen=True)
class Eval:
    """Evaluate a run's latest checkpoint (deterministic policy, the run's EvalConfig protocol)."""

    run: tyro.conf.Positional[Path]
    """Run folder."""
    episodes: int | None = None
    """Episodes (default: the run's eval.episodes; only that count rewrites eval.json)."""
    json: bool = False
    """Print one JSON object on stdout and nothing else."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""


@dataclasses.dataclass(frozen=True)
class Export:
    """Export a run's deterministic policy to ONNX, checked for parity and closed-loop success."""

    run: tyro.conf.Positional[Path]
    """Run folder."""
    out: Path
    """Output file (.onnx), written only after the checks pass (a VLA run: an output folder)."""
    format: Literal["onnx"] = "onnx"
    """Artifact format."""
    precision: Literal["fp32", "fp16", "int8", "fp8"] = "fp32"
    """Numeric precision (int8: QDQ calibrated on recorded rollouts; fp8: E4M3FN)."""
    force: bool = False
    """Write the file even if its closed-loop success falls > 2 points below float."""
    episodes: int | None = None
    """Closed-loop eval episodes (default: the run's eval.episodes)."""
    json: bool = False
    """Print one JSON object on stdout and nothing else."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""


@dataclasses.dataclass(frozen=True)
class Render:
    """Render an mp4 of a run's deterministic policy (arm tasks) with MuJoCo's renderer."""

    run: tyro.conf.Positional[Path]
    """Run folder."""
    out: Path
    """Output video (.mp4), written atomically."""
    task: str | None = None
    """Task to render (default: the run's; another arm task with the same sizes also works)."""
    episodes: int = 1
    """Episodes, one after another."""
    camera: tuple[Literal["front", "wrist"], ...] = ("front",)
    """Cameras, side by side."""
    seed: int = 0
    """Key of the episodes' initial states."""
    height: int = 240
    """Image height, px (even)."""
    width: int = 320
    """Image width per camera, px (even)."""
    json: bool = False
    """Print one JSON object on stdout and nothing else."""


@dataclasses.dataclass(frozen=True)
class FirmwareExport:
    """Generate dependency-free C for a microcontroller (or a Crazyflie out-of-tree app)."""

    run: tyro.conf.Positional[Path]
    """Run folder."""
    out: Path
    """Output folder (created; an earlier export there is replaced)."""
    target: Literal["stm32f405", "host", "crazyflie"] = "stm32f405"
    """stm32f405: C + QEMU self-test and cost; host: C for the host; crazyflie: firmware app."""
    precision: Literal["f32", "int8"] = "f32"
    """Arithmetic of the generated policy."""
    json: bool = False
    """Print one JSON object on stdout and nothing else."""


@dataclasses.dataclass(frozen=True)
class Hil:
    """Fly the simulator in lock-step with the exported firmware running in QEMU over serial."""

    run: tyro.conf.Positional[Path]
    """Run folder."""
    firmware: Path
    """Folder written by `hoverfly firmware-export --target stm32f405`."""
    seconds: float = 5.0
    """Flight length, s."""
    episodes: int = 1
    """Episodes (those of `hoverfly eval`'s seed, in order)."""
    serial: Literal["pty", "tcp"] = "pty"
    """QEMU's UART: a pseudo-terminal, or loopback TCP."""
    json: bool = False
    """Print one JSON object on stdout and nothing else."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""


@dataclasses.dataclass(frozen=True)
class Crazyflie:
    """Fly a real Crazyflie running the app of `firmware-export --target crazyflie` (cflib)."""

    run: tyro.conf.Positional[Path]
    """Run folder."""
    uri: str
    """cflib link URI, e.g. radio://0/80/2M/E7E7E7E7E7 or udp://127.0.0.1:19850."""
    app: Path | None = None
    """The app folder flashed on the drone (checks its config hash; default: the run's)."""
    seconds: float = 10.0
    """Hover time, s, before landing."""
    height: float = 0.5
    """Hover height, m."""
    dry_run: bool = False
    """Connect and check the app's identity only: nothing is armed or sent."""
    json: bool = False
    """Print one JSON object on stdout and nothing else."""


@dataclasses.dataclass(frozen=True)
class Deploy:
    """Deploy a policy: hardware-in-the-loop under QEMU, or a real Crazyflie."""

    command: Annotated[
        Union[  # noqa: UP007
            Annotated[Hil, tyro.conf.subcommand("hil", prefix_name=False)],
            Annotated[Crazyflie, tyro.conf.subcommand("crazyflie", prefix_name=False)],
        ],
        tyro.conf.arg(name=""),
    ]


@dataclasses.dataclass(frozen=True)
class VlaCollect:
    """Record demonstrations of the scripted expert (or of a VLA residual run: --expert) with
    camera images and an instruction per episode (LeRobotDataset layout: parquet + mp4 + meta/)."""

    out: Path
    """Dataset folder (written atomically)."""
    config: Annotated[CollectConfig, tyro.conf.arg(name="")] = CollectConfig()
    overwrite: bool = False
    """Replace an existing dataset at `out`."""
    json: bool = False
    """Print one JSON object on stdout and nothing else."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""


@dataclasses.dataclass(frozen=True)
class VlaSft:
    """Behaviour cloning of the compact VLA (flow matching) on a dataset, then its closed-loop
    success in the simulator over --eval-episodes; an existing run at --out is resumed."""

    config: Annotated[SFTConfig, tyro.conf.arg(name="")]
    json: bool = False
    """Print one JSON object on stdout and nothing else."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""


@dataclasses.dataclass(frozen=True)
class VlaRl:
    """RL post-training of an SFT'd VLA on action chunks in the simulator (PPO with the value head,
    or GRPO; optional RL-Co anchor on held demonstrations); an existing run at --out is resumed."""

    init: Annotated[
        Path,
        tyro.conf.Positional,
        tyro.conf.arg(
            metavar="SFT_RUN", help="SFT run folder (its newest checkpoint) or checkpoint."
        ),
    ]
    config: Annotated[RLConfig, tyro.conf.arg(name="")] = RLConfig()
    json: bool = False
    """Print one JSON object on stdout and nothing else."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""


@dataclasses.dataclass(frozen=True)
class VlaResidual:
    """A PPO or SAC residual (object-centric inputs with pose noise and dropout) on a frozen VLA
    in arm pick-place, then the base alone vs base + residual over the same episodes; resumable."""

    config: Annotated[VLAResidualConfig, tyro.conf.arg(name="")]
    json: bool = False
    """Print one JSON object on stdout and nothing else."""
    cache_dir: Path | None = runner.default_cache_dir()
    """JAX persistent compilation cache ($HOVERFLY_CACHE_DIR overrides the default; None: off)."""


@dataclasses.dataclass(frozen=True)
class Vla:
    """Vision-language-action models: demonstrations, supervised fine-tuning, RL post-training."""

    command: Annotated[
        Union[  # noqa: UP007
            Annotated[VlaCollect, tyro.conf.subcommand("collect", prefix_name=False)],
            Annotated[VlaSft, tyro.conf.subcommand("sft", prefix_name=False)],
            Annotated[VlaRl, tyro.conf.subcommand("rl", prefix_name=False)],
            Annotated[VlaResidual, tyro.conf.subcommand("residual", prefix_name=False)],
        ],
        tyro.conf.arg(name=""),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cmd = parse(argv)
        if isinstance(cmd, Train):
            cfg = dataclasses.replace(cmd.config, task=cmd.task)
            result = runner.train(cfg, cmd.out, cache_dir=cmd.cache_dir)
            print(
                runner.format_summary(result.eval)
                if result.eval
                else f"stopped at update {result.update}/{result.total}"
            )
            return 0
        if isinstance(cmd, Eval | Export | Render):
            _register_residual_base(cmd.run)
        if isinstance(cmd, Eval):
            summary = runner.evaluate_run(cmd.run, episodes=cmd.episodes, cache_dir=cmd.cache_dir)
            print(json.dumps(summary) if cmd.json else runner.format_summary(summary))
            return 0
        cmd = cmd.command if isinstance(cmd, Deploy | Vla) else cmd
        report = _run_command(cmd)
        print(json.dumps(report) if cmd.json else _format_report(report))
        return 0
    except RunError as e:
        print(f"hoverfly: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hoverfly: interrupted", file=sys.stderr)
        return 130


def _run_command(cmd) -> dict:
    """Exporters and deployment live in floor 3; imported here so `train` stays light."""
    if isinstance(cmd, Export) and (
        any(
            (cmd.run / f).is_file()
            for f in ("model.safetensors", "sft_config.json", "rl_config.json")
        )
    ):
        return _export_vla(cmd)
    if isinstance(cmd, Export):
        from deploy.onnx_export import export_onnx

        return export_onnx(
            cmd.run, cmd.out, cmd.precision, cmd.force, cmd.episodes, cache_dir=cmd.cache_dir
        )
    if isinstance(cmd, Render):
        from algos.video import render_run

        return render_run(
            cmd.run,
            cmd.out,
            cmd.task,
            cmd.episodes,
            cmd.camera,
            cmd.seed,
            cmd.height,
            cmd.width,
        )
    if isinstance(cmd, FirmwareExport):
        if cmd.target == "crazyflie":
            from firmware_export.crazyflie import write_app

            return write_app(cmd.run, cmd.out, precision=cmd.precision)
        from firmware_export import export_firmware

        return export_firmware(cmd.run, cmd.out, cmd.target, cmd.precision)
    if isinstance(cmd, Hil):
        from deploy.hil import run_hil

        return run_hil(
            cmd.run,
            cmd.firmware,
            cmd.seconds,
            cmd.episodes,
            serial=cmd.serial,
            cache_dir=cmd.cache_dir,
        )
    if isinstance(cmd, Crazyflie):
        from deploy.crazyflie import fly

        return fly(cmd.run, cmd.uri, cmd.app, cmd.seconds, cmd.height, cmd.dry_run)
    if isinstance(cmd, VlaCollect):
        from vla.collect import collect
        from vla.dataset import LeRobotDataset

        runner.enable_compilation_cache(cmd.cache_dir)
        try:
            out = collect(cmd.out, cmd.config, overwrite=cmd.overwrite, progress=not cmd.json)
        except (ValueError, FileExistsError, RuntimeError) as e:
            raise RunError(str(e)) from None
        data = LeRobotDataset(out)
        return {"dataset": str(out), "episodes": len(data.episodes), "frames": len(data)}
    if isinstance(cmd, VlaSft):
        from vla.dataset import DatasetError

        sft = _vla("sft")
        runner.enable_compilation_cache(cmd.cache_dir)
        try:
            ckpt = sft.train_sft(cmd.config, progress=not cmd.json)
            report = {"checkpoint": str(ckpt)}
            if cmd.config.eval_episodes:
                result = sft.final_evaluation(cmd.config, ckpt)
                report |= {k: result[k] for k in ("success_rate", "mean_return", "episodes")}
        except (ValueError, DatasetError, FileNotFoundError) as e:
            raise RunError(str(e)) from None
        return report
    if isinstance(cmd, VlaRl):
        from vla.dataset import DatasetError

        rl = _vla("rl")
        runner.enable_compilation_cache(cmd.cache_dir)
        try:
            rl.train_rl(dataclasses.replace(cmd.config, init=str(cmd.init)), progress=not cmd.json)
        except (ValueError, DatasetError, FileNotFoundError) as e:
            raise RunError(str(e)) from None
        return rl.summarize(cmd.config.out)
    if isinstance(cmd, VlaResidual):
        residual = _vla("residual")
        try:
            result = residual.train_vla_residual(cmd.config, cache_dir=cmd.cache_dir)
        except (ValueError, FileNotFoundError) as e:
            raise RunError(str(e)) from None
        return result["eval"] or result
    raise AssertionError(cmd)


def _vla(module: str) -> ModuleType:
    """`vla.<module>`, or a one-line error naming the missing extra (the VLA modules need torch)."""
    try:
        return importlib.import_module(f"vla.{module}")
    except ImportError as e:
        raise RunError(f"{e}: the VLA needs torch, pip install -e '.[vla]'") from None


def _register_residual_base(run: Path) -> None:
    """A residual run on a frozen VLA rebuilds its base through the "vla" or "vla_view" base,
    which `vla.residual` registers when imported (algos/ cannot import vla/)."""
    try:
        cfg = json.loads((run / "config.json").read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a run folder: the command names the problem
    if isinstance(cfg, dict) and (cfg.get("residual") or {}).get("base") in VLA_BASES:
        import vla.residual  # noqa: F401


def _export_vla(cmd: Export) -> dict:
    """A VLA checkpoint (or an SFT / RL run's latest) → prefix.onnx + denoise_step.onnx in `out`."""
    if cmd.precision != "fp32":
        raise RunError(f"the VLA exports in fp32 only, not {cmd.precision}")
    from vla.checkpoint import resolve_checkpoint
    from vla.export_onnx import export_vla_onnx

    try:
        ckpt = resolve_checkpoint(cmd.run)
        report = export_vla_onnx(ckpt, cmd.out)
    except (ValueError, FileNotFoundError) as e:
        raise RunError(str(e)) from None
    return {"checkpoint": str(ckpt), **report}


def _format_report(report: dict, width: int = 100) -> str:
    """Top-level scalars of a report as `key: value` lines (nested parts: see --json)."""
    lines = []
    for k, v in report.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            lines.append(f"{k}: {v:.6g}" if isinstance(v, float) else f"{k}: {v}")
        elif isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()):
            inner = ", ".join(f"{a} {b:.4g}" for a, b in v.items())
            lines.append(f"{k}: {inner}"[:width])
    return "\n".join(lines)


def parse(argv: Sequence[str]) -> Train | Eval | Export | Render | FirmwareExport | Deploy | Vla:
    """Parses `argv`; for `train`, the defaults are the preset of the requested task and algo."""
    default = _train_default(next(iter(TASKS)), "cpu")
    try:  # first pass: only to learn the task and the preset (so --out is not required in it)
        first, _ = tyro.cli(
            _commands(dataclasses.replace(default, out=Path())),
            args=argv,
            prog="hoverfly",
            add_help=False,
            return_unknown_args=True,
            console_outputs=False,
            registry=_REGISTRY,
        )
    except SystemExit:
        first = None
    if isinstance(first, Train):
        named = any(a == "--algo" or a.startswith("--algo=") for a in argv)
        default = _train_default(first.task, first.preset, first.config.algo if named else None)
    cmd = tyro.cli(_commands(default), args=argv, prog="hoverfly", registry=_REGISTRY)
    if isinstance(cmd, Train):
        _check_unused_options(cmd.config, default.config)
    return cmd


def _train_default(task: str, preset: str, algo: str | None = None) -> Train:
    try:
        cfg = get_preset(task, preset, algo)
    except ValueError as e:
        raise RunError(str(e)) from None
    return Train(task=tyro.MISSING, out=tyro.MISSING, preset=preset, config=cfg)  # type: ignore


def _check_unused_options(cfg: TrainConfig, default: TrainConfig) -> None:
    """Refuses options of a section the run ignores (another learner's or family's), which would
    otherwise be dropped silently (e.g. `--ppo.*` on an APG run)."""
    ignored = cfg.unused_sections & {*ALGOS, "env", "randomization", *ARM_SECTIONS}
    changed = sorted(name for name in ignored if getattr(cfg, name) != getattr(default, name))
    if changed:
        raise RunError(
            f"options {', '.join(f'--{n}.*' for n in changed)} are ignored by a run of {cfg.task} "
            f"with algo {cfg.algo}; drop them, or choose the learner or task they belong to"
        )


def _commands(train_default: Train) -> type:
    return Union[  # noqa: UP007 (tyro reads the Annotated members of a typing.Union)
        Annotated[Train, tyro.conf.subcommand("train", default=train_default)],
        Annotated[Eval, tyro.conf.subcommand("eval")],
        Annotated[Export, tyro.conf.subcommand("export")],
        Annotated[Render, tyro.conf.subcommand("render")],
        Annotated[FirmwareExport, tyro.conf.subcommand("firmware-export")],
        Annotated[Deploy, tyro.conf.subcommand("deploy")],
        Annotated[Vla, tyro.conf.subcommand("vla")],
    ]


# The task is the positional TASK of `train`, so TrainConfig.task and the env configs' task
# (which make_env derives from the task) are hidden from the options; so is RLConfig.init, the
# positional SFT_RUN of `vla rl`.
_REGISTRY = ConstructorRegistry()
_building: list[type] = []


@_REGISTRY.struct_rule
def _hide_task_fields(info: StructTypeInfo) -> StructConstructorSpec | None:
    from sim.manipulator import ArmConfig
    from sim.quadrotor import QuadrotorConfig

    hidden = {TrainConfig: "task", QuadrotorConfig: "task", ArmConfig: "task", RLConfig: "init"}
    if info.type not in hidden or info.type in _building:
        return None
    _building.append(info.type)
    try:
        spec = ConstructorRegistry.get_struct_spec(info)
    finally:
        _building.pop()
    if not isinstance(spec, StructConstructorSpec):
        return None
    fields = tuple(
        dataclasses.replace(f, type=Annotated[f.type, tyro.conf.Suppress])
        if f.name == hidden[info.type]
        else f
        for f in spec.fields
    )
    return StructConstructorSpec(spec.instantiate, fields)
