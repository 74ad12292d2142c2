"""The Crazyflie 2.x out-of-tree controller app of a policy: `write_app` (see `app`)."""

from firmware_export.crazyflie.app import write_app

__all__ = ["write_app"]
