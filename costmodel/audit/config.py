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

from costmodel.audit.logs import _MEGATRON_ARGS, _MEGATRON_SHAPE, ParsedLog, read_lines, strict_count
from costmodel.core.errors import InputError
from costmodel.core.fileio import read_toml
from costmodel.machines.profiles import builtin_names
from costmodel.plans import cp as registry
from costmodel.plans.models import builtin_models, load_model


def _toml(path: str, field: str) -> dict[str, Any]:

    return read_toml(path, field)


# The TOML key each step flag is read from (a value the step refuses is named by it, not by the flag).
TOML_KEYS = {
    "tp": "parallelism.tensor_parallel_degree",
    "cp": "parallelism.context_parallel_degree",
    "pp": "parallelism.pipeline_parallel_degree",
    "gpus": "parallelism.data_parallel_shard_degree",
    "zero_shard": "parallelism.data_parallel_shard_degree",
    "seq": "training.seq_len",
    "micro_batch": "training.local_batch_size",
    "global_batch": "training.global_batch_size",
    "recompute": "activation_checkpoint.mode",
    "cp_scheme": "parallelism.context_parallel_rotate_method",
}


def torchtitan_config(data: dict[str, Any], origin: str = "job.toml") -> tuple[dict[str, Any], str | None]:
    """Step flags and the model preset of a torchtitan job TOML (``[model]``, ``[training]``,
    ``[parallelism]``, ``[activation_checkpoint]``); a size that is not an integer is refused naming its key."""

    def section(name: str) -> dict[str, Any]:
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise InputError("--config", f"{origin}: {name} is {table!r:.40}, expected a table ([{name}])")
        return table

    model, training = section("model"), section("training")
    par, ac = section("parallelism"), section("activation_checkpoint")

    def integer(table: dict[str, Any], section: str, key: str, default: int) -> int:
        value = table.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool):  # true is no degree, 2.5 no size
            raise InputError("--config", f"{origin}: {section}.{key} is {value!r}, expected an integer")
        return value

    out: dict[str, Any] = {
        "tp": integer(par, "parallelism", "tensor_parallel_degree", 1),
        "cp": integer(par, "parallelism", "context_parallel_degree", 1),
        "pp": integer(par, "parallelism", "pipeline_parallel_degree", 1),
    }
    shard = integer(par, "parallelism", "data_parallel_shard_degree", -1)
    replicate = integer(par, "parallelism", "data_parallel_replicate_degree", 1)
    out["zero"] = 3  # FSDP2 shards parameters, gradients and optimizer states
    if shard > 0:
        out["gpus"] = shard * replicate * out["tp"] * out["cp"] * out["pp"]
        if replicate > 1 and shard * out["cp"] > 1:  # HSDP: FSDP over dp_shard x CP, replicated across
            out["zero_shard"] = shard * out["cp"]
        elif replicate > 1:  # DDP: nothing shards
            out["zero"] = 0
    if "seq_len" in training:
        out["seq"] = integer(training, "training", "seq_len", 0)
    local_key = "local_batch_size" if "local_batch_size" in training else "batch_size"
    local = integer(training, "training", local_key, 1)
    micro = integer(par, "parallelism", "pipeline_parallel_microbatch_size", 1)
    out["micro_batch"] = micro if out["pp"] > 1 else local
    out["_local_batch"] = local
    if integer(training, "training", "global_batch_size", -1) > 0:
        out["global_batch"] = training["global_batch_size"]
    mode = ac.get("mode", "selective")
    if mode not in ("none", "selective", "full"):  # read as selective before, whatever it said
        raise InputError(
            "--config",
            f"{origin}: activation_checkpoint.mode is {mode!r:.40}, expected none, selective or full",
        )
    out["recompute"] = mode
    rotate = par.get("context_parallel_rotate_method")
    # an unknown method reads as the ring's shuffles (alltoall)
    scheme = registry.from_framework(
        "torchtitan", None if rotate is None else str(rotate).lower(), "alltoall"
    )
    out["cp_scheme"] = scheme.name
    # torch.compile fuses the norms, rotary and activation torchtitan otherwise runs as eager torch ops
    if _compiles_the_model(training, section("compile")):
        out["elementwise"] = "fused"
    preset = f"{model['name']}-{model['flavor']}".lower() if "name" in model and "flavor" in model else None
    return out, preset


