"""Long-context inference under TP x CP x PP: memory per device, the prefill (time to first token) with
pass-KV, pass-Q or all-gather CP, and decode (time per output token) with a sharded KV cache ([CP-Infer])."""
