"""Write the audit test data: training logs in Megatron-LM's and torchtitan's printed formats and
nccl-tests tables, from a known "true" cluster, so that the tests know what the audit should find.

The true cluster is h100-nvlink whose matrix multiplies run at 85 % of the published table, attention at
72 % (an FA2-class kernel where the table is FA3's), HBM at 90 %, and whose links carry 70 % of the
datasheet; every step also pays 60 ms the model does not know (data loading, the Python loop), and each
interval ±1.5 % noise. Two factors cannot describe that cluster exactly, so a profile fitted to some runs
predicts the others only approximately, as it would on real logs. Run from the repository:
``python tests/data/audit/generate.py`` (the files are committed; a test holds them to what this writes).
"""

from __future__ import annotations

import random
from pathlib import Path

from costmodel.audit.compare import _memory_fit
from costmodel.audit.fit import Run, predict
from costmodel.machines.profiles import load_profile, parse_profile
from costmodel.plans.job import Job
from costmodel.training.step import evaluate_step

HERE = Path(__file__).parent
GEMM, ATTENTION, HBM, LINKS, HOST_S = 0.85, 0.72, 0.90, 0.70, 0.060
HOST_OVERHEAD = 1.0  # every step's time is the true model's plus HOST_S
NOISE = random.Random(20261130)


def true_profile():
    data = load_profile("h100-nvlink").model_dump(mode="python", exclude_none=True)
    kernels = data["kernels"]
    kernels["gemm"]["flops_per_s"] = [r * GEMM for r in kernels["gemm"]["flops_per_s"]]
    for curve in kernels["attention"]:
        curve["flops_per_s"] = [r * ATTENTION for r in curve["flops_per_s"]]
    data["device"]["hbm_bandwidth"] *= HBM
    for link in data["links"].values():
        link["bandwidth_per_direction"] *= LINKS
        link.pop("bandwidth_bidirectional", None)
    return parse_profile(data, "true cluster")


TRUE = true_profile()

MEGATRON_RUNS = {
    "megatron_tp2_cp2_8k": dict(gpus=8, tp=2, cp=2, seq=8192, global_batch=16, cp_comm="p2p"),
    "megatron_tp2_cp4_32k": dict(gpus=8, tp=2, cp=4, seq=32768, global_batch=8, cp_comm="p2p"),
    "megatron_tp2_cp8_128k": dict(
        gpus=16, tp=2, cp=8, seq=131072, global_batch=2, cp_comm="p2p", recompute="full"
    ),
    "megatron_tp4_cp1_4k_full": dict(gpus=8, tp=4, cp=1, seq=4096, global_batch=64, recompute="full"),
}


def true_step(values: dict) -> dict:
    step = predict(Run("truth", values, 1.0), TRUE).model_dump()
    return step | {"time_s": step["time_s"] + HOST_S}


def reserved_bytes(values: dict) -> float:
    """What the allocator holds at peak: the plan's fit, which counts the framework's reserve beyond the tensors
    (its profile's fragmentation and runtime use)."""
    job = Job.of(**values)
    return _memory_fit(evaluate_step(job), job)["total_bytes"]


def megatron_args(cfg: dict) -> list[str]:
    args = {
        "accumulate_allreduce_grads_in_fp32": "True",
        "bf16": "True",
        "context_parallel_size": cfg["cp"],
        "cp_comm_type": f"['{cfg.get('cp_comm', 'p2p')}']",
        "ffn_hidden_size": 14336,
        "fp8": "None",
        "global_batch_size": cfg["global_batch"],
        "group_query_attention": "True",
        "hidden_size": 4096,
        "kv_channels": 128,
        "log_interval": 10,
        "micro_batch_size": 1,
        "num_attention_heads": 32,
        "num_layers": 32,
        "num_query_groups": 8,
        "pipeline_model_parallel_size": 1,
        "recompute_granularity": cfg.get("recompute", "selective"),
        "seq_length": cfg["seq"],
        "sequence_parallel": cfg["tp"] > 1,
        "tensor_model_parallel_size": cfg["tp"],
        "train_iters": 500,
        "use_distributed_optimizer": "True",
        "virtual_pipeline_model_parallel_size": "None",
        "world_size": cfg["gpus"],
    }
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(args.items())]
    return lines + ["-------------------- end of arguments ---------------------"]


