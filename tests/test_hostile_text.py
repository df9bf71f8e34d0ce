"""Text read from files, and one source of truth per input field: what the hostile-input round found.

Every string a reader takes from a file is checked once (costmodel/core/text.py): control characters and
the line separators YAML reads as line breaks are refused naming the file, line and key or column; a field
stated twice with two values, or with a value of the wrong type, is refused naming both places or the key;
and a value the step refuses is named by the file and row or key it came from, not by a flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from costmodel.core.text import displayed
from tests.test_hostile_input import one_line_error, write

AUDIT = Path(__file__).parent / "data" / "audit"
HF = Path(__file__).parent / "data" / "hf"
PLAN = "model: llama3-8b\nhw: h100-nvlink\nseq: 8192\nn: 8\n"
PROFILE = (Path(__file__).parents[1] / "hardware" / "h100-nvlink.yaml").read_text()
RUNS_HEADER = "gpus,global_batch,micro_batch,hidden,heads,layers,seq,tp"
RUNS_ROW = "8,8,1,1024,16,12,1024,1"


# -- hidden input and terminal escapes ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("name: x\u2028gpus: 16\n" + PLAN, ["p.yaml:1", "column 8", "U+2028", "line separator"]),
        ("name: x\u0085gpus: 16\n" + PLAN, ["p.yaml:1", "column 8", "U+0085"]),
        (PLAN + "name: a\u2029b\n", ["p.yaml:5", "U+2029"]),
        (PLAN + "name: a\x1b[2Jb\n", ["p.yaml:5", "column 8", "U+001B (ESC)", "control character"]),
        ('name: "\\e[2J\\e]0;title\\a"\n' + PLAN, ["p.yaml:1", "name: U+001B (ESC)"]),
        (PLAN + 'expect:\n  worst_verdict: "red\\u2028"\n', ["p.yaml:6", "worst_verdict: U+2028"]),
        (PLAN + 'name: "\\x07"\n', ["p.yaml:5", "name: U+0007 (BEL)"]),
        (PLAN + 'name: ["a", "\\r"]\n', ["p.yaml:5", "item 1: U+000D (CR)"]),
    ],
)
def test_a_plan_with_hidden_breaks_or_escapes_is_refused(
    cli, tmp_path: Path, text: str, said: list[str]
) -> None:
    result = cli("check", write(tmp_path, "p.yaml", text))
    line = one_line_error(result, *said)
    assert "\x1b" not in line and "\x07" not in line and "\u2028" not in line


@pytest.mark.parametrize(
    ("flag", "args"),
    [
        ("--hw", ("step", "--model", "llama3-8b", "--global-batch", "8", "--hw")),
        ("--base", ("hw", "from-nccl-tests", "x", "--base")),
    ],
)
@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda t: t.replace("\n", "\nsecret: 1\u2028", 1), "U+2028"),
        (lambda t: t.replace('description: "', 'description: "\\e]0;owned\\a', 1), "description: U+001B"),
    ],
)
def test_a_profile_with_hidden_breaks_or_escapes_is_refused(
    cli, tmp_path: Path, flag, args, edit, said
) -> None:  # noqa: ANN001
    path = write(tmp_path, "mine.yaml", edit(PROFILE))
    one_line_error(cli(*args, path), flag, "mine.yaml", said)


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u200f", "\u061c"])
def test_a_bidirectional_control_is_refused_as_a_control_character_is(cli, tmp_path: Path, char: str) -> None:
    """U+202E shows 'abc\u202edcba' as 'abcabcd': a file's text in another order than it is read
    [Trojan-Source]. Raw, written as an escape, in a plan, a runs table or a docs file: refused, never shown."""
    code = f"U+{ord(char):04X}"
    plan = write(tmp_path, "p.yaml", f"name: 'abc{char}dcba'\n" + PLAN)
    line = one_line_error(cli("check", plan), "p.yaml:1", "column 11", code, "bidirectional control")
    assert char not in line
    escaped = write(tmp_path, "e.yaml", f'name: "abc\\u{ord(char):04x}"\n' + PLAN)
    one_line_error(cli("check", escaped), "e.yaml:1", f"name: {code}")
    runs = write(tmp_path, "r.csv", f"label,{RUNS_HEADER},iteration_ms\nr{char}1,{RUNS_ROW},100\n")
    one_line_error(cli("audit", "--runs", runs, "--hw", "a100-nvlink"), "--runs", "r.csv:2", code)
    docs = write(tmp_path, "d.txt", f"4096\n{char}2048\n")
    one_line_error(cli("--seq", "8k", "--n", "8", "--docs", docs), "--docs", "d.txt:2", code)
    assert displayed(f"a{char}b") == f"a\\u{ord(char):04x}b"


@pytest.mark.parametrize(
    ("docs", "said"),
    [
        ("lognormal:mean=4k,count=1_0", "'1_0' is not a whole number"),
        ("lognormal:mean=4k,sigma=0_5", "sigma='0_5' is not a number"),
        ("4k\u2028", "'4k\\u2028' is not a length"),
    ],
)
def test_a_docs_flag_reads_its_numbers_as_a_flag_does(cli, docs: str, said: str) -> None:
    """int() and float() took count=1_0 and sigma=0_5; Python's strip() took U+2028 for a blank."""
    one_line_error(cli("--seq", "64k", "--n", "8", "--docs", docs), "--docs", said)


