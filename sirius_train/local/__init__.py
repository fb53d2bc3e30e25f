"""The one-process backend: HF models on the CPU or one GPU (model, rollout, DAPO trainer, SFT, checkpoints)."""