def _compiles_the_model(training: dict[str, Any], compile_: dict[str, Any]) -> bool:
    """torch.compile on the model: ``[compile] enable`` with "model" among its components (torchtitan since
    2025; components default to model and loss), or ``[training] compile`` before."""
    if compile_.get("enable") is True:
        return "model" in compile_.get("components", ["model"])
    return training.get("compile") is True


_FLAG = re.compile(r"--([a-z0-9-]+)(?:[ =]+([^\s\\-][^\s\\]*))?")


def megatron_flags(path: str, field: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Step flags and model shape from a Megatron launch script or flag file (``--tensor-model-parallel-size 2``)."""

    given: dict[str, str] = {}
    lines: dict[str, int] = {}
    for line, (text, _) in enumerate(read_lines(path, field, kind="flags"), start=1):
        for name, value in _FLAG.findall(text):
            key, value = name.replace("-", "_"), value or "True"
            if given.get(key, value) != value:  # the launcher would take the last; say so instead
                raise InputError(
                    field,
                    f"{path}:{line}: --{name} is {value!r}, and {given[key]!r} on line {lines[key]}; give it once",
                )
            given[key] = value
            lines.setdefault(key, line)
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
        if name in given:
            try:
                shape[key] = strict_count(given[name])
            except ValueError as exc:
                raise InputError(field, f"{path}: --{name.replace('_', '-')}: {exc}") from None
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


def resolve(
    log: ParsedLog,
    given: dict[str, Any],
    config_file: str | None = None,
    sources: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The step's keyword values (:func:`costmodel.training.step.build_step`) for the run ``log`` records;
    ``sources``, when given, is filled with where each value not given as a flag was read (see
    :func:`named_by_source`)."""
    values = dict(log.config)
    origin = {k: ("LOG", f"{log.path}:{line}: {said}") for k, (line, said) in log.sources.items()}
    preset = match_preset(log.model_shape) if log.model_shape else None
    if log.model_name:
        preset = log.model_name.replace(" ", "-").lower()
    named = None
    if config_file is not None:
        found, where, named = _config_file(config_file, has_gpus="gpus" in values)
        values.update(found)
        origin |= {k: ("--config", f"{config_file}: {where[k]}") for k in found if k in where}
        preset = named or preset
    local = values.pop("_local_batch", None)
    if local is not None and values.get("pp", 1) == 1:
        values.setdefault("micro_batch", local)
    if "global_batch" not in values and local is not None and "gpus" in values:
        dp = values["gpus"] // (values.get("tp", 1) * values.get("cp", 1) * values.get("pp", 1))
        values["global_batch"] = local * max(dp, 1)
    values.update({k: v for k, v in given.items() if v is not None})
    if sources is not None:
        sources |= {k: where for k, where in origin.items() if given.get(k) is None}
    if not values.get("model"):
        if named is not None and named not in builtin_models():  # the config's own name: say it is the one
            raise InputError(
                "--config",
                f"{config_file}: model {named!r} matches no preset; name one, e.g. --model llama3-8b",
            )
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


def _config_file(path: str, has_gpus: bool) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """What the framework's file at ``path`` states (a torchtitan TOML, else Megatron's launch flags), the
    key or flag each value is read from, and the model preset it names."""
    if path.endswith(".toml"):
        data = _toml(path, "--config")  # its own refusals name the file already
        try:
            found, named = torchtitan_config(data, path)
        except InputError:
            raise
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise InputError("--config", f"{path}: not a torchtitan job file: {exc}") from None
        # the log's device mesh states the GPUs the run had; the file may leave its shard degree to fill
        found = {k: v for k, v in found.items() if not (k == "gpus" and has_gpus)}
        return found, TOML_KEYS, named
    found, shape = megatron_flags(path, "--config")
    flags = {flag: f"--{name.replace('_', '-')}" for name, (flag, _) in _MEGATRON_ARGS.items()}
    return found, flags, match_preset(shape)


def named_by_source(exc: InputError, sources: dict[str, tuple[str, str]]) -> InputError:
    """``exc`` about a step flag, told as the file and key or line the value was read from (a value the log
    or ``--config`` stated is not a flag the user typed)."""
    key = exc.field.removeprefix("--").replace("-", "_")
    if key not in sources:
        return exc
    field, where = sources[key]
    return InputError(field, f"{where}: {exc.message}")


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
