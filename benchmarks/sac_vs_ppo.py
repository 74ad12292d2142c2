"""SAC vs PPO vs a peer SAC on one task in one run: wall time and env samples to a success rate.

Trains, one after the other on the same machine and task (issue 4):
  ppo       our PPO preset (`algos.presets.PRESETS[--preset]`),
  sac       our SAC preset (`algos.presets.SAC_PRESETS[--preset]`),
  brax_sac  the peer: brax 0.14.2's SAC trainer (`brax.training.agents.sac.train`) on our env,
            with our SAC preset's env (reward weights included) and, where brax has the knob, its
            hyperparameters (`peer_settings` in the JSON: env count, batch, update-to-data ratio,
            learning rate, γ, τ, reward scale, replay sizes, the critic's hidden widths for both
            networks); brax's own choices stay (relu, α starting at 1 with its own step size,
            target entropy −|A|/2, a state-independent σ from softplus, a critic on the actor
            observation, no hover bias on the action).
Each learner trains for at most `--seconds` of training clock (or its preset's step budget, or
`--max-steps`). Every `--eval-every` training seconds (brax: every `--peer-eval-steps` env steps,
between its epochs) the deterministic policy is evaluated with the project's protocol
(`algos.evaluate.rollout`/`summarize` with the preset's `EvalConfig`: `--eval-episodes` episodes
of 5 s under domain randomization from the wide initial-state distribution; success: never
terminated and mean position error over the last 2 s ≤ 0.1 m) on one eval env, the task's
default config, for all three. The training clock starts before the first jit (initialization and
compilation included) and stops during evaluations. Per learner the JSON holds `reached` (training
seconds and env steps at the first evaluation with success ≥ `--threshold`, null if none),
`compile_s` (first update/epoch minus a steady one, plus init), `final` (the last evaluation) and
`curve` ([train seconds, env steps, success, pos RMSE, termination] per evaluation).

  python benchmarks/sac_vs_ppo.py --out benchmarks/results/sac_vs_ppo_cpu.json --plot sac_vs_ppo.png
  python benchmarks/sac_vs_ppo.py --learners sac --seconds 120 --eval-episodes 256
  python benchmarks/sac_vs_ppo.py --task quadrotor-track --threshold 0.8

brax SAC needs two adapters, both in this file: a `jax.device_put_replicated` shim (removed in
jax 0.10, still called by brax 0.14.2: google/brax#671) and an observation adapter (brax SAC takes
one array observation: our `obs["state"]`). Its evaluator is swapped for ours (brax's `Evaluator`
is patched for the duration of the call) so that it is scored by the same protocol and its
evaluation time is excluded in the same way. If brax SAC fails, its entry is `{"skipped": reason}`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import time
import traceback
from unittest import mock

import jax
import jax.numpy as jnp

from algos import default_xla_flag, ppo, sac
from algos.evaluate import eval_steps, rollout, summarize
from algos.presets import get_preset
from algos.run_folder import make_run_policy, make_train_env
from sim import Wrapper, make_env, wrap_for_training


class _Clock:
    """Training clock: wall time since `start`, minus the time spent in `evaluating()`."""

    def __init__(self):
        self.start, self.eval_s = time.perf_counter(), 0.0

    def train_s(self) -> float:
        return time.perf_counter() - self.start - self.eval_s

    @contextlib.contextmanager
    def evaluating(self):
        t = time.perf_counter()
        yield
        self.eval_s += time.perf_counter() - t


class _Scorer:
    """The eval protocol on one env; records the curve and the first success ≥ threshold."""

    def __init__(self, task: str, cfg, episodes: int, threshold: float):
        self.env = make_env(task, cfg.env_config, cfg.randomization_config)
        self.cfg, self.episodes, self.threshold = cfg.eval, episodes, threshold
        self.steps, self.settle = eval_steps(cfg.eval, self.env.dt)
        self.curve, self.reached, self.final = [], None, None

    def make_eval(self, policy_from_params):
        """Jitted params -> trajectory of the deterministic policy."""

        def run(params):
            key = jax.random.key(self.cfg.seed)
            return rollout(self.env, policy_from_params(params), key, self.episodes, self.steps)

        return jax.jit(run, compiler_options=self.env.compiler_options)

    def score(self, traj, train_s: float, env_steps: int) -> dict:
        s = summarize(traj, self.settle, self.cfg.tolerance)
        self.final = {**s, "train_seconds": round(train_s, 2), "env_steps": env_steps}
        self.curve.append(
            [
                round(train_s, 2),
                env_steps,
                s["success_rate"],
                round(s["pos_rmse_m"], 4),
                s["termination_rate"],
            ]
        )
        if self.reached is None and s["success_rate"] >= self.threshold:
            self.reached = {"train_seconds": round(train_s, 2), "env_steps": env_steps}
        print(
            f"  {train_s:7.1f} s {env_steps:>11,} steps  success {s['success_rate']:.3f}  "
            f"RMSE {s['pos_rmse_m']:.3f} m  terminated {s['termination_rate']:.3f}",
            flush=True,
        )
        return s

    def result(self, clock: _Clock, compile_s: float, **extra) -> dict:
        return {
            "reached": self.reached,
            "compile_s": round(compile_s, 2),
            "final": self.final,
            "eval_seconds": round(clock.eval_s, 2),
            "curve": self.curve,
            **extra,
        }


def run_ours(cfg, algo: str, scorer: _Scorer, seconds: float, eval_every: float, seed: int):
    """Our PPO or SAC trainer, evaluated every `eval_every` training seconds."""
    learner = ppo if algo == "ppo" else sac
    env = make_train_env(cfg)
    trainer = learner.make_train(cfg.learner, env, cfg.env_config.episode_steps)
    evaluate = scorer.make_eval(lambda p: make_run_policy(algo, trainer.network, p, True))
    opts, per_update = env.compiler_options, cfg.steps_per_update
    clock = _Clock()
    update = jax.jit(trainer.update, donate_argnums=0, compiler_options=opts)
    ts = jax.jit(trainer.init, compiler_options=opts)(jax.random.key(seed))
    durations, next_eval, u = [], eval_every, 0
    while True:
        t = clock.train_s()
        ts, _ = update(ts)
        jax.block_until_ready(ts)
        u += 1
        durations.append(clock.train_s() - t)
        done = clock.train_s() >= seconds or u >= cfg.learner.num_updates
        if clock.train_s() >= next_eval or done:
            train_s = clock.train_s()  # read before the evaluation, which the clock excludes
            with clock.evaluating():
                scorer.score(evaluate(ts.params), train_s, u * per_update)
            next_eval = clock.train_s() + eval_every
        if done:
            break
    steady = durations[1] if len(durations) > 1 else 0.0
    return scorer.result(
        clock,
        durations[0] - steady + (clock.train_s() - sum(durations)),
        updates=u,
        env_steps=u * per_update,
        env_steps_per_s=round(u * per_update / max(clock.train_s(), 1e-9), 1),
    )


# -- the peer: brax SAC ------------------------------------------------------------------------
class _StateObs(Wrapper):
    """brax SAC reads one array observation: ours' actor part, `obs["state"]`."""

    def reset(self, rng):
        s = self.env.reset(rng)
        return s.replace(obs=s.obs["state"])

    def step(self, state, action):
        s = self.env.step(state, action)
        return s.replace(obs=s.obs["state"])

    @property
    def observation_size(self) -> int:
        return self.env.observation_size["state"][0]