def megatron_log(name: str, cfg: dict, restart_at: int | None = None) -> None:
    values = {
        "model": "llama3-8b",
        "hw": "h100-nvlink",
        "gpus": cfg["gpus"],
        "tp": cfg["tp"],
        "cp": cfg["cp"],
        "seq": cfg["seq"],
        "global_batch": cfg["global_batch"],
        "recompute": cfg.get("recompute", "selective"),
    }
    step = true_step(values)
    job = Job.of(**values)
    ours = evaluate_step(job).step.model_dump()
    flops_per_step = ours["model_tflops_per_gpu_full_square"] * ours["time_s"]  # as Megatron counts: full S²
    base = step["time_s"] * HOST_OVERHEAD
    reserved_mb = reserved_bytes(values) / 1024**2
    out = [
        "WARNING: one_logger package is required to enable e2e metrics tracking.",
        "using world size: "
        f"{cfg['gpus']}, data-parallel size: {cfg['gpus'] // (cfg['tp'] * cfg['cp'])}, context-parallel size: "
        f"{cfg['cp']}, tensor-model-parallel size: {cfg['tp']}, pipeline-model-parallel size: 1",
    ]
    out += megatron_args(cfg)
    out += ["> initializing torch distributed ...", "[default1]:NCCL INFO Bootstrap : Using eth0:10.0.0.2<0>"]

    def iterations(start: int, stop: int, segment: int) -> None:
        for it in range(start, stop + 1, 10):
            t = base * (1 + NOISE.uniform(-0.015, 0.015))
            if it == start:
                t *= 1.6  # warm-up: allocator, NCCL communicators
            tflops = flops_per_step / t * 0.98  # Megatron's count sits a little below ours
            line = (
                f" [2026-11-2{segment} 10:{it % 60:02d}:00] iteration {it:8d}/{500:8d} | consumed samples: "
                f"{it * cfg['global_batch']:12d} | elapsed time per iteration (ms): {t * 1e3:.1f} | "
                f"throughput per GPU (TFLOP/s/GPU): {tflops:.1f} | learning rate: 1.500000E-04 | global batch "
                f"size: {cfg['global_batch']:5d} | lm loss: {9.0 - it / 100:.6E} | loss scale: 1.0 | grad norm: "
                "1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |"
            )
            out.append(f"[default{cfg['gpus'] - 1}]:{line}")
            if it == start:
                out.append(
                    f"[default0]:[Rank 0] (after {it} iterations) memory (MB) | allocated: 30000.1 | max allocated: "
                    f"{reserved_mb * 0.9:.1f} | reserved: {reserved_mb * 0.98:.1f} | max reserved: {reserved_mb:.1f}"
                )
            out.append(
                f"[default{NOISE.randrange(cfg['gpus'])}]:NCCL INFO comm 0x5555 rank 3 nranks 8 - Init COMPLETE"
            )

    iterations(10, restart_at or 100, 1)
    if restart_at:
        out.append("[default0]: [after training is done] datetime: 2026-11-21 11:00:00 ")
        out += ["Traceback (most recent call last):", "torch.distributed.DistBackendError: NCCL error"]
        out += megatron_args(cfg)
        out.append(" loading checkpoint from /ckpt at iteration 30")
        iterations(40, 120, 2)
    (HERE / f"{name}.log").write_text("\n".join(out) + "\n", encoding="utf-8")


TITAN_TOML = """[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[model]
name = "llama3"
flavor = "8B"

[training]
local_batch_size = {local}
seq_len = {seq}
steps = 100

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = {shard}
tensor_parallel_degree = {tp}
context_parallel_degree = {cp}
pipeline_parallel_degree = 1

[activation_checkpoint]
mode = "selective"
"""
COLOURS = {
    "red": "\x1b[31m",
    "green": "\x1b[32m",
    "orange": "\x1b[33m",
    "turquoise": "\x1b[36m",
    "blue": "\x1b[34m",
    "cyan": "\x1b[36m",
    "magenta": "\x1b[35m",
    "reset": "\x1b[39m",
}


