"""The export and deployment commands wired end to end on the shipped trained run: ONNX, C for the
host and the STM32F405, the Crazyflie app, hardware-in-the-loop under QEMU, and their errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from algos.run_folder import config_hash, read_config
from hoverfly import cli

HAS_TOOLCHAIN = shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm")
needs_toolchain = pytest.mark.skipif(
    not HAS_TOOLCHAIN, reason="needs gcc-arm-none-eabi and qemu-system-arm (apt)"
)


def run_json(capsys, *args) -> dict:
    assert cli.main([*map(str, args), "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def test_export_onnx_subprocess_prints_one_json_object(hover_run, tmp_path):
    out = tmp_path / "policy.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "hoverfly", "export", str(hover_run), "--format", "onnx"]
        + ["--out", str(out), "--episodes", "128", "--force", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["precision"] == "fp32" and report["max_abs_action_diff"] <= 1e-5
    from deploy.onnx_export import load_onnx_policy, read_metadata

    assert read_metadata(out)["policy"]["config_hash"] == config_hash(read_config(hover_run))
    obs = np.zeros((3, report_obs_size(out)), np.float32)
    assert load_onnx_policy(out)(obs).shape == (3, 4)


def report_obs_size(path) -> int:
    from deploy.onnx_export import read_metadata

    layout = read_metadata(path)["policy"]["observation"]
    return sum(field["size"] for field in layout)


def test_export_refuses_bad_input_in_one_line(hover_run, tmp_path, capsys):
    assert cli.main(["export", str(tmp_path / "nope"), "--out", str(tmp_path / "p.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hoverfly: error:") and "\n" not in err and "does not exist" in err
    with pytest.raises(SystemExit):
        cli.parse(["export", str(hover_run), "--out", "p.onnx", "--precision", "int4"])
    assert not (tmp_path / "p.onnx").exists()


def test_firmware_export_host_and_crazyflie_app(hover_run, tmp_path, capsys):
    host = run_json(
        capsys, "firmware-export", hover_run, "--target", "host", "--out", tmp_path / "c"
    )
    assert (tmp_path / "c" / "policy.c").is_file() and (tmp_path / "c" / "policy.h").is_file()
    assert json.dumps(host)
    app = run_json(
        capsys, "firmware-export", hover_run, "--target", "crazyflie", "--out", tmp_path / "app"
    )
    assert app["config_hash"] == config_hash(read_config(hover_run))
    assert (tmp_path / "app" / "Makefile").is_file()
    assert (tmp_path / "app" / "app-config").read_text().count("CONFIG_CONTROLLER_OOT=y") == 1


@needs_toolchain
def test_deploy_hil_flies_the_stm32_export(hover_run, tmp_path, capsys):
    fw = tmp_path / "fw"
    run_json(capsys, "firmware-export", hover_run, "--target", "stm32f405", "--out", fw)
    report = run_json(capsys, "deploy", "hil", hover_run, "--firmware", fw, "--seconds", "1")
    assert report["steps"] == 100 and report["frames_failed"] <= 2  # resent under load
    assert report["deviation_max_m"] <= 0.01


def test_deploy_crazyflie_without_a_run_is_one_line(tmp_path, capsys):
    args = ["deploy", "crazyflie", str(tmp_path / "nope"), "--uri", "udp://127.0.0.1:1"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hoverfly: error:") and "\n" not in err
