"""The torch reference kernel (optional: ``pip install '.[kernel]'``): exact ring, striped, zigzag and
Ulysses attention over torch.distributed; docs/kernel.md walks through each variant.

Importing this package does not import torch; the modules below do.

- :mod:`~costmodel.kernel.masks`: the one mask rule by global position (causal, varlen) and block plans
- :mod:`~costmodel.kernel.block`: block attention with LSE (fused SDPA op, fp32 fallback), the merges
- :mod:`~costmodel.kernel.comm`: ``RingComm`` (batched isend/irecv) and all-to-all
- :mod:`~costmodel.kernel.ring`: ring attention forward and backward, one loop for every layout
- :mod:`~costmodel.kernel.ulysses`: Ulysses all-to-all attention
- :mod:`~costmodel.kernel.inference`: the inference variants: pass-Q ring prefill, decode merge of (O, LSE)
- :mod:`~costmodel.kernel.sharding`: layout shard / unshard of full tensors
- :mod:`~costmodel.kernel.reference`: float64 naive attention with the same mask rule
- :mod:`~costmodel.kernel.launch`: run a function on N local processes or under torchrun
- :mod:`~costmodel.kernel.timing`: timings the calibration builds on
- :mod:`~costmodel.kernel.selftest`, :mod:`~costmodel.cli.kernel`: ``cp-plan kernel selftest``
"""

# The CLI's dtype names (costmodel.machines.profiles.Dtype) to torch's; fp8 has no reference kernel.
TORCH_DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
