"""The README's set-up commands are the ones CI runs, and its CLI examples parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hoverfly import cli

ROOT = Path(__file__).resolve().parents[1]


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_ci_runs_the_readme_test_command():
    setup_test = _bash_blocks()[1].strip()
    test_cmd = setup_test.split("&& ", 2)[-1]  # after venv creation and activation
    assert test_cmd == 'pip install -e ".[dev]" && pytest -q -n 2 --dist loadgroup'
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_readme_main_job_is_the_default_train_command():
    assert "hoverfly train quadrotor-hover --out runs/hover" in _bash_blocks()[0]


@pytest.mark.parametrize(
    "line", [ln for ln in _bash_blocks()[2].splitlines() if ln.startswith("hoverfly ")]
)
def test_readme_usage_lines_parse(line):
    argv = shlex.split(line.split("#")[0])[1:]
    if "--help" in argv:
        with pytest.raises(SystemExit) as e:
            cli.parse(argv)
        assert e.value.code == 0
        return
    cli.parse(argv)
