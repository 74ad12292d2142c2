"""Crazyflie 2.x quadrotor simulator: dynamics, tasks and domain randomization."""

from sim.quadrotor.controller import (
    Controller,
    ControllerConfig,
    ControllerState,
    make_controller,
)
from sim.quadrotor.dynamics import Disturbance, RigidState, integrate, rk4_step
from sim.quadrotor.env import (
    OBS_FIELDS,
    DisturbanceConfig,
    InitConfig,
    NoiseConfig,
    QuadData,
    QuadrotorConfig,
    QuadrotorEnv,
    RewardConfig,
    TrackConfig,
)
from sim.quadrotor.params import PARAM_NAMES, PARAM_SETS, QuadParams, get_params
from sim.quadrotor.randomization import (
    HEAVY,
    DomainRandomization,
    RandomizationConfig,
    heavy_disturbances,
    randomize_params,
)

__all__ = [
    "HEAVY",
    "OBS_FIELDS",
    "PARAM_NAMES",
    "PARAM_SETS",
    "Controller",
    "ControllerConfig",
    "ControllerState",
    "Disturbance",
    "DisturbanceConfig",
    "DomainRandomization",
    "InitConfig",
    "NoiseConfig",
    "QuadData",
    "QuadParams",
    "QuadrotorConfig",
    "QuadrotorEnv",
    "RandomizationConfig",
    "RewardConfig",
    "RigidState",
    "TrackConfig",
    "get_params",
    "integrate",
    "make_controller",
    "heavy_disturbances",
    "randomize_params",
    "rk4_step",
]
