"""The report's schema: what ``cp-plan --format json`` prints (SPEC §7).

Stable and versioned by the top-level ``schema``. All values in SI units (bytes, FLOP, seconds,
FLOP/byte), unrounded. docs/json-schema.md is generated from these models.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from costmodel.hardware import Dtype
from costmodel.layouts import Layout
from costmodel.verdict import Colour

SCHEMA = "cp-plan/report/v1"


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)


class Inputs(_Section):
    seq: int = Field(description="S, sequence length in tokens")
    n: int = Field(description="N, CP degree")
    batch: int = Field(description="b")
    heads: int = Field(description="h, query heads")
    kv_heads: int = Field(description="n_kv, key/value heads")
    head_dim: int = Field(description="d")
    bytes_per_element: int = Field(description="p, from dtype")
    dtype: Dtype
    block: int = Field(description="s_blk, compute tile rows")
    causal: bool
    layout: Layout
    efficiency: float = Field(description="effective / peak FLOP/s asked for (--efficiency)")
    hw: str = Field(description="hardware profile name")
    model: str | None = Field(description="model preset, when the shape came from one")


class Hardware(_Section):
    name: str
    source: str = Field(description="datasheet or measured")
    peak_flops: float = Field(description="FLOP/s, dense, for the dtype")
    effective_flops: float = Field(description="FLOP/s the model uses: measured, or peak x efficiency")
    link: str = Field(description="the link the ring waits on")
    link_scope: str = Field(description="intra-node or inter-node")
    link_bandwidth: float = Field(description="B, bytes/s per direction")
    latency: float = Field(description="alpha, s per message")
    beta: float = Field(description="effective FLOP/s / B, FLOP/byte")
    beta_peak: float = Field(description="peak FLOP/s / B, FLOP/byte (the seed's beta)")
    devices_per_node: int
    cp_ranks_per_node: int


class Memory(_Section):
    scores_full_bytes: float = Field(description="b·h·S²·p, full score matrix")
    scores_query_block_bytes: float = Field(description="b·h·s_blk·S·p, query block x all keys")
    scores_tile_bytes: float = Field(description="b·h·s_blk²·p, one tile")
    kv_block_bytes: float = Field(description="b·L·2·n_kv·d·p, the KV block in flight")
    kv_tile_bytes: float = Field(description="b·s_blk·2·n_kv·d·p, the KV of one tile")
    softmax_state_bytes: float = Field(description="fp32 (m, l, O) of one shard's queries")


class Compute(_Section):
    total_flops: float = Field(description="one layer, all devices (causal: useful half)")
    device_flops_per_layer: float = Field(description="W")
    step_flops: float = Field(description="W_step")


class Ring(_Section):
    recv_bytes_per_layer: float
    send_bytes_per_layer: float
    step_recv_bytes: float
    intensity_step: float = Field(description="FLOP/byte; causal halves it")
    intensity_layer: float | None = Field(description="FLOP/byte; null at N = 1 (nothing received)")
    step_compute_s: float = Field(description="balanced step compute (seed rule)")
    step_comm_s: float = Field(description="alpha + block / B")
    layer_compute_s: float
    layer_comm_s: float = Field(description="receive side, N-1 blocks")
    layer_send_s: float = Field(description="send side counting the own block")
    comm_ratio_step: float = Field(description="the verdict's ratio, at effective FLOP/s")
    comm_ratio_step_peak: float = Field(description="the same at peak FLOP/s")
    comm_ratio_layer: float
    verdict: Colour
    verdict_text: str
    n_max: float = Field(description="largest N with ratio <= 100 % on this plan's link (the seed's bound)")
    n_max_intra_node: float | None = Field(description="the bound with the intra-node link")
    n_max_inter_node: float | None = Field(description="the bound with the inter-node link")
    n_max_green: int = Field(description="largest N whose ratio stays below 5 %, topology included")
    n_max_amber: int = Field(description="largest N whose ratio stays at or below 15 %, topology included")
    critical_shard_tokens: float = Field(description="L*: shard length where step comm = step compute")
    layer_time_s: float = Field(
        description="predicted layer wall time: tile-level causal schedule of this layout, transfers overlapped"
    )


class Ulysses(_Section):
    feasible: bool
    reason: str
    kv_heads: int | None = Field(description="KV heads after replication to N")
    recv_bytes_per_layer: float | None
    comm_s: float | None = Field(description="both all-to-alls; not overlapped with attention")
    comm_ratio: float | None = Field(description="comm_s / layer compute")
    link_scope: str


class USPEntry(_Section):
    n_ulysses: int = Field(description="N_u: all-to-all degree, inside a node where it fits")
    n_ring: int = Field(description="N_r: ring degree")
    feasible: bool
    reason: str
    kv_heads: int | None
    a2a_recv_bytes_per_layer: float | None
    ring_recv_bytes_per_layer: float | None
    recv_bytes_per_layer: float | None
    a2a_comm_s: float | None
    ring_comm_ratio_step: float | None
    ring_verdict: Colour | None
    a2a_link_scope: str
    ring_link_scope: str


class TP(_Section):
    bytes_per_layer: float = Field(description="4·b·S·h·d·p")
    ratio_to_ring: float | None = Field(description="null at N = 1")


class LayoutUtilization(_Section):
    contiguous: float | None
    striped: float | None
    zigzag: float | None = Field(description="null when S does not split into 2N chunks")


class Causal(_Section):
    utilization_coarse: float = Field(description="(N+1)/2N, seed 000 §6")
    utilization_fine: float = Field(description="N/(2N-1), seed 000 §6")
    tile: int = Field(description="tile of the simulator, = --block")
    utilization: LayoutUtilization = Field(description="tile-level simulator, SPEC §4.1")


class Report(_Section):
    model_config = ConfigDict(frozen=True, defer_build=True, populate_by_name=True)

    schema_: str = Field(SCHEMA, alias="schema")
    inputs: Inputs
    hardware: Hardware
    memory: Memory
    compute: Compute
    ring: Ring
    ulysses: Ulysses
    usp: list[USPEntry]
    tp: TP
    causal: Causal
    notes: list[str] = Field(description="topology and caveats, one sentence each")