def test_escapes_written_as_json_and_toml_escapes_are_refused_naming_the_key(cli, tmp_path: Path) -> None:
    config = json.loads((HF / "llama-3.1-8b.json").read_text()) | {"architectures": ["\u001b[2J"]}
    path = write(tmp_path, "config.json", json.dumps(config))
    one_line_error(
        cli("step", "--global-batch", "8", "--model", path), "--model", "architectures[0]", "U+001B"
    )
    toml = (AUDIT / "titan_cp2_16k.toml").read_text() + '\n[extra]\nname = "\\u001b]0;t\\u0007"\n'
    log = str(AUDIT / "titan_cp2_16k.log")
    one_line_error(cli("audit", log, "--config", write(tmp_path, "job.toml", toml)), "--config", "extra.name")


@pytest.mark.parametrize(
    ("kind", "text", "args", "said"),
    [
        (
            "runs",
            f"label,{RUNS_HEADER},iteration_ms\n\x1b[2J\x1b]0;t\x07,{RUNS_ROW},100\n",
            ("audit", "--hw", "h100-nvlink", "--runs"),
            ["--runs", "t.txt:2", "column 1", "U+001B"],
        ),
        (
            "nccl",
            (AUDIT / "nccl_1node_all_reduce_perf.txt").read_text().replace("node001", "node\x1b]0;x\x07", 1),
            ("hw", "from-nccl-tests"),
            ["FILE", "t.txt:6", "U+001B"],
        ),
        (
            "flags",
            "--tensor-model-parallel-size 2 \x1b[2J\n",
            ("audit", str(AUDIT / "megatron_tp2_cp2_8k.log"), "--hw", "h100-nvlink", "--config"),
            ["--config", "t.txt:1", "column 32", "U+001B"],
        ),
    ],
)
def test_raw_escapes_in_tables_and_launch_scripts_are_refused(
    cli, tmp_path: Path, kind, text, args, said
) -> None:  # noqa: ANN001
    one_line_error(cli(*args, write(tmp_path, "t.txt", text)), *said)


def test_a_training_log_keeps_its_noise_but_shows_it_escaped(cli, tmp_path: Path) -> None:
    text = (AUDIT / "titan_cp2_16k.log").read_text()
    assert "CUDA capacity: NVIDIA H100" in text
    log = tmp_path / "titan_cp2_16k.log"
    log.write_text(text.replace("CUDA capacity: NVIDIA H100", "CUDA capacity: NVIDIA H100 \x1b]0;owned\x07"))
    (tmp_path / "titan_cp2_16k.toml").write_text((AUDIT / "titan_cp2_16k.toml").read_text())
    from costmodel.audit.logs import parse_log

    assert "H100 \\x1b]0;owned\\x07" in parse_log(log).device_name
    result = cli("audit", str(log))
    assert result.code == 0 and "\x1b]" not in result.out + result.err and "\x07" not in result.out


