"""The `minitx` command: every subcommand is listed, has a help line per argument, and ends bad input
with one `error:` line and exit code 2, not a traceback; scripts/ wrap the same entry points."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_minitx.cli import SUBCOMMANDS, main, merge_repeated, parse_arguments, run_cli

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def test_run_cli_turns_user_errors_into_exit_code_2(capsys):
    def bad():
        raise ValueError("block_size 4096 is larger than max_position_embeddings 512")

    assert run_cli(bad) == 2
    assert capsys.readouterr().err.strip() == "error: block_size 4096 is larger than max_position_embeddings 512"
    assert run_cli(lambda: 0) == 0 and run_cli(lambda: None) == 0 and run_cli(lambda: 3) == 3


def test_run_cli_lets_programming_errors_through():
    def broken():
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        run_cli(broken)


def test_a_process_whose_peer_stopped_says_so_in_one_line_not_a_gloo_traceback(capsys, monkeypatch):
    """In a launch, the first process refuses bad data and exits; the others fail in their next collective. Only a
    RuntimeError raised inside torch.distributed, in a process of a launch, is that case."""
    gloo = compile("raise RuntimeError('[/x/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                   "[127.0.0.1]:21892. This is typically caused by a remote worker crashing.')",
                   "/site-packages/torch/distributed/distributed_c10d.py", "exec")

    def barrier():
        exec(gloo)

    def broken():
        raise RuntimeError("a bug of ours")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert run_cli(barrier) == 1
    assert capsys.readouterr().err == ("error: process 1 of 2 stopped: another process of the launch ended first (its "
                                       "own message says why): Connection closed by peer [127.0.0.1]:21892\n")
    with pytest.raises(RuntimeError, match="a bug of ours"):  # not from torch.distributed: its traceback
        run_cli(broken)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError, match="Connection closed"):  # one process: no peer to blame
        run_cli(barrier)


def test_a_stop_is_said_once_per_machine_not_once_per_process(capsys, monkeypatch):
    import signal

    from hf_minitx.cli import Interrupted
    from hf_minitx.training.signals import StopSignals

    def stopped():
        raise Interrupted("training stopped by SIGINT after step 4; saved checkpoint-4", 130)

    for local_rank, said in (("0", "training stopped by SIGINT after step 4; saved checkpoint-4\n"), ("1", "")):
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        assert run_cli(stopped) == 130 and capsys.readouterr().err == said
        signals = StopSignals()
        signals.handle(signal.SIGINT, None)  # the stop is taken by every process, said by the first
        assert signals.received == signal.SIGINT
        assert ("SIGINT: finishing this step" in capsys.readouterr().err) == (local_rank == "0")


def test_a_ctrl_c_after_the_command_finished_does_not_break_its_exit(tmp_path):
    """A Ctrl-C once the work is done (the libraries' exit callbacks are running) is ignored: no traceback."""
    (tmp_path / "sitecustomize.py").write_text(  # a Ctrl-C arriving while the exit's callbacks run
        "import atexit, os, signal, time\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2)))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "hf_minitx", "--version"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("hf_minitx ")
    assert "KeyboardInterrupt" not in done.stderr, done.stderr


def test_help_lists_every_subcommand(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("train", "generate", "train-tokenizer", "push", "visualize", "experiment", "benchmark", "demo",
                 "check-device"):
        assert f"  {name} " in out
    assert main([]) == 2  # no subcommand: usage, and a non-zero exit


def test_unknown_subcommand_suggests_the_closest(capsys):
    assert main(["trian"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown subcommand 'trian'") and "minitx train" in err and "\n" not in err


@pytest.mark.parametrize("name", [command.name for command in SUBCOMMANDS])
def test_each_subcommand_has_one_help_line_per_argument(name, capsys):
    argv = [name, "masks", "--help"] if name == "visualize" else [name, "--help"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: minitx {name}")
    options = [line.split()[0] for line in out.splitlines() if line.startswith("  --")]
    assert options, out
    helped = [line for line in out.splitlines() if line.startswith("  --") and len(line.split()) > 2
              or line.startswith(" " * 20) and line.strip()]
    assert len(helped) >= len(options) - 1, out  # every option is followed by its help text
    # a `--no_FLAG` of a flag on by default says what it does, not the flag's own help
    for line in (line for line in out.splitlines() if line.startswith("  --no_") and "[" not in line):
        flag = line.split()[0].rstrip(",")[len("--no_"):]
        assert f"--{flag} off" in " ".join(out.split(line, 1)[1].split()[:6]), line


def test_argument_errors_are_one_line_with_exit_code_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--model", "x", "--prompt", "a", "--top_k", "many"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: argument --top_k") and "minitx generate --help" in err and "\n" not in err


def test_visualize_lists_its_pictures_and_refuses_unknown_ones(capsys):
    assert main(["visualize", "--help"]) == 0
    listing = capsys.readouterr().out
    assert all(f"  {name} " in listing for name in ("attention", "positions", "training", "masks", "params"))
    assert main(["visualize"]) == 2  # no picture named: a usage error (the list is still printed), as `minitx` alone
    assert capsys.readouterr().out == listing
    assert main(["visualize", "heatmap", "--out", "x.png"]) == 2
    assert "unknown picture 'heatmap'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv,message",
    [
        (["generate.py", "--model", "no/such/folder", "--prompt", "hi"], "no/such/folder does not exist"),
        (["train.py", "--dataset", "builtin:pydocs", "--preset", "nope", "--output_dir", "x"], "unknown preset 'nope'"),
        (["-m", "hf_minitx", "experiment", "--compare", "colour", "a", "b", "--output_dir", "x"], "unknown field"),
    ],
)
def test_commands_print_one_error_line(tmp_path, argv, message):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_MINITX_TRACEBACK", None)
    command = [sys.executable, *argv] if argv[0] == "-m" else [sys.executable, str(SCRIPTS / argv[0]), *argv[1:]]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and message in result.stderr
    assert result.stderr.lstrip().startswith("error:")


def test_every_script_wraps_one_subcommand():
    names = {command.name for command in SUBCOMMANDS}
    for script in SCRIPTS.glob("*.py"):
        if script.name.startswith("_"):
            continue
        text = script.read_text()
        called = text.split('_minitx.run("')[1].split('"')[0]
        assert called in names, script


@pytest.mark.parametrize("args", [["--help"], ["--version"], []])
def test_top_level_help_imports_neither_torch_nor_transformers(args):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "hf_minitx", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines() if "|" in line}
    assert "hf_minitx" in imported and not {"torch", "transformers", "datasets"} & imported
    assert ("subcommands:" in done.stdout) if args != ["--version"] else done.stdout.startswith("hf_minitx ")


def test_output_into_a_pipe_closed_early_ends_quietly():
    """`minitx --help | head -1`: the reader closes the pipe; the command must not end in a traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line is written
    done = subprocess.run([sys.executable, "-m", "hf_minitx", "--help"], stdout=write, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    os.close(write)
    assert done.stderr == "" and done.returncode == 1


def test_an_option_of_several_values_given_twice_is_refused_not_cut_to_the_last(tmp_path, capsys):
    """`--prompt a --prompt b` would generate for `b` alone; `--prompt a b` is the form."""
    for argv in (["generate", "--model", str(tmp_path), "--prompt", "a", "--prompt", "b"],
                 ["generate", "--model", str(tmp_path), "--prompt=a", "--prompt", "b"]):
        assert main(argv) == 2
        assert capsys.readouterr().err.strip() == (
            "error: --prompt was given 2 times, and only the last one's values would be kept; give all its values "
            "after one --prompt (e.g. --prompt a b)")


def test_config_overrides_given_several_times_all_apply():
    """`--config_overrides a=1 --config_overrides b=2` (as an export refusal lists its fixes) is one list: argparse
    would keep the last and train a model the export still refuses."""
    from hf_minitx.training.arguments import DataArguments, ModelArguments, TrainArguments

    argv = ["--dataset", "d", "--config_overrides", "hidden_act=swiglu", "--max_steps", "3",
            "--config_overrides=attention_bias=false", "--config_overrides", "hidden_act=relu2"]
    assert merge_repeated(argv) == ["--dataset", "d", "--config_overrides",
                                    "hidden_act=swiglu,attention_bias=false,hidden_act=relu2", "--max_steps", "3"]
    model_args, _, train_args = parse_arguments((ModelArguments, DataArguments, TrainArguments), argv, prog="t")
    assert model_args.config_overrides == "hidden_act=swiglu,attention_bias=false,hidden_act=relu2"
    assert train_args.max_steps == 3
    assert merge_repeated(["--config_overrides"]) == ["--config_overrides"]  # no value: argparse says so
    # HfArgumentParser's dash spelling is the same option
    merged = merge_repeated(["--config-overrides", "a=1", "--config_overrides", "b=2"])
    assert merged == ["--config_overrides", "a=1,b=2"]


def test_an_abbreviated_option_is_unrecognized_not_taken_for_another(tmp_path, capsys):
    """argparse's prefixes would slip past the merge of --config_overrides and the given-twice check of --prompt
    (`--prom a --prompt b` generated for b alone, `--config_overr x=1` was dropped unchecked)."""
    assert main(["generate", "--model", str(tmp_path), "--prom", "a", "--prompt", "b"]) == 2
    assert "unrecognized arguments: --prom a" in capsys.readouterr().err
    assert main(["train", "--output_dir", str(tmp_path / "x"), "--config_overr", "nosuchfield=1"]) == 2
    assert "unrecognized arguments: --config_overr" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_flag_whose_default_the_task_decides_takes_no_value():
    """`bool | None` fields (None: decided by the task) take `--shift_windows` alone, as plain bools do;
    HfArgumentParser asked them for a value."""
    from hf_minitx.training.arguments import DataArguments, TrainArguments

    def parsed(*argv):
        data_args, train_args = parse_arguments((DataArguments, TrainArguments), list(argv), prog="t")
        return data_args.shift_windows, train_args.calibrate_temperature

    assert parsed() == (None, None)
    assert parsed("--shift_windows", "--calibrate_temperature") == (True, True)
    assert parsed("--shift_windows", "false", "--calibrate_temperature", "no") == (False, False)


def test_a_number_past_64_bits_is_refused_naming_its_option(tmp_path, capsys):
    """Every subcommand parses through one function: torch, numpy and itertools each refused such a number later,
    in an overflow naming nothing (the training run's at its first evaluation)."""
    assert main(["generate", "--model", str(tmp_path), "--prompt", "a", "--max_new_tokens", str(2**64)]) == 2
    assert f"--max_new_tokens {2**64} is past what a 64-bit count holds" in capsys.readouterr().err
    assert main(["train-tokenizer", "--output_dir", str(tmp_path / "t"), "--seed", "-1"]) == 2
    assert "--seed must be a whole number from 0 to 4294967295" in capsys.readouterr().err
    assert not (tmp_path / "t").exists()
