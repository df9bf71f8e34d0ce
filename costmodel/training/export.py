"""A searched plan in a framework's own words: Megatron-LM command-line arguments, torchtitan job-file tables.

Every name was read from the frameworks' sources (docs/search.md cites the files and commits):

- Megatron-LM ``megatron/training/arguments.py``: ``--cp-comm-type``, ``--use-distributed-optimizer``,
  ``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--num-virtual-stages-per-pipeline-rank``,
  ``--seq-length`` are declared there; the parallel sizes, ``--sequence-parallel`` and the
  ``--recompute-*`` flags are generated from the fields of ``megatron/core/model_parallel_config.py`` and
  ``megatron/core/transformer/transformer_config.py`` (``megatron/training/argument_utils.py``: a field
  ``x_y`` is ``--x-y``, a list is ``nargs='+'``, a false boolean is ``store_true``), the batch sizes from
  ``megatron/training/config/training_config.py``.
- torchtitan ``torchtitan/config/job_config.py``: the ``[training]``, ``[parallelism]`` and
  ``[activation_checkpoint]`` tables of its TOML job files. Later torchtitan configures jobs in Python
  (``torchtitan/config/configs.py``: the parallel degrees keep these names; batches are counted in tokens).
"""

from __future__ import annotations

from typing import Any

from costmodel.core.errors import InputError
from costmodel.plans import cp as registry
from costmodel.plans.stages import StageSplit

# The releases whose configuration code the names below were read from (and the tests hold them to).
MEGATRON_VERSION = "Megatron-LM core_v0.17.1"
TORCHTITAN_VERSION = "torchtitan v0.2.2"  # its last release read from TOML job files

# Each scheme names its own setting (cp.Scheme.exports): Megatron-LM's --cp-comm-type (p2p is the ring, a2a
# Ulysses, a2a+p2p USP) and torchtitan's context_parallel_rotate_method (alltoall shuffles K, V shards round
# the ring).


def megatron_arguments(
    plan: dict[str, Any], seq: int, global_batch: int, zero: int, zero_shard: int | None = None
) -> list[str]:
    """The plan as arguments of Megatron-LM's ``pretrain_gpt.py`` (model shape and data flags left to the user);
    hybrid sharding as the distributed optimizer's instances, one per group of ``zero_shard`` ranks."""
    args = [
        "--tensor-model-parallel-size",
        str(plan["tp"]),
        "--pipeline-model-parallel-size",
        str(plan["pp"]),
        "--context-parallel-size",
        str(plan["cp"]),
    ]
    if plan["vpp"] > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(plan["vpp"])]
    for flag, value in (
        StageSplit.of(plan).megatron_args().items()
    ):  # an uneven split: its first and last stages
        args += [f"--{flag}", str(value)]
    if plan.get("ep", 1) > 1:
        args += ["--expert-model-parallel-size", str(plan["ep"])]
    if plan["cp"] > 1:
        args += registry.get(plan["cp_scheme"]).megatron_args(plan)
    if plan["tp"] > 1:
        args.append("--sequence-parallel")
    if plan.get("tp_comm_overlap"):  # Transformer Engine's userbuffers: TP collectives pipelined with GEMMs
        args.append("--tp-comm-overlap")
    args += [
        "--micro-batch-size",
        str(plan["micro_batch"]),
        "--global-batch-size",
        str(global_batch),
        "--seq-length",
        str(seq),
    ]
    if plan["recompute"] == "full":
        args += [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            "1",
        ]
    elif (
        plan["recompute"] == "selective"
    ):  # Megatron's default module for it is core_attn: the attention core
        args += ["--recompute-granularity", "selective"]
    return args + _megatron_data_parallel(plan["dp"] * plan["cp"], zero, zero_shard)


def _megatron_data_parallel(weights: int, zero: int, zero_shard: int | None) -> list[str]:
    """The gradient reduction and the optimizer's sharding over the ``weights`` ranks holding the same weights
    (DP x CP)."""
    args = []
    if zero >= 1:  # the distributed optimizer shards optimizer states (and, reduce-scattered, gradients)
        args.append("--use-distributed-optimizer")
        instances = weights // (zero_shard or weights)
        if instances > 1:  # partial distributed optimizer: sharded in each group, replicated across them
            args += ["--num-distributed-optimizer-instances", str(instances)]
    if weights > 1:  # the step model hides all but the last gradient bucket
        args.append("--overlap-grad-reduce")
        if zero >= 1:
            args.append("--overlap-param-gather")
    return args