def _device_put_replicated(x, devices):
    """Shim: `jax.device_put_replicated` was removed in jax 0.10; brax 0.14.2 still calls it
    (google/brax#671). One stacked copy per device, as the original."""
    return jax.device_put(jax.tree.map(lambda a: jnp.stack([a] * len(devices)), x), devices[0])


class _StopTraining(Exception):
    """Raised from the evaluator once the training-time budget is spent."""


def run_brax_sac(cfg, scorer, seconds, eval_steps_every, max_steps, seed) -> tuple[dict, dict]:
    """brax SAC on `_StateObs(train env)` under our training wrappers (auto-reset, time-outs
    flagged in `info["truncation"]`, which brax SAC masks out of its critic loss like ours)."""
    from brax.training import acting
    from brax.training.agents.sac import networks as sac_networks
    from brax.training.agents.sac import train as brax_sac

    s = cfg.sac
    settings = {
        "num_envs": s.num_envs,
        "batch_size": s.batch_size,
        # brax takes grad_updates_per_step gradient steps per actor step of num_envs env steps
        "grad_updates_per_step": max(1, round(s.utd_ratio * s.num_envs)),
        "learning_rate": s.critic_lr,
        "discounting": s.gamma,
        "tau": s.tau,
        "reward_scaling": s.reward_scale,
        "min_replay_size": s.learning_starts,
        "max_replay_size": s.buffer_size,
        "normalize_observations": True,
        "hidden_layer_sizes": list(s.network.critic_hidden),  # actor and critic alike
    }
    num_evals = max(2, max_steps // eval_steps_every + 1)
    clock, t_epochs = _Clock(), []
    evaluate = None

    class Evaluator:
        """Stands in for brax's `acting.Evaluator`: our protocol, our clock, the budget."""

        def __init__(self, eval_env, eval_policy_fn, **_):
            nonlocal evaluate
            evaluate = scorer.make_eval(eval_policy_fn)

        def run_evaluation(self, policy_params, training_metrics, aggregate_episodes=True):
            t_epochs.append(clock.train_s())
            epochs = len(t_epochs) - 1  # the first call precedes the replay prefill
            env_steps = prefill + epochs * steps_per_epoch if epochs else 0
            with clock.evaluating():
                summary = scorer.score(evaluate(policy_params), t_epochs[-1], env_steps)
            if clock.train_s() >= seconds:
                raise _StopTraining
            return {f"eval/{k}": v for k, v in summary.items()}

    env = _StateObs(make_train_env(cfg))
    # brax's epoch length (train.py): ceil((T − prefill) / ((num_evals − 1) · num_envs)) steps
    prefill = -(-s.learning_starts // s.num_envs) * s.num_envs
    steps_per_epoch = -(-(max_steps - prefill) // ((num_evals - 1) * s.num_envs)) * s.num_envs
    net = dict(settings)
    hidden = tuple(net.pop("hidden_layer_sizes"))
    with (
        mock.patch.object(jax, "device_put_replicated", _device_put_replicated, create=True),
        mock.patch.object(acting, "Evaluator", Evaluator),
    ):
        try:
            brax_sac.train(
                environment=env,
                num_timesteps=max_steps,
                episode_length=cfg.env_config.episode_steps,
                wrap_env_fn=lambda e, episode_length, **_: wrap_for_training(e, episode_length),
                num_evals=num_evals,
                deterministic_eval=True,
                seed=seed,
                network_factory=functools.partial(
                    sac_networks.make_sac_networks, hidden_layer_sizes=hidden
                ),
                **net,
            )
        except _StopTraining:
            pass
    # t_epochs[0]: the initial evaluation (init done); [1]: first epoch (prefill + compile)
    epochs = [b - a for a, b in zip(t_epochs[1:], t_epochs[2:], strict=False)]
    compile_s = t_epochs[0] + (t_epochs[1] - t_epochs[0]) - (epochs[0] if epochs else 0.0)
    steps = prefill + (len(t_epochs) - 1) * steps_per_epoch
    result = scorer.result(
        clock,
        compile_s,
        env_steps=steps,
        env_steps_per_s=round(steps / max(clock.train_s(), 1e-9), 1),
    )
    return result, {**settings, "steps_per_epoch": steps_per_epoch, "prefill": prefill}


def _plot(result: dict, path: str) -> None:
    """Success and termination rates of every learner vs env steps (log) and vs seconds."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(11, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    for name, r in result["learners"].items():
        for row, col in ((0, 2), (1, 4)):  # curve columns: success, termination
            if r.get("curve"):
                t, n, y = zip(*[(c[0], c[1], c[col]) for c in r["curve"]], strict=True)
                axes[row, 0].plot(n, y, marker=".", label=name)
                axes[row, 1].plot(t, y, marker=".", label=name)
    for row, ylabel in ((0, "eval success rate"), (1, "eval termination rate")):
        xlabels = ("env steps", "training seconds (compile included)")
        for ax, xlabel in zip(axes[row], xlabels, strict=True):
            if row == 0:
                ax.axhline(result["threshold"], color="k", ls="--", lw=0.8)
            ax.set(xlabel=xlabel, ylabel=ylabel, ylim=(-0.02, 1.02))
            ax.grid(alpha=0.3)
            ax.legend()
        axes[row, 0].set_xscale("log")
        axes[row, 0].xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(f"{result['task']} on {result['device']} ({result['preset']} presets)")
    fig.savefig(path, dpi=100)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="quadrotor-hover")
    p.add_argument("--preset", default="cpu")
    p.add_argument("--learners", nargs="+", default=["ppo", "sac", "brax_sac"])
    p.add_argument("--seconds", type=float, default=300.0, help="training clock per learner")
    p.add_argument("--max-steps", type=int, default=None, help="env steps per learner (cap)")
    p.add_argument("--eval-every", type=float, default=30.0, help="training seconds")
    p.add_argument("--peer-eval-steps", type=int, default=100_000, help="brax: env steps")
    p.add_argument("--eval-episodes", type=int, default=None, help="default: the preset's")
    p.add_argument("--threshold", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--plot", default=None, help="PNG of success vs env steps and vs seconds")
    a = p.parse_args(argv)
    unknown = set(a.learners) - {"ppo", "sac", "brax_sac"}
    if unknown:
        p.error(f"unknown learners {sorted(unknown)}")
    if a.task.startswith("arm-") and "brax_sac" in a.learners:
        # brax jits our env without `env.compiler_options`: the arm's CPU option (exponential MJX
        # compile times otherwise) goes process-wide, before JAX starts; ignored on a GPU
        default_xla_flag("xla_cpu_use_fusion_emitters", "false")
        default_xla_flag("xla_cpu_multi_thread_eigen", "false")
    base = get_preset(a.task, a.preset, "ppo")
    episodes = a.eval_episodes or base.eval.episodes
    result = {
        "benchmark": "sac_vs_ppo",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "jax_version": jax.__version__,
        "task": a.task,
        "preset": a.preset,
        "threshold": a.threshold,
        "seconds_per_learner": a.seconds,
        "eval_episodes": episodes,
        "seed": a.seed,
        "learners": {},
    }
    for name in a.learners:
        print(f"{name}:", flush=True)
        scorer = _Scorer(a.task, base, episodes, a.threshold)
        algo = "ppo" if name == "ppo" else "sac"
        cfg = get_preset(a.task, a.preset, algo)
        steps = a.max_steps or cfg.learner.total_timesteps
        cfg = dataclasses.replace(
            cfg, **{algo: dataclasses.replace(cfg.learner, total_timesteps=steps)}
        )
        if name == "brax_sac":
            try:
                r, settings = run_brax_sac(cfg, scorer, a.seconds, a.peer_eval_steps, steps, a.seed)
                r["peer_settings"] = settings
            except Exception as e:  # the peer is optional: record why it did not run
                traceback.print_exc()
                r = {"skipped": f"{type(e).__name__}: {e}"}
        else:
            r = run_ours(cfg, algo, scorer, a.seconds, a.eval_every, a.seed)
            r["config"] = dataclasses.asdict(cfg.learner)
        result["learners"][name] = r
    result["loadavg_end"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    if a.plot:
        _plot(result, a.plot)
    return result


if __name__ == "__main__":
    main()
