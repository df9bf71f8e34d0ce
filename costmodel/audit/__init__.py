"""What users already measure, read back: training logs (Megatron-LM, torchtitan) compared with the step
model, and nccl-tests tables turned into a measured profile. No torch here."""