def torchtitan_tables(
    plan: dict[str, Any], seq: int, global_batch: int, zero: int, zero_shard: int | None = None
) -> dict[str, dict[str, Any]]:
    """The plan as torchtitan job-file tables, by table name; FSDP (ZeRO-3) shards over DP when ``zero`` is 3, else DP
    replicates (torchtitan has no ZeRO-1 or -2). FSDP shards over its dp_shard x CP mesh: hybrid sharding's
    groups of ``zero_shard`` ranks are zero_shard / CP of DP (HSDP), replicated over the rest."""
    dp, shard = plan["dp"], zero == 3
    check_torchtitan_runs(plan, zero)
    sharded = dp
    if shard and zero_shard is not None:
        if zero_shard % plan["cp"]:
            raise InputError(
                "--zero-shard",
                f"{TORCHTITAN_VERSION}'s FSDP shards over its dp_shard x CP mesh: give a multiple of CP {plan['cp']}",
            )
        sharded = zero_shard // plan["cp"]
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": dp // sharded if shard else dp,
        "data_parallel_shard_degree": sharded if shard else 1,
        "tensor_parallel_degree": plan["tp"],
        "pipeline_parallel_degree": plan["pp"],
        "context_parallel_degree": plan["cp"],
    }
    if plan.get("tp_comm_overlap"):  # AsyncTP: the TP collectives decomposed and pipelined with the matmuls
        parallelism["enable_async_tensor_parallel"] = True
    if plan["pp"] > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if plan["vpp"] > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = plan["micro_batch"]
        parallelism.update(_torchtitan_stages(StageSplit.of(plan), plan["vpp"]))
    if plan["cp"] > 1:
        parallelism["context_parallel_rotate_method"] = registry.get(plan["cp_scheme"]).exports["torchtitan"]
    # With PP the local batch is split into micro-batches; without, it is one forward and torchtitan
    # accumulates gradients up to the global batch.
    local = global_batch // dp if plan["pp"] > 1 else plan["micro_batch"]
    training = {"local_batch_size": local, "global_batch_size": global_batch, "seq_len": seq}
    checkpoint: dict[str, Any] = {"mode": plan["recompute"]}
    if plan["recompute"] == "selective":
        checkpoint["selective_ac_option"] = "op"
    tables = {"training": training, "parallelism": parallelism, "activation_checkpoint": checkpoint}
    if plan.get(
        "tp_comm_overlap"
    ):  # async TP runs only in the compiled model (maybe_enable_async_tp refuses)
        tables["compile"] = {"enable": True, "components": ["model", "loss"]}
    return tables


def check_torchtitan_runs(plan: dict[str, Any], zero: int) -> None:
    """Refuse a plan torchtitan would refuse: below ZeRO-3 its data parallelism is DDP, which it runs only as
    the one parallel dimension ("DDP has not supported > 1D parallelism"; with CP it shards over CP anyway)."""
    if zero < 3 and plan["dp"] > 1 and plan["cp"] == 1 and (plan["tp"] > 1 or plan["pp"] > 1):
        raise InputError(
            "--zero",
            f"{TORCHTITAN_VERSION} runs ZeRO-{zero}'s data parallelism (DDP) only alone, not beside TP "
            f"{plan['tp']} x PP {plan['pp']}; plan with --zero 3 (its FSDP), the default for --format torchtitan",
        )


def _torchtitan_stages(split: StageSplit, vpp: int) -> dict[str, int]:
    """torchtitan's split: model chunks of ``layers_per_stage`` layers, the first and the last chunk
    ``first/last_stage_less_layers`` fewer (its defaults, 1 and 1, stand in for the embedding and the loss:
    stated always, so the chunks are the plan's)."""
    widest = max(split.first, split.last, split.middle if split.pp > 2 else 0)
    per = -(-widest // vpp)
    return {
        "pipeline_parallel_layers_per_stage": per,
        "pipeline_parallel_first_stage_less_layers": vpp * per - split.first,
        "pipeline_parallel_last_stage_less_layers": vpp * per - split.last,
    }
