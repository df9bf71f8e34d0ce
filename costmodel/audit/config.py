"""A logged run's configuration, named as ``cp-plan step``'s flags: from the log, a config file, the command line.

Precedence, lowest first: what the log prints (Megatron's arguments block, torchtitan's device mesh and
model line), the framework's own file (torchtitan's TOML; Megatron's launch flags, ``--name value``,
in a text or shell file), then cp-plan flags. A model is named by a preset: torchtitan's
``llama3 8B`` is ``llama3-8b``; Megatron's printed shape (layers, hidden, heads, query groups, FFN) is
matched against the presets.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from costmodel.audit.logs import _MEGATRON_ARGS, _MEGATRON_SHAPE, ParsedLog, count, read_lines
from costmodel.core.errors import InputError
from costmodel.core.fileio import read_toml
from costmodel.machines.profiles import builtin_names
from costmodel.plans import cp as registry
from costmodel.plans.models import builtin_models, load_model


def _toml(path: str, field: str) -> dict[str, Any]:

    return read_toml(path, field)


def torchtitan_config(data: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Step flags and the model preset of a torchtitan job TOML (``[model]``, ``[training]``,
    ``[parallelism]``, ``[activation_checkpoint]``)."""
    model, training = data.get("model", {}), data.get("training", {})
    par, ac = data.get("parallelism", {}), data.get("activation_checkpoint", {})
    out: dict[str, Any] = {}
    degrees = {
        "tp": par.get("tensor_parallel_degree", 1),
        "cp": par.get("context_parallel_degree", 1),
        "pp": par.get("pipeline_parallel_degree", 1),
    }
    out.update({k: int(v) for k, v in degrees.items()})
    shard, replicate = (
        int(par.get("data_parallel_shard_degree", -1)),
        int(par.get("data_parallel_replicate_degree", 1)),
    )
    out["zero"] = 3  # FSDP2 shards parameters, gradients and optimizer states
    if shard > 0:
        out["gpus"] = shard * replicate * out["tp"] * out["cp"] * out["pp"]
    if "seq_len" in training:
        out["seq"] = int(training["seq_len"])
    local = int(training.get("local_batch_size", training.get("batch_size", 1)))
    out["micro_batch"] = int(par.get("pipeline_parallel_microbatch_size", 1)) if out["pp"] > 1 else local
    out["_local_batch"] = local
    if int(training.get("global_batch_size", -1)) > 0:
        out["global_batch"] = int(training["global_batch_size"])
    mode = str(ac.get("mode", "selective")).lower()
    out["recompute"] = mode if mode in ("none", "selective", "full") else "selective"
    rotate = par.get("context_parallel_rotate_method")
    # an unknown method reads as the ring's shuffles (alltoall)
    scheme = registry.from_framework(
        "torchtitan", None if rotate is None else str(rotate).lower(), "alltoall"
    )
    out["cp_scheme"] = scheme.name
    preset = f"{model['name']}-{model['flavor']}".lower() if "name" in model and "flavor" in model else None
    return out, preset


_FLAG = re.compile(r"--([a-z0-9-]+)(?:[ =]+([^\s\\-][^\s\\]*))?")


def megatron_flags(path: str, field: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Step flags and model shape from a Megatron launch script or flag file (``--tensor-model-parallel-size 2``)."""

    given: dict[str, str] = {}
    for text, _ in read_lines(path, field, kind="flags"):
        for name, value in _FLAG.findall(text):
            given[name.replace("-", "_")] = value or "True"
    config, shape = {}, {}
    for name, (flag, convert) in _MEGATRON_ARGS.items():
        if name in given:
            try:
                config[flag] = convert(given[name])
            except ValueError:
                raise InputError(
                    field, f"{path}: --{name.replace('_', '-')} {given[name]!r} is not valid"
                ) from None
    for name, key in _MEGATRON_SHAPE.items():
        value = count(given.get(name, ""))
        if value:
            shape[key] = value
    if "recompute_activations" in given and "recompute" not in config:
        config["recompute"] = "selective"
    return config, shape


def match_preset(shape: dict[str, int]) -> str | None:
    """The preset whose layers, hidden size, heads, KV heads and FFN width agree with a printed shape."""
    if not {"layers", "hidden", "heads"} <= shape.keys():
        return None
    for name in builtin_models():
        preset = load_model(name)
        wanted = {
            "layers": preset.layers,
            "hidden": preset.hidden,
            "heads": preset.heads,
            "kv_heads": preset.kv_heads,
            "ffn_hidden": preset.ffn_hidden,
            "head_dim": preset.head_dim,
        }
        if all(wanted[k] == v for k, v in shape.items() if k in wanted):
            return name
    return None


def resolve(log: ParsedLog, given: dict[str, Any], config_file: str | None = None) -> dict[str, Any]:
    """The step's keyword values (:func:`costmodel.training.step.build_step`) for the run ``log`` records."""
    values = dict(log.config)
    preset = match_preset(log.model_shape) if log.model_shape else None
    if log.model_name:
        preset = log.model_name.replace(" ", "-").lower()
    if config_file is not None:
        if config_file.endswith(".toml"):
            data = _toml(config_file, "--config")  # its own refusals name the file already
            try:
                found, named = torchtitan_config(data)
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                raise InputError("--config", f"{config_file}: not a torchtitan job file: {exc}") from None
            values.update({k: v for k, v in found.items() if not (k == "gpus" and "gpus" in values)})
            preset = named or preset
        else:
            found, shape = megatron_flags(config_file, "--config")
            values.update(found)
            preset = match_preset(shape) or preset
    local = values.pop("_local_batch", None)
    if local is not None and values.get("pp", 1) == 1:
        values.setdefault("micro_batch", local)
    if "global_batch" not in values and local is not None and "gpus" in values:
        dp = values["gpus"] // (values.get("tp", 1) * values.get("cp", 1) * values.get("pp", 1))
        values["global_batch"] = local * max(dp, 1)
    values.update({k: v for k, v in given.items() if v is not None})
    if not values.get("model"):
        if preset is None or preset not in builtin_models():
            shape = (
                ", ".join(f"{k} {v}" for k, v in log.model_shape.items()) or log.model_name or "not printed"
            )
            raise InputError(
                "--model", f"the log's model ({shape}) matches no preset; name one, e.g. --model llama3-8b"
            )
        values["model"] = preset
    if not values.get("hw"):
        values["hw"] = _profile_for(log.device_name)
    missing = [flag for flag in ("seq", "gpus", "global_batch") if flag not in values]
    if missing:
        raise InputError(
            f"--{missing[0].replace('_', '-')}",
            f"{Path(log.path).name} does not state {', '.join(missing)}; give "
            + " ".join(f"--{m.replace('_', '-')}" for m in missing)
            + " (or --config with the framework's file)",
        )
    return values


def _profile_for(device: str | None) -> str:
    """A built-in profile for a device the log names (torchtitan prints it), else an error asking for --hw."""

    if device:
        for name in builtin_names():
            chip = name.split("-")[0]
            if re.search(rf"\b{re.escape(chip)}\b", device, re.IGNORECASE) and name.endswith(
                ("-nvlink", "-xgmi")
            ):
                return name
    said = f"names {device!r}, which no built-in profile matches" if device else "does not name the device"
    raise InputError("--hw", f"the log {said}; give --hw, e.g. --hw h100-nvlink or a profile YAML")