MARKUP = ["[red]x[/red]", "[link=https://example.com]click[/link]", ":skull:", "[bold]"]


def test_rich_markup_read_from_a_file_is_shown_as_written(cli, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """A label, a path or a name read from a file is text: rich never reads it as a style, a link or an emoji."""
    monkeypatch.setenv("COLUMNS", "1000")  # no line wrapped inside a long temporary path
    rows = "".join(f"{label},{RUNS_ROW},{100 + i}\n" for i, label in enumerate(MARKUP))
    runs = write(tmp_path, "[b]runs.csv", f"label,{RUNS_HEADER},iteration_ms\n{rows}")
    result = cli("audit", "--runs", runs, "--hw", "a100-nvlink")
    assert result.code == 0 and "[b]runs.csv" in result.out
    for label in MARKUP:
        assert label in result.out, label
    log = tmp_path / "[red]run.log"
    log.write_text((AUDIT / "megatron_tp2_cp2_8k.log").read_text())
    for args in ([str(log)], [str(log), str(log)]):  # one log's table, and the summary of several
        result = cli("audit", *args, "--hw", "h100-nvlink")
        assert result.code == 0 and "[red]run.log" in result.out
    plan = write(tmp_path, "[blink]plan.yaml", "name: x\n" + PLAN)
    assert "[blink]plan.yaml" in cli("check", plan).out
    model = write(
        tmp_path, "[red]m.yaml", (Path(__file__).parents[1] / "configs/models/llama3-8b.yaml").read_text()
    )
    assert "[red]m.yaml" in cli("step", "--global-batch", "8", "--seq", "8k", "--model", model).out


@pytest.mark.parametrize(
    ("text", "shown"),
    [("a\x1b[2Jb", "a\\x1b[2Jb"), ("x\u2028y\x85", "x\\u2028y\\x85"), ("tab\tand\nline", "tab\tand\nline")],
)
def test_one_escape_shows_what_a_file_holds(text: str, shown: str) -> None:
    assert displayed(text) == shown


# -- one source of truth per input field ------------------------------------------------------------
@pytest.mark.parametrize(
    ("header", "row", "said"),
    [
        (
            f"{RUNS_HEADER},iteration_ms,iteration_ms",
            f"{RUNS_ROW},100,900",
            ["column iteration_ms is given twice", "'100' in column 9", "'900' in column 10"],
        ),
        (
            f"{RUNS_HEADER},iteration_ms,Iteration time (ms)",
            f"{RUNS_ROW},100,101",
            ["column iteration_ms is given twice", "column 10"],
        ),
        (
            f"{RUNS_HEADER},iteration_ms,iteration_s",
            f"{RUNS_ROW},100,0.9",
            ["column iteration_ms", "column iteration_s", "agree to 1 %"],
        ),
        (
            f"{RUNS_HEADER},iteration_ms",
            f"{RUNS_ROW},1e-300",
            ["line 2", "column iteration_ms", "1 µs to one day"],
        ),
        (
            f"{RUNS_HEADER},iteration_ms",
            f"{RUNS_ROW},1e300",
            ["line 2", "column iteration_ms", "1 µs to one day"],
        ),
        (f"{RUNS_HEADER},iteration_s", f"{RUNS_ROW},1e-300", ["column iteration_s", "1 µs to one day"]),
    ],
)
def test_a_runs_table_states_each_measurement_once_and_in_bounds(
    cli, tmp_path: Path, header, row, said
) -> None:  # noqa: ANN001
    path = write(tmp_path, "runs.csv", f"{header}\n{row}\n")
    one_line_error(cli("audit", "--runs", path, "--hw", "a100-nvlink"), "--runs", "runs.csv line 2", *said)


@pytest.mark.parametrize(
    ("header", "row", "assume", "said"),
    [
        (
            RUNS_HEADER,
            RUNS_ROW.replace(",1024,1", ",1_024,1"),
            [],
            ["--runs", "line 2", "column hidden is '1_024'"],
        ),
        (RUNS_HEADER, RUNS_ROW.replace("8,8,1", "+8,8,1"), [], ["--runs", "line 2", "column gpus is '+8'"]),
        (f"{RUNS_HEADER},dp_overlap", f"{RUNS_ROW},0_5", [], ["column dp_overlap is '0_5'"]),
        (RUNS_HEADER, RUNS_ROW, ["cp=1_0"], ["--assume", "cp is '1_0', expected a whole number"]),
        (RUNS_HEADER, RUNS_ROW, ["tp=2"], ["--assume", "tp: a column of", "runs.csv"]),
        (
            RUNS_HEADER,
            RUNS_ROW,
            ["recompute=full", "recompute=none"],
            ["--assume", "recompute is given twice"],
        ),
        (f"model,{RUNS_HEADER}", f"nope.yaml,{RUNS_ROW}", [], ["runs.csv line 2: column model: nope.yaml"]),
        (f"hw,{RUNS_HEADER}", f"nope,{RUNS_ROW}", [], ["runs.csv line 2: column hw: unknown hardware"]),
        (RUNS_HEADER, RUNS_ROW, ["hw=nope"], ["line 2: column hw (from --assume): unknown hardware"]),
    ],
)
def test_a_runs_value_is_read_as_a_flag_is_and_stated_once(
    cli, tmp_path: Path, header, row, assume, said
) -> None:  # noqa: ANN001
    """A cell or an --assume value is a number as a flag reads one (int() took 1_024 and +8); --assume gives a
    column the table lacks, once (the table's own value won silently); a model or profile a row names is
    named by its row and column when it cannot be read."""
    path = write(tmp_path, "runs.csv", f"{header},iteration_ms\n{row},100\n")
    args = [arg for item in assume for arg in ("--assume", item)]
    one_line_error(cli("audit", "--runs", path, "--hw", "a100-nvlink", *args), *said)


def test_a_column_given_twice_with_one_value_is_read(cli, tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", f"{RUNS_HEADER},iteration_ms,iteration_s\n{RUNS_ROW},100,0.1\n")
    result = cli("audit", "--runs", path, "--hw", "a100-nvlink", "--format", "json")
    assert result.code == 0 and result.json()["runs"]["rows"][0]["measured_s"] == pytest.approx(0.1)


MODEL = (Path(__file__).parents[1] / "configs" / "models" / "llama3-8b.yaml").read_text()


@pytest.mark.parametrize(
    ("flag", "text", "said"),
    [
        ("--model", MODEL.replace("layers: 32", "layers: 32.0"), "layers: expected a whole number"),
        ("--model", MODEL.replace("layers: 32", "layers: '32.0'"), "layers: '32.0' is not a whole number"),
        ("--model", MODEL.replace("layers: 32", "layers: '3_2'"), "layers: '3_2' is not a whole number"),
        ("--model", MODEL + "gated_mlp: 'yes'\n", "gated_mlp: Input should be a valid boolean"),
        ("--model", MODEL + "tied_embeddings: 1\n", "tied_embeddings: Input should be a valid boolean"),
        ("--model", MODEL + "dense_layers: 1.0\n", "dense_layers: expected a whole number"),
        (
            "--hw",
            PROFILE.replace("devices_per_node: 8", "devices_per_node: 8.0"),
            "devices_per_node: expected a whole",
        ),
        (
            "--hw",
            PROFILE.replace("devices_per_node: 8", "devices_per_node: '0_8'"),
            "'0_8' is not a whole number",
        ),
        (
            "--hw",
            PROFILE.replace("hbm_bytes: 80.0e+9", "hbm_bytes: '8_0.0e+9'"),
            "hbm_bytes: '8_0.0e+9' is not a number",
        ),
        (
            "--hw",
            PROFILE.replace("hbm_bytes: 80.0e+9", "hbm_bytes: 'nan'"),
            "hbm_bytes: 'nan' is not a number",
        ),
        ("check", PLAN + "zero: 1.0\ngpus: 8\n", "zero: expected a whole number"),
        ("check", PLAN + "memory_headroom: '0_1'\ngpus: 8\n", "memory_headroom: '0_1' is not a number"),
        (
            "check",
            PLAN + "gpus: 8\nexpect:\n  fits_memory: 'yes'\n",
            "fits_memory: Input should be a valid boolean",
        ),
        ("check", PLAN + "gpus: 8\nexpect:\n  in_recommended_window: 1\n", "in_recommended_window"),
    ],
)
def test_a_count_or_switch_in_a_file_is_written_as_one(
    cli, tmp_path: Path, flag: str, text: str, said: str
) -> None:
    """pydantic's lax reading took a count of 8.0 or '1_0' (Python's int() reads the underscore) and a switch
    of 'yes' or 1: a file's count is a whole number, its switch true or false, a quoted number a decimal."""
    path = write(tmp_path, "f.yaml", "name: x\n" + text if flag == "check" else text)
    args = {
        "--model": ("step", "--global-batch", "8", "--seq", "8k", "--model", path),
        "--hw": ("--seq", "8k", "--n", "8", "--hw", path),
        "check": ("check", path),
    }[flag]
    one_line_error(cli(*args), "f.yaml:" if flag == "check" else "f.yaml: line ", said)  # with its line


def test_a_quoted_decimal_is_still_a_number(cli, tmp_path: Path) -> None:
    path = write(tmp_path, "f.yaml", PROFILE.replace("hbm_bytes: 80.0e+9", "hbm_bytes: '80e9'"))
    assert cli("--seq", "8k", "--n", "8", "--hw", path).code == 0


ATTENTION = "head_dim,causal,pass,batch,heads,tflops,seq,seq_q,seq_kv\n"


@pytest.mark.parametrize(
    ("flag", "text", "said"),
    [
        (
            "--attention",
            ATTENTION + "128,false,fwd,1,32,300,4096,1024,1024\n",
            "give seq, or seq_q and seq_kv, not",
        ),
        ("--attention", ATTENTION + "128,false,fwd,1,32,300,4096,,1024\n", "not seq and seq_kv"),
        ("--gemm", "m,n,k,ms\n1_024,1024,1024,1\n", "m must be a whole number, got '1_024'"),
        ("--gemm", "m,n,k,ms\n1024,1024,1024,nan\n", "ms must be a number, got 'nan'"),
        ("--gemm", "m,n,k,ms\n1024,1024,1024,0_5\n", "ms must be a number, got '0_5'"),
    ],
)
def test_a_kernel_timing_is_stated_once_and_written_as_a_number(
    cli, tmp_path: Path, flag, text, said
) -> None:  # noqa: ANN001
    """A row giving seq and seq_q/seq_kv was read by seq alone; float() and int() took 0_5, 1_024 and nan."""
    path = write(tmp_path, "t.csv", text)
    one_line_error(cli("hw", "fit-kernels", "--base", "h100-nvlink", flag, path), flag, "t.csv line 2", said)


MEGATRON = (AUDIT / "megatron_tp2_cp2_8k.log").read_text()


def _argument(name: str) -> str:
    return next(line for line in MEGATRON.splitlines() if line.strip().startswith(name + " "))


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (
            lambda t: t.replace(
                _argument("world_size"),
                _argument("world_size") + "\n" + _argument("world_size").replace(" 8", " 16"),
            ),
            ["world_size is '16'", "'8' on line"],
        ),
        (
            lambda t: t.replace(
                _argument("tensor_model_parallel_size"),
                _argument("tensor_model_parallel_size")
                + "\n"
                + _argument("tensor_model_parallel_size").replace(" 2", " 4"),
            ),
            ["tensor_model_parallel_size is '4'", "'2' on line"],
        ),
        (
            lambda t: t.replace(
                _argument("seq_length"),
                _argument("seq_length") + "\n" + _argument("seq_length").replace("8192", "4096"),
            ),
            ["seq_length is '4096'", "'8192' on line"],
        ),
        (
            lambda t: t.replace(
                _argument("tensor_model_parallel_size"),
                _argument("tensor_model_parallel_size").replace(" 2", " True"),
            ),
            ["tensor_model_parallel_size: 'True' is not a count"],
        ),
        (
            lambda t: t.replace(_argument("num_layers"), _argument("num_layers").replace("32", "32.5")),
            ["num_layers: '32.5' is not a count"],
        ),
        (
            lambda t: t.replace(
                _argument("recompute_granularity"),
                _argument("recompute_granularity").replace("selective", "sometimes"),
            ),
            ["recompute_granularity: 'sometimes'"],
        ),
    ],
)
def test_a_megatron_arguments_block_states_each_setting_once_and_typed(
    cli, tmp_path: Path, edit, said
) -> None:  # noqa: ANN001
    path = write(tmp_path, "train.log", edit(MEGATRON))
    one_line_error(cli("audit", path, "--hw", "h100-nvlink"), "LOG", "train.log", "line ", *said)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"tie_word_embeddings": "false"}, ["tie_word_embeddings must be true or false", "'false'"]),
        ({"tie_word_embeddings": 0}, ["tie_word_embeddings must be true or false"]),
        ({"use_sliding_window": "no"}, ["use_sliding_window must be true or false"]),
        ({"n_head": 16}, ["num_attention_heads 32 and n_head 16", "same field"]),
        ({"n_embd": 2048}, ["hidden_size 4096 and n_embd 2048"]),
    ],
)
def test_a_hugging_face_config_states_each_field_once_and_typed(cli, tmp_path: Path, change, said) -> None:  # noqa: ANN001
    config = json.loads((HF / "llama-3.1-8b.json").read_text()) | change
    path = write(tmp_path, "config.json", json.dumps(config))
    one_line_error(cli("step", "--global-batch", "8", "--model", path), "--model", "config.json", *said)


