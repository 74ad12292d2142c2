"""The `hoverfly` command: tyro subcommands, each a few lines calling `algos.runner`.

  hoverfly train TASK --out RUN [--preset cpu|gpu] [--seed 3] [--ppo.total-timesteps N] ...
  hoverfly eval RUN [--episodes N] [--json]

Every `TrainConfig` field is an option whose default is the chosen preset's value: the command
line is parsed once to learn the task and the preset, then again with that preset as the default.
Bad input (unknown task, bad run folder) exits with status 2 and one line on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal, Union

import tyro
from tyro.constructors import ConstructorRegistry, StructConstructorSpec, StructTypeInfo

from algos import PRESETS, TrainConfig, get_preset, runner
from algos.run_folder import RunError
from sim import TASKS

Preset = Literal[tuple(sorted(PRESETS))]  # type: ignore[valid-type]


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
        summary = runner.evaluate_run(cmd.run, episodes=cmd.episodes, cache_dir=cmd.cache_dir)
        print(json.dumps(summary) if cmd.json else runner.format_summary(summary))
        return 0
    except RunError as e:
        print(f"hoverfly: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("hoverfly: interrupted", file=sys.stderr)
        return 130


def parse(argv: Sequence[str]) -> Train | Eval:
    """Parses `argv`; for `train`, the defaults are the preset of the requested task."""
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
        default = _train_default(first.task, first.preset)
    return tyro.cli(_commands(default), args=argv, prog="hoverfly", registry=_REGISTRY)


def _train_default(task: str, preset: str) -> Train:
    try:
        cfg = get_preset(task, preset)
    except ValueError as e:
        raise RunError(str(e)) from None
    return Train(task=tyro.MISSING, out=tyro.MISSING, preset=preset, config=cfg)  # type: ignore


def _commands(train_default: Train) -> type:
    return Union[  # noqa: UP007 (tyro reads the Annotated members of a typing.Union)
        Annotated[Train, tyro.conf.subcommand("train", default=train_default)],
        Annotated[Eval, tyro.conf.subcommand("eval")],
    ]


# The task is the positional TASK of `train`, so TrainConfig.task and QuadrotorConfig.task
# (which make_env derives from the task) are hidden from the options.
_REGISTRY = ConstructorRegistry()
_building: list[type] = []


@_REGISTRY.struct_rule
def _hide_task_fields(info: StructTypeInfo) -> StructConstructorSpec | None:
    from sim.quadrotor import QuadrotorConfig

    if info.type not in (TrainConfig, QuadrotorConfig) or info.type in _building:
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
        if f.name == "task"
        else f
        for f in spec.fields
    )
    return StructConstructorSpec(spec.instantiate, fields)
