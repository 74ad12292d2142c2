"""Vision-Language-Action models (torch): a compact flow-matching VLA, demonstrations, SFT and RL
post-training in simulation.

Public API, by module (imported from the module: `import vla` itself stays free of torch, so the
data tools run without it):
- `vla.configuration_hoverfly_vla`: `HoverflyVLAConfig` and the presets `TEST` (~1 M parameters),
  `SMALL` (~13 M), `BASE` (~98 M).
- `vla.modeling_hoverfly_vla`: `HoverflyVLA` (image patches + instruction tokens + proprioception
  → prefix transformer → flow-matching action expert over chunks of H actions; deterministic and
  log-prob-carrying stochastic samplers, a value head on the prefix).
- `vla.processor_hoverfly_vla`: the built-in tokenizer, image preprocessing, `NormStats`.
- `vla.checkpoint`: `save_checkpoint` / `load_checkpoint` (config.json + model.safetensors +
  processor.json, written atomically).
- `vla.dataset` (`LeRobotDataset`, `DatasetError`) and `vla.dataset_writer` (`Writer`): datasets
  in the LeRobotDataset layout (v3.0 written; v3.0 and v2.x read).
- `vla.collect`: `collect` scripted-expert demonstrations with rendered cameras and an instruction
  per episode (`hoverfly vla collect`).
- `vla.configuration_sft` (`SFTConfig`, torch-free) and `vla.sft`: `train_sft` (resumable),
  `evaluate_closed_loop` in the MJX arm env (`hoverfly vla sft`).
- `vla.export_onnx`: `export_vla_onnx` (prefix + one denoise step, parity-checked against torch;
  `hoverfly export VLA_RUN --out DIR`).
"""
