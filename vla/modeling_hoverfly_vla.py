"""The compact built-in VLA: a ViT or CNN-keypoint image encoder, a prefix transformer over
[image, text, proprio] tokens and a flow-matching action expert (π0 design: Black et al. 2024,
"π0: A Vision-Language-Action Flow Model for General Robot Control"), plus a value head and a
stochastic "flow-noise" sampler with exact chunk log-probabilities for RL post-training (πRL:
Chen et al. 2025, "πRL: Online RL Fine-tuning for Flow-based Vision-Language-Action Models").

Batch / observation dicts (all tensors on the model's device; B batch, C cameras, S image side,
T = config.max_tokens, H = config.chunk_size, A = config.action_dim):

- ``"images"``: float [B, C, 3, S, S] in [-1, 1], cameras in `config.cameras` order;
- ``"tokens"``: int64 [B, T] and ``"token_mask"``: bool [B, T] (True = real token);
- ``"state"``: float [B, proprio_dim], normalized;
- training only: ``"actions"``: float [B, H, A], normalized, and optional ``"action_is_pad"``:
  bool [B, H] (True = padding past the episode end, excluded from the loss).

Flow convention (π0 / lerobot): x_t = t · noise + (1 - t) · actions, t ∈ (0, 1], the network
predicts the velocity u = noise - actions, and sampling integrates dx/dt = v from t = 1 (noise) to
t = 0 (actions) with `num_flow_steps` Euler steps of dt = -1 / N.

Attention: prefix tokens attend to every valid prefix token (text padding masked); expert layer j
attends to the keys/values of prefix layer `config.expert_kv_layers[j]` plus its own H tokens; the
prefix never attends to the expert. So the prefix is encoded once (`embed_prefix` → `PrefixCache`)
and `denoise_step(cache, x_t, t)` is one pure network call, the unit an ONNX runtime loops over.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from vla.configuration_hoverfly_vla import HoverflyVLAConfig

__all__ = ["HoverflyVLA", "PrefixCache", "num_parameters"]

_LOG_2PI = math.log(2.0 * math.pi)


class PrefixCache(NamedTuple):
    """The encoded prefix, computed once per observation.

    keys, values: [L_e, B, n_heads, P, head_dim], prefix keys/values read by the L_e expert layers.
    mask: bool [B, P], True for real (non-padding) prefix tokens.
    pooled: [B, d_model], masked mean of the final prefix hidden states (value head input).
    """

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    pooled: torch.Tensor


class _Attention(nn.Module):
    """Multi-head attention from `width` to `n_heads · head_dim` and back."""

    def __init__(self, width: int, n_heads: int, head_dim: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.qkv = nn.Linear(width, 3 * n_heads * head_dim)
        self.out = nn.Linear(n_heads * head_dim, width)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [B, T, width] -> q, k, v each [B, n_heads, T, head_dim]."""
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        """q [B, h, Tq, d], k/v [B, h, Tk, d], mask bool [B, 1, Tq | 1, Tk] -> [B, Tq, width]."""
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, t, _ = y.shape
        return self.out(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class _Block(nn.Module):
    """Pre-norm transformer block. With `prefix_kv` its queries also read those keys/values."""

    def __init__(self, width: int, n_heads: int, head_dim: int, mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = _Attention(width, n_heads, head_dim)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        prefix_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x [B, T, width]; mask bool [B, 1, 1, Tk] over keys (None: all); returns (x, (k, v))
        with this block's own keys/values [B, h, T, d]."""
        q, k, v = self.attn.project(self.norm1(x))
        kk, vv = k, v
        if prefix_kv is not None:  # expert: keys = [prefix ; own tokens]
            kk, vv = torch.cat([prefix_kv[0], k], dim=2), torch.cat([prefix_kv[1], v], dim=2)
        x = x + self.attn.attend(q, kk, vv, mask)
        x = x + self.mlp(self.norm2(x))
        return x, (k, v)


def _sinusoidal(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t [B] in [0, 1] -> [B, dim] sin/cos features, periods 4e-3 ... 4 (as π0)."""
    half = dim // 2
    fraction = torch.linspace(0.0, 1.0, half, dtype=t.dtype, device=t.device)
    period = 4e-3 * (4.0 / 4e-3) ** fraction
    angle = t[:, None] * (2.0 * math.pi / period)[None, :]
    out = torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)
    return F.pad(out, (0, dim - 2 * half))


class _KeypointStem(nn.Module):
    """CNN image tokens: a conv stem (stride 4) to features F [c, S/4, S/4], then K spatial-softmax
    keypoints: attention maps a_k = softmax over positions of a 1×1 conv of F; token k =
    Linear([Σ a_k · (x, y), Σ a_k · F]) (expected image coordinates in [-1, 1] and the attended
    features). Images [B, 3, S, S] -> tokens [B, K, width]."""

    def __init__(self, width: int, keypoints: int):
        super().__init__()
        c1, c2 = max(width // 4, 16), max(width // 2, 32)
        self.convs = nn.Sequential(
            nn.Conv2d(3, c1, 5, stride=2, padding=2),
            nn.GroupNorm(8, c1),
            nn.GELU(),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1),
            nn.GroupNorm(8, c2),
            nn.GELU(),
            nn.Conv2d(c2, c2, 3, padding=1),
            nn.GroupNorm(8, c2),
            nn.GELU(),
        )
        self.attention = nn.Conv2d(c2, keypoints, 1)
        self.proj = nn.Linear(c2 + 2, width)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        f = self.convs(images)  # [B, c, h, w]
        h, w = f.shape[-2:]
        a = self.attention(f).flatten(2).softmax(-1)  # [B, K, h·w]
        ys = torch.linspace(-1.0, 1.0, h, dtype=f.dtype, device=f.device)
        xs = torch.linspace(-1.0, 1.0, w, dtype=f.dtype, device=f.device)
        grid = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), -1).view(h * w, 2)
        feats = torch.cat([a @ grid, a @ f.flatten(2).transpose(1, 2)], dim=-1)  # [B, K, 2 + c]
        return self.proj(feats)


class HoverflyVLA(nn.Module):
    """Compact π0-style VLA. See the module docstring for the batch layout and conventions.

    `generator` seeds the weight initialization (None: torch's global generator).
    """

    def __init__(self, config: HoverflyVLAConfig, generator: torch.Generator | None = None):
        super().__init__()
        c = self.config = config
        d, de, hd = c.d_model, c.expert_width, c.head_dim
        n_cam = len(c.cameras)
        # vision: image tokens (ViT patches or CNN keypoints, each with a learned embedding) +
        # transformer, shared across cameras; camera embedding added after
        if c.vision_encoder == "cnn":
            self.keypoint_stem = _KeypointStem(d, c.keypoints)
        else:
            self.patch_embed = nn.Conv2d(3, d, kernel_size=c.patch_size, stride=c.patch_size)
        self.patch_pos = nn.Parameter(torch.zeros(c.image_tokens, d))
        self.vision_blocks = nn.ModuleList(
            _Block(d, c.n_heads, hd, c.mlp_ratio) for _ in range(c.vision_layers)
        )
        self.vision_norm = nn.LayerNorm(d)
        self.camera_embed = nn.Parameter(torch.zeros(n_cam, d))
        # text and proprio
        self.token_embed = nn.Embedding(c.vocab_size, d)
        self.token_pos = nn.Parameter(torch.zeros(c.max_tokens, d))
        self.state_proj = nn.Linear(c.proprio_dim, d)
        # prefix transformer
        self.prefix_blocks = nn.ModuleList(
            _Block(d, c.n_heads, hd, c.mlp_ratio) for _ in range(c.prefix_layers)
        )
        self.prefix_norm = nn.LayerNorm(d)
        # action expert
        self.action_in = nn.Linear(c.action_dim, de)
        self.action_time_mlp = nn.Sequential(nn.Linear(2 * de, de), nn.SiLU(), nn.Linear(de, de))
        self.action_pos = nn.Parameter(torch.zeros(c.chunk_size, de))
        self.expert_blocks = nn.ModuleList(
            _Block(de, c.n_heads, hd, c.mlp_ratio) for _ in range(c.expert_layers)
        )
        self.expert_norm = nn.LayerNorm(de)
        self.action_out = nn.Linear(de, c.action_dim)
        # RL heads
        self.value_head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.log_noise_std = nn.Parameter(torch.zeros(c.action_dim))
        self.reset_parameters(generator)

    # -- init --------------------------------------------------------------------------------------
    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Truncated-normal(0.02) weights, zero biases, unit norms; deterministic given
        `generator`. The flow-noise log-std starts at log(config.rl_noise_std_init)."""
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Conv2d):
                nn.init.trunc_normal_(module.weight, std=0.02, generator=generator)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.trunc_normal_(module.weight, std=0.02, generator=generator)
            elif isinstance(module, nn.LayerNorm | nn.GroupNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        for p in (self.patch_pos, self.camera_embed, self.token_pos, self.action_pos):
            nn.init.trunc_normal_(p, std=0.02, generator=generator)
        self.log_noise_std.fill_(math.log(self.config.rl_noise_std_init))

    # -- prefix ------------------------------------------------------------------------------------
    def _check_obs(self, obs: dict[str, torch.Tensor]) -> int:
        c = self.config
        n_cam, s = len(c.cameras), c.image_size
        expected = {
            "images": (n_cam, 3, s, s),
            "tokens": (c.max_tokens,),
            "token_mask": (c.max_tokens,),
            "state": (c.proprio_dim,),
        }
        b = None
        for key, tail in expected.items():
            if key not in obs:
                raise ValueError(f"observation lacks {key!r} (needs {sorted(expected)})")
            shape = tuple(obs[key].shape)
            if (
                len(shape) != len(tail) + 1
                or shape[1:] != tail
                or (b is not None and shape[0] != b)
            ):
                want = ("B",) + tail if b is None else (b,) + tail
                raise ValueError(f"observation {key!r} has shape {list(shape)}, expected {want}")
            b = shape[0]
        return b

    def embed_prefix(self, obs: dict[str, torch.Tensor]) -> PrefixCache:
        """Encodes images, instruction and state once: obs (see module docstring) -> PrefixCache."""
        c = self.config
        b = self._check_obs(obs)
        n_cam = len(c.cameras)
        images = obs["images"].to(self.patch_pos.dtype).flatten(0, 1)  # [B·C, 3, S, S]
        if c.vision_encoder == "cnn":
            x = self.keypoint_stem(images)  # [B·C, N, d]
        else:
            x = self.patch_embed(images).flatten(2).transpose(1, 2)
        x = x + self.patch_pos
        for block in self.vision_blocks:
            x, _ = block(x, None)
        x = self.vision_norm(x).view(b, n_cam, -1, c.d_model) + self.camera_embed[None, :, None]
        image_tokens = x.flatten(1, 2)  # [B, C·N, d]
        text_tokens = self.token_embed(obs["tokens"]) + self.token_pos  # [B, T, d]
        state_token = self.state_proj(obs["state"].to(self.patch_pos.dtype))[:, None]  # [B, 1, d]
        h = torch.cat([image_tokens, text_tokens, state_token], dim=1)  # [B, P, d]
        token_mask = obs["token_mask"].to(torch.bool)
        ones = torch.ones(b, 1, dtype=torch.bool, device=h.device)
        mask = torch.cat([ones.expand(b, image_tokens.shape[1]), token_mask, ones], dim=1)
        attn_mask = mask[:, None, None, :]  # [B, 1, 1, P]: every query sees the valid keys
        keys, values = [], []
        kv_layers = set(c.expert_kv_layers)
        for i, block in enumerate(self.prefix_blocks):
            h, (k, v) = block(h, attn_mask)
            if i in kv_layers:
                keys.append(k)
                values.append(v)
        h = self.prefix_norm(h)
        w = mask.to(h.dtype)[..., None]
        pooled = (h * w).sum(1) / w.sum(1)  # [B, d]
        return PrefixCache(torch.stack(keys), torch.stack(values), mask, pooled)

    # -- expert ------------------------------------------------------------------------------------
    def denoise_step(self, cache: PrefixCache, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Velocity v(x_t, t | prefix): x_t [B, H, A], t [B] (or scalar) -> [B, H, A]."""
        c = self.config
        b = x_t.shape[0]
        if tuple(x_t.shape[1:]) != (c.chunk_size, c.action_dim):
            raise ValueError(
                f"x_t has shape {list(x_t.shape)}, expected [B, {c.chunk_size}, {c.action_dim}]"
            )
        t = torch.as_tensor(t, dtype=x_t.dtype, device=x_t.device).expand(b)
        time = _sinusoidal(t, c.expert_width)[:, None].expand(b, c.chunk_size, -1)
        a = self.action_in(x_t)
        x = self.action_time_mlp(torch.cat([a, time], dim=-1)) + self.action_pos  # [B, H, de]
        ones = torch.ones(b, c.chunk_size, dtype=torch.bool, device=x.device)
        mask = torch.cat([cache.mask, ones], dim=1)[:, None, None, :]  # [B, 1, 1, P + H]
        for j, block in enumerate(self.expert_blocks):
            x, _ = block(x, mask, prefix_kv=(cache.keys[j], cache.values[j]))
        return self.action_out(self.expert_norm(x))

    # -- training ----------------------------------------------------------------------------------
    def flow_matching_loss(
        self,
        batch: dict[str, torch.Tensor],
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scalar flow-matching loss: mean over valid (not `action_is_pad`) steps and action dims
        of |v(x_t, t) - (noise - actions)|², x_t = t · noise + (1 - t) · actions,
        t = 0.001 + 0.999 · Beta(alpha, 1). `noise` [B, H, A] and `time` [B] override sampling."""
        c = self.config
        actions = batch["actions"]
        b = actions.shape[0]
        if tuple(actions.shape) != (b, c.chunk_size, c.action_dim):
            raise ValueError(
                f"batch 'actions' has shape {list(actions.shape)}, expected "
                f"[B, {c.chunk_size}, {c.action_dim}]"
            )
        dev, dtype = actions.device, actions.dtype
        if noise is None:
            noise = torch.randn(actions.shape, generator=generator, device=dev, dtype=dtype)
        if time is None:
            time = self.sample_time((b,), generator, dev, dtype)
        err = self._action_errors(self.embed_prefix(batch), actions, noise, time)
        pad = batch.get("action_is_pad")
        if pad is None:
            return err.mean()
        valid = (~pad.to(torch.bool)).to(err.dtype)
        return (err * valid).sum() / valid.sum().clamp_min(1.0)

    def _action_errors(
        self, cache: PrefixCache, actions: torch.Tensor, noise: torch.Tensor, time: torch.Tensor
    ) -> torch.Tensor:
        """|v(x_t, t) − (noise − actions)|² averaged over A, [B, H]: x_t = t · noise + (1 − t) ·
        actions for actions, noise [B, H, A] and time [B]."""
        tt = time[:, None, None]
        v = self.denoise_step(cache, tt * noise + (1.0 - tt) * actions, time)
        return (v - (noise - actions)).pow(2).mean(-1)

    def sample_time(self, shape, generator=None, device=None, dtype=None) -> torch.Tensor:
        """Flow times of training: 0.001 + 0.999 · Beta(alpha, 1), by inverse CDF (u^(1/alpha))."""
        u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
        return 0.001 + 0.999 * u ** (1.0 / self.config.time_beta_alpha)

    def flow_matching_errors(
        self,
        cache: PrefixCache,
        actions: torch.Tensor,
        noise: torch.Tensor,
        time: torch.Tensor,
        steps: int | None = None,
    ) -> torch.Tensor:
        """Flow-matching error of each of M (noise, time) draws per chunk, [B, M]: the mean over
        the chunk's first `steps` actions (None: all H) and A of |v(x_t, t) − (noise − actions)|²,
        x_t = t · noise + (1 − t) · actions, for actions [B, H, A], noise [B, M, H, A], time
        [B, M] (FPO's per-draw loss; differentiable)."""
        b, m = time.shape
        rep = PrefixCache(
            cache.keys.repeat_interleave(m, 1),
            cache.values.repeat_interleave(m, 1),
            cache.mask.repeat_interleave(m, 0),
            cache.pooled.repeat_interleave(m, 0),
        )
        a = actions[:, None].expand_as(noise).flatten(0, 1)
        err = self._action_errors(rep, a, noise.flatten(0, 1), time.flatten())
        return err[:, :steps].mean(-1).view(b, m)

    def value(self, obs: dict[str, torch.Tensor], cache: PrefixCache | None = None) -> torch.Tensor:
        """State value V(obs) [B] from the pooled prefix (the backbone is shared with the actor;
        detach `cache.pooled` upstream to stop critic gradients reaching it)."""
        cache = self.embed_prefix(obs) if cache is None else cache
        return self.value_head(cache.pooled)[:, 0]

    # -- sampling ----------------------------------------------------------------------------------
    def _initial_noise(self, b: int, noise, generator) -> torch.Tensor:
        c = self.config
        shape = (b, c.chunk_size, c.action_dim)
        if noise is None:
            p = self.action_pos
            return torch.randn(shape, generator=generator, device=p.device, dtype=p.dtype)
        if tuple(noise.shape) != shape:
            raise ValueError(f"noise has shape {list(noise.shape)}, expected {list(shape)}")
        return noise

    def _euler_mean(self, cache: PrefixCache, x: torch.Tensor, k: int) -> torch.Tensor:
        """Deterministic Euler step k: x_{k+1} mean = x_k + dt · v(x_k, t_k), t_k = 1 - k / N."""
        n = self.config.num_flow_steps
        t = torch.full((x.shape[0],), 1.0 - k / n, dtype=x.dtype, device=x.device)
        return x + (-1.0 / n) * self.denoise_step(cache, x, t)

    @torch.no_grad()
    def sample_actions(
        self,
        obs: dict[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        cache: PrefixCache | None = None,
    ) -> torch.Tensor:
        """Deterministic Euler ODE integration from noise [B, H, A] (drawn from `generator` when
        None) at t = 1 to an action chunk [B, H, A] (normalized units) at t = 0. `cache`: the
        prefix of `obs` when already embedded."""
        cache = self.embed_prefix(obs) if cache is None else cache
        x = self._initial_noise(cache.mask.shape[0], noise, generator)
        for k in range(self.config.num_flow_steps):
            x = self._euler_mean(cache, x, k)
        return x

    def noise_std(self) -> torch.Tensor:
        """Flow-noise std [A]: exp(log_noise_std) clamped to [rl_noise_std_min, _max]."""
        c = self.config
        return self.log_noise_std.exp().clamp(c.rl_noise_std_min, c.rl_noise_std_max)

    @staticmethod
    def _gaussian_logp(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """Σ over [H, A] of log N(x; mean, std²): x, mean [B, H, A], std [A] -> [B]."""
        z = (x - mean) / std
        return (-0.5 * z.pow(2) - std.log() - 0.5 * _LOG_2PI).sum((-2, -1))

    @torch.no_grad()
    def sample_with_logprob(
        self,
        obs: dict[str, torch.Tensor],
        generator: torch.Generator | None = None,
        noise: torch.Tensor | None = None,
        cache: PrefixCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Flow-noise sampler (πRL): each Euler step is a Gaussian transition
        x_{k+1} ~ N(x_k + dt · v(x_k, t_k), σ²), σ = `noise_std()`.

        Returns actions [B, H, A] (= trajectory[:, -1]), the denoising trajectory
        [B, N + 1, H, A] (x_0 = initial noise ... x_N) and the log-probability of each of the N
        Gaussian transitions [B, N] (their sum is the chunk's; the N(0, I) density of x_0 does not
        depend on the parameters and is left out). `log_prob(obs, trajectory)` recomputes them
        exactly. `cache`: the prefix of `obs` when already embedded.
        """
        cache = self.embed_prefix(obs) if cache is None else cache
        x = self._initial_noise(cache.mask.shape[0], noise, generator)
        std = self.noise_std()
        traj, logp = [x], []
        for k in range(self.config.num_flow_steps):
            mean = self._euler_mean(cache, x, k)
            eps = torch.randn(mean.shape, generator=generator, device=x.device, dtype=x.dtype)
            x = mean + std * eps
            logp.append(self._gaussian_logp(x, mean, std))
            traj.append(x)
        return x, torch.stack(traj, dim=1), torch.stack(logp, dim=1)

    def log_prob(
        self,
        obs: dict[str, torch.Tensor],
        trajectory: torch.Tensor,
        cache: PrefixCache | None = None,
    ) -> torch.Tensor:
        """Log-probability of each of the N transitions [B, N] of a recorded flow-noise trajectory
        [B, N + 1, H, A] under the current parameters (differentiable; as `sample_with_logprob`).
        `cache`: the prefix of `obs` when already embedded (e.g. shared with `value`)."""
        c = self.config
        shape = (c.num_flow_steps + 1, c.chunk_size, c.action_dim)
        if trajectory.dim() != 4 or tuple(trajectory.shape[1:]) != shape:
            raise ValueError(
                f"trajectory has shape {list(trajectory.shape)}, expected [B, *{list(shape)}]"
            )
        cache = self.embed_prefix(obs) if cache is None else cache
        std = self.noise_std()
        logp = []
        for k in range(c.num_flow_steps):
            mean = self._euler_mean(cache, trajectory[:, k].contiguous(), k)
            logp.append(self._gaussian_logp(trajectory[:, k + 1], mean, std))
        return torch.stack(logp, dim=1)


def num_parameters(config: HoverflyVLAConfig) -> int:
    """Parameter count of `HoverflyVLA(config)`, built on the meta device (allocates nothing)."""
    with torch.device("meta"):
        model = HoverflyVLA(config)
    return sum(p.numel() for p in model.parameters())
