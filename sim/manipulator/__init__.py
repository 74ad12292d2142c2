"""7-DoF arm (Franka Panda kinematics) with a parallel gripper on MJX: reach, push, pick-place;
domain randomization, a scripted pick-and-place base, cameras and videos."""

from sim.manipulator.env import (
    HOME,
    ArmConfig,
    ArmData,
    ArmEnv,
    ArmParams,
    InitConfig,
    RewardConfig,
    obs_fields,
)
from sim.manipulator.model import PANDA_XML, ModelIndex, SceneConfig, build_model, index_model
from sim.manipulator.perturb import Perturbation, PerturbationConfig
from sim.manipulator.randomization import DomainRandomization, RandomizationConfig, randomize_params
from sim.manipulator.render import CameraRenderer, policy_video, setup_gl, write_video
from sim.manipulator.scripted import (
    ScriptedConfig,
    ScriptedPolicy,
    ScriptedState,
    make_scripted_base,
    make_scripted_policy,
)

__all__ = [
    "HOME",
    "PANDA_XML",
    "ArmConfig",
    "ArmData",
    "ArmEnv",
    "ArmParams",
    "CameraRenderer",
    "DomainRandomization",
    "InitConfig",
    "ModelIndex",
    "Perturbation",
    "PerturbationConfig",
    "RandomizationConfig",
    "RewardConfig",
    "SceneConfig",
    "ScriptedConfig",
    "ScriptedPolicy",
    "ScriptedState",
    "build_model",
    "index_model",
    "make_scripted_base",
    "make_scripted_policy",
    "obs_fields",
    "policy_video",
    "randomize_params",
    "setup_gl",
    "write_video",
]