def titan_log(
    name: str, shard: int, tp: int, cp: int, seq: int, local: int, cp_inactive: bool = False
) -> None:
    gpus = shard * tp * cp
    values = {
        "model": "llama3-8b",
        "hw": "h100-nvlink",
        "gpus": gpus,
        "tp": tp,
        "cp": cp,
        "seq": seq,
        "global_batch": local * shard,
        "cp_scheme": "allgather",
        "zero": 3,
    }
    step = true_step(values)
    if cp_inactive:  # CP silently off: each rank attends only within its own chunk, nothing is exchanged
        skipped = ("attention_s", "exposed_cp_s", "cp_ring_overhead_s", "recompute_s")
        gone = sum(step["breakdown"][k] for k in skipped) * (1 - 1 / cp)
        step = step | {"time_s": step["time_s"] - gone}
    job = Job.of(**values)
    ours = evaluate_step(job).step.model_dump()
    flop_per_token = ours["model_tflops_per_gpu_full_square"] * 1e12 / ours["tokens_per_s_per_gpu"]
    reserved_gib = reserved_bytes(values) / 1024**3
    tokens = local * shard * seq
    (HERE / f"{name}.toml").write_text(
        TITAN_TOML.format(local=local, seq=seq, shard=shard, tp=tp, cp=cp), encoding="utf-8"
    )
    c = COLOURS
    out = []
    for rank in range(min(gpus, 4)):
        p = f"[rank{rank}]:[titan] 2026-11-30 09:00:0{rank},000 - root - INFO - "
        out += [
            p + "Starting job: Llama 3 8B training",
            p + f"Building {sum(x > 1 for x in (shard, cp, tp))}-D device mesh with "
            f"['dp_shard', 'cp', 'tp'], [{shard}, {cp}, {tp}]",
            p + "CUDA capacity: NVIDIA H100 80GB HBM3 with 79.19GiB memory",
            p
            + "Building llama3 8B with TransformerModelArgs(_enforced='This field is used to enforce all fields have defaults.', dim=4096, n_layers=32)",
        ]
    p = "[rank0]:[titan] 2026-11-30 09:00:09,000 - root - INFO - "
    out += [
        p + "Peak FLOPS used for computing MFU: 9.890e+14",
        p
        + f"Trainer is initialized with local batch size {local}, global batch size {local * shard}, gradient "
        f"accumulation steps 1, sequence length {seq}, total steps 100 (warmup 200).",
        "[rank0]:[titan] 2026-11-30 09:00:10,000 - root - INFO - Training starts at step 1.",
    ]
    for s in [1] + list(range(10, 101, 10)):
        t = step["time_s"] * HOST_OVERHEAD * (1 + NOISE.uniform(-0.015, 0.015)) * (3.0 if s == 1 else 1.0)
        tps = tokens / (t * gpus)
        tflops = flop_per_token * tps / 1e12
        for rank in (0, 1) if s % 20 == 0 else (0,):
            out.append(
                f"[rank{rank}]:[titan] 2026-11-30 09:{s // 60:02d}:{s % 60:02d},123 - root - INFO - {c['red']}step: {s:2}  "
                f"{c['green']}loss: {10.5 - s / 20:7.4f}  {c['orange']}grad_norm: {1.2:7.4f}  {c['turquoise']}memory: "
                f"{reserved_gib:5.2f}GiB({100 * reserved_gib / 79.19:.2f}%)  {c['blue']}tps: {round(tps):,}  {c['cyan']}tflops: {tflops:,.2f}  "
                f"{c['magenta']}mfu: {100 * tflops / 989:.2f}%{c['reset']}"
            )
        out.append("[rank3]:[titan] 2026-11-30 09:00:00,000 - root - WARNING - Dataset c4 is being re-looped")
    (HERE / f"{name}.log").write_text("\n".join(out) + "\n", encoding="utf-8")


def nccl(name: str, collective: str, ranks: int, hosts: list[str], alpha: float, busbw: float) -> None:
    factor = {"all_reduce": 2 * (ranks - 1) / ranks, "sendrecv": 1.0}.get(collective, (ranks - 1) / ranks)
    redop = "sum" if collective in ("all_reduce", "reduce_scatter") else "none"
    lines = [
        "# nccl-tests version 2.17.6 nccl-headers=22602 nccl-library=22602",
        f"# Collective test starting: {collective}_perf",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0",
        "#",
        "# Using devices",
    ]
    per = ranks // len(hosts)
    for r in range(ranks):
        lines.append(
            f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on {hosts[r // per]:>10} device {r % per:2d} [0000:{r:02x}:00] NVIDIA H100 80GB HBM3"
        )
    lines += [
        "#",
        "#                                                              out-of-place                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ",
    ]
    size = 8
    while size <= 8 * 1024**3:
        row = f"{size:12d}  {size // 4:12d}     float  {redop:>6}      -1"
        for _ in range(2):
            t = (alpha + size * factor / busbw) * (1 + NOISE.uniform(-0.02, 0.02))
            alg = size / t / 1e9
            row += f"  {t * 1e6:7.2f}  {alg:6.2f}  {alg * factor:6.2f}  {0:5d}"
        lines.append(row)
        size *= 2
    lines += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {busbw / 1e9 * 0.6:.3f} ", "#", ""]
    (HERE / f"{name}.txt").write_text("\n".join(lines), encoding="utf-8")


def main() -> None:
    for name, cfg in MEGATRON_RUNS.items():
        megatron_log(name, cfg, restart_at=50 if name == "megatron_tp2_cp8_128k" else None)
    titan_log("titan_cp2_16k", shard=4, tp=1, cp=2, seq=16384, local=1)
    titan_log("titan_cp4_over_peak", shard=2, tp=1, cp=4, seq=131072, local=1, cp_inactive=True)
    one = ["node001"]
    two = ["node001", "node002"]
    nccl("nccl_1node_all_reduce_perf", "all_reduce", 8, one, 18e-6, 360e9)
    nccl("nccl_1node_all_gather_perf", "all_gather", 8, one, 12e-6, 350e9)
    nccl("nccl_1node_reduce_scatter_perf", "reduce_scatter", 8, one, 12e-6, 345e9)
    nccl("nccl_1node_alltoall_perf", "alltoall", 8, one, 15e-6, 320e9)
    nccl("nccl_1node_sendrecv_perf", "sendrecv", 8, one, 8e-6, 330e9)
    nccl("nccl_2node_all_gather_perf", "all_gather", 16, two, 30e-6, 42e9)
    nccl("nccl_2node_alltoall_perf", "alltoall", 16, two, 40e-6, 38e9)
    nccl("nccl_2node_sendrecv_perf", "sendrecv", 16, two, 20e-6, 45e9)


if __name__ == "__main__":
    main()