NCCL = (AUDIT / "nccl_1node_all_reduce_perf.txt").read_text()


def _nccl_row(size: str, column: int, value: str) -> str:
    line = next(line for line in NCCL.splitlines() if line.split()[:1] == [size])
    tokens = line.split()
    tokens[column] = value
    return NCCL.replace(line, "  ".join(tokens))


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            lambda: NCCL.replace("Out of bounds values : 0 OK", "Out of bounds values : 4 FAILED"),
            ["FAILED", "failed run"],
        ),
        (
            lambda: NCCL + "node001: Test NCCL failure common.cu:1 'unhandled cuda error'\n",
            ["Test NCCL failure"],
        ),
        (lambda: _nccl_row("1024", -5, "3"), ["#wrong 3", "wrong results"]),
        (lambda: _nccl_row("1024", -1, "12"), ["#wrong 12"]),
        (lambda: _nccl_row("4294967296", -6, "3645.80"), ["busbw 3645.8 GB/s", "algbw 208.33", "x 1.75"]),
    ],
)
def test_an_nccl_table_that_failed_or_disagrees_is_refused(cli, tmp_path: Path, text, said) -> None:  # noqa: ANN001
    path = write(tmp_path, "all_reduce.txt", text())
    one_line_error(cli("hw", "from-nccl-tests", path), "FILE", "all_reduce.txt:", *said)


