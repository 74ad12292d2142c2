"""Crazyflie 2.x quadrotor simulator: dynamics, tasks and domain randomization."""

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
from sim.quadrotor.randomization import DomainRandomization, RandomizationConfig, randomize_params

__all__ = [
    "OBS_FIELDS",
    "PARAM_NAMES",
    "PARAM_SETS",
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
    "randomize_params",
    "rk4_step",
]
