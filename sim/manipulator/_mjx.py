"""`mujoco.mjx`, imported with its optional-backend notices sent to stderr.

Importing mjx without NVIDIA Warp installed prints "Failed to import warp" to stdout, which would
break the CLI's one-JSON-object `--json` output; everything in the project imports mjx from here.
"""

import contextlib
import sys

with contextlib.redirect_stdout(sys.stderr):
    from mujoco import mjx

__all__ = ["mjx"]