# -- messages name the file, row and column or key, not a flag never typed -------------------------
@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        ("zero", "7", ["column zero", "Input should be 0, 1, 2 or 3"]),
        ("cp", "3", ["column seq", "over N = 3 ranks"]),
        ("recompute", "sometimes", ["column recompute"]),
    ],
)
def test_a_bad_runs_cell_is_named_by_row_and_column(cli, tmp_path: Path, column, value, said) -> None:  # noqa: ANN001
    path = write(tmp_path, "runs.csv", f"{RUNS_HEADER},iteration_ms,{column}\n{RUNS_ROW},100,{value}\n")
    line = one_line_error(
        cli("audit", "--runs", path, "--hw", "a100-nvlink"), "--runs", "runs.csv line 2", *said
    )
    assert f"--{column}" not in line


def test_a_bad_assumed_value_says_it_came_from_assume(cli, tmp_path: Path) -> None:
    path = write(tmp_path, "runs.csv", f"{RUNS_HEADER},iteration_ms\n{RUNS_ROW},100\n")
    result = cli("audit", "--runs", path, "--hw", "a100-nvlink", "--assume", "zero=7")
    one_line_error(result, "runs.csv line 2", "column zero (from --assume)")


TOML = (AUDIT / "titan_cp2_16k.toml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "context_parallel_degree = 2",
            "context_parallel_degree = 3",
            ["training.seq_len", "over N = 3 ranks"],
        ),
        (
            "context_parallel_degree = 2",
            "context_parallel_degree = 0",
            ["parallelism.context_parallel_degree"],
        ),
        (
            "context_parallel_degree = 2",
            "context_parallel_degree = true",
            ["parallelism.context_parallel_degree is True", "expected an integer"],
        ),
        (
            "context_parallel_degree = 2",
            'context_parallel_degree = "2"',
            ["parallelism.context_parallel_degree is '2'"],
        ),
    ],
)
def test_a_bad_toml_value_is_named_by_its_key(cli, tmp_path: Path, old, new, said) -> None:  # noqa: ANN001
    assert old in TOML
    path = write(tmp_path, "job.toml", TOML.replace(old, new))
    result = cli("audit", str(AUDIT / "titan_cp2_16k.log"), "--config", path, "--hw", "h100-nvlink")
    line = one_line_error(result, "--config", "job.toml", *said)
    assert "--cp:" not in line and "--seq:" not in line


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (
            "job.toml",
            TOML.replace('mode = "selective"', "mode = 1"),
            "activation_checkpoint.mode is 1, expected",
        ),
        (
            "job.toml",
            TOML.replace('mode = "selective"', 'mode = "sometimes"'),
            "mode is 'sometimes', expected",
        ),
        ("job.toml", 'parallelism = "x"\n', "parallelism is 'x', expected a table"),
        (
            "run.sh",
            "torchrun x.py --tensor-model-parallel-size 2 --tensor-model-parallel-size 4\n",
            "run.sh:1:",
        ),
        (
            "run.sh",
            "torchrun x.py --seq-length=8192 \\\n  --seq-length 4096\n",
            "--seq-length is '4096', and '8192'",
        ),
    ],
)
def test_a_framework_file_states_each_setting_once_and_typed(cli, tmp_path: Path, name, text, said) -> None:  # noqa: ANN001
    """torchtitan's activation_checkpoint.mode of 1 or 'sometimes' was read as selective, a section that is not a
    table ended in Python's own words, and a launch flag given twice kept the last value."""
    log = AUDIT / ("titan_cp2_16k.log" if name.endswith(".toml") else "megatron_tp2_cp2_8k.log")
    result = cli("audit", str(log), "--hw", "h100-nvlink", "--config", write(tmp_path, name, text))
    one_line_error(result, "--config", name, said)


def test_a_flag_keeps_its_own_name(cli) -> None:
    result = cli("audit", str(AUDIT / "titan_cp2_16k.log"), "--seq", "16383", "--hw", "h100-nvlink")
    one_line_error(result, "--seq: 16383 tokens")


@pytest.mark.parametrize(
    ("name", "shown"),
    [("/\x1e", "/\\x1e"), ("a\u2028b", "a\\u2028b"), ("\x1b]0;x\x07", "\\x1b]0;x\\x07"), ("a\nb", "a\\nb")],
    ids=["record-separator", "line-separator", "escape", "newline"],
)
def test_an_error_quoting_a_flags_text_is_one_line_that_escapes_it(cli, name: str, shown: str) -> None:
    """Every error line is written through one escape: what a flag held is shown, never acted on."""
    line = one_line_error(cli("--seq", "64k", "--n", "8", "--hw", name), "--hw", shown)
    assert displayed(line) == line  # nothing left a terminal acts on
