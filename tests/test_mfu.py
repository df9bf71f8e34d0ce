"""MFU and HFU are physical: the model FLOP follow the trained mask, and no accepted plan runs faster
than the device's peak."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.core.errors import InputError
from costmodel.machines.profiles import builtin_names
from costmodel.plans.job import Job
from costmodel.plans.models import ModelPreset
from costmodel.training.search import Constraints, enumerate_plans, evaluate_table
from costmodel.training.step import evaluate_step

PLANS_WANTED = 10_000


@st.composite
def models(draw: st.DrawFn) -> ModelPreset:
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.sampled_from([1, 2, 4, 8]))
    head_dim = draw(st.sampled_from([64, 96, 128]))
    hidden = heads * head_dim
    return ModelPreset(
        name="random",
        source="generated",
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        layers=draw(st.sampled_from([2, 4, 8, 12, 16, 32])),
        hidden=hidden,
        ffn_hidden=hidden * draw(st.sampled_from([2, 3, 4])),
        vocab=draw(st.sampled_from([32_000, 50_304, 128_256])),
        gated_mlp=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
    )


def test_mfu_and_hfu_stay_at_or_under_100_percent_on_random_plans() -> None:
    """Property over at least 10,000 accepted plans (every layout the search enumerates for a random model,
    machine, sequence and mask): MFU <= HFU <= 100 %, MFU counting the mask's pairs."""
    counted: list[int] = []
    masks: list[bool] = []

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(
        model=models(),
        hw=st.sampled_from(builtin_names()),
        seq=st.sampled_from([2048, 4096, 4096, 8192, 32768, 131072, 524288]),
        gpus=st.sampled_from([8, 16, 32, 64]),
        mask=st.sampled_from(["causal", "causal", "docs", "window"]),
        zero=st.sampled_from([0, 1, 3]),
    )
    def prop(model: ModelPreset, hw: str, seq: int, gpus: int, mask: str, zero: int) -> None:
        masked = seq <= 4096  # the mask simulator runs per shape: modest windows keep the test fast
        extra = {}
        if masked and mask == "docs":
            extra = {"docs": f"{seq // 2},{seq // 8}x2,{seq // 32}x6"}
        elif masked and mask == "window":
            extra = {"window": seq // 4}
        job = Job.of(seq=seq, hw=hw, gpus=gpus, zero=zero, _model=model, **extra)
        table, _ = enumerate_plans(job, gpus, Constraints())
        if not len(table):
            return
        result = evaluate_table(table, job)
        assert (result["mfu"] > 0).all()
        assert (result["mfu"] <= result["hfu"] * (1 + 1e-9)).all()
        assert (result["hfu"] <= 1 + 1e-9).all(), float(result["hfu"].max())
        counted.append(len(table))
        masks.append(bool(extra))

    prop()
    print(f"MFU property: {sum(counted)} plans in {len(counted)} searches, {sum(masks)} masked")
    assert sum(counted) >= PLANS_WANTED, sum(counted)
    assert sum(masks) >= 5


def test_packed_documents_count_the_pairs_the_kernel_runs() -> None:
    """The same documents scaled to a 16K window: MFU counts c = 0.1376 of the square; no full-square figure,
    whose S² pairs are no share of the documents' attention."""
    step = evaluate_step(
        Job.of(
            model="llama3-8b",
            seq=16384,
            hw="h100-nvlink",
            gpus=8,
            tp=2,
            cp=2,
            global_batch=32,
            recompute="full",
            layout="striped",
            docs="8k,2k,1kx2,256x6,128x4,64x4",
        )
    ).model_dump(by_alias=True)["step"]
    assert step["attention_fraction"] == pytest.approx(0.1376, abs=5e-4)
    assert step["mfu"] == pytest.approx(0.3765, abs=0.003)
    assert step["mfu_full_square"] is None
    assert step["mfu"] <= step["hfu"] <= 1


def test_the_128k_plan_with_documents_reports_mfu_under_100_percent() -> None:
    """Packed documents of 64K..512 in 128K windows: the full square counts 6.4x the pairs the varlen
    kernel runs; the headline MFU counts those it runs (c ~ 0.138), and no full-square figure (it was 156 %)."""
    step = evaluate_step(
        Job.of(
            model="llama3-8b",
            seq=131072,
            hw="h100-nvlink",
            gpus=8,
            tp=2,
            cp=2,
            global_batch=32,
            recompute="full",
            layout="striped",
            docs="64k,16k,8kx2,2kx6,1kx4,512x4",
        )
    ).model_dump(by_alias=True)["step"]
    assert step["attention_fraction"] == pytest.approx(0.1376, abs=5e-4)
    assert step["mfu"] == pytest.approx(0.369, abs=0.005)
    assert step["mfu_full_square"] is None  # 1.559 before: S² pairs the documents never attend
    assert step["mfu"] <= step["hfu"] <= 1
    assert "c = 0.1376" in step["mfu_convention"]


def test_causal_mfu_counts_half_the_square() -> None:
    step = evaluate_step(
        Job.of(
            model="llama3-8b",
            seq=131072,
            hw="h100-nvlink",
            gpus=8,
            tp=2,
            cp=2,
            global_batch=32,
            recompute="full",
            layout="striped",
        )
    ).model_dump(by_alias=True)["step"]
    assert step["attention_fraction"] == 0.5
    assert step["mfu"] == pytest.approx(0.358, abs=0.002)
    assert step["mfu_full_square"] == pytest.approx(0.607, abs=0.002)
    assert step["mfu"] < step["hfu"] < 1


def test_a_profile_faster_than_its_peak_is_an_error_not_a_number(tmp_path) -> None:
    import yaml

    from costmodel.machines.profiles import data_dir

    profile = yaml.safe_load((data_dir("hardware") / "h100-nvlink.yaml").read_text(encoding="utf-8"))
    profile["device"]["peak_flops"]["bf16"] /= 4  # the kernel tables now run at up to 3x the peak
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(profile), encoding="utf-8")
    with pytest.raises(
        InputError, match=r"is above (device\.)?peak_flops\.bf16 .*no kernel runs faster"
    ) as error:
        evaluate_step(Job.of(model="llama3-8b", seq=8192, hw=str(path), gpus=8, global_batch=8)).model_dump(
            by_alias=True
        )
    assert error.value.field == "--hw"
