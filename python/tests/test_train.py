"""shardwise.train, shardwise.Trainer and TrainConfig against `shardwise train` itself (SHARDWISE_BIN):
the same options give the same losses bit for bit, and the same errors."""
import json
import pathlib
import re
import subprocess
import time

import pytest

import shardwise as sw

# A tiny GPT on the embedded addition task, on 4 ranks (threads) as dp=2 x tp=2.
TINY = {"mesh": "dp=2,tp=2", "layers": 1, "hidden": 32, "heads": 2, "steps": 4, "global_batch": 8,
        "eval_every": 0, "progress": "none", "digits": 2}


def words(options):
    out = []
    for name, value in options.items():
        out += [f"--{name.replace('_', '-')}", str(value)]
    return out


def losses(run_dir):
    lines = (pathlib.Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def cli_error(shardwise_bin, args):
    p = subprocess.run([shardwise_bin, "train", *args], capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("shardwise: error: "), line
    return line[len("shardwise: error: "):]


@pytest.fixture(scope="module")
def cli_run(shardwise_bin, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cli") / "run"
    subprocess.run([shardwise_bin, "train", *words(TINY), "--run-dir", str(run_dir)], check=True,
                   capture_output=True)
    return run_dir


def test_train_gives_the_clis_losses_bit_for_bit_and_calls_on_step_in_order(cli_run, tmp_path):
    seen = []
    result = sw.train(sw.TrainConfig(TINY, run_dir=tmp_path / "py"), on_step=seen.append)
    expected = losses(cli_run)
    assert len(expected) == TINY["steps"]
    assert losses(tmp_path / "py") == expected
    assert [m.loss for m in result.metrics] == expected
    assert [m.step for m in seen] == [1, 2, 3, 4]
    assert all(isinstance(m, sw.Metrics) for m in seen) and seen[0].tokens > 0 and seen[0].grad_norm > 0
    assert result.steps == 4 and result.loss == expected[-1] and result.checkpoint is None
    assert result.run_dir == str(tmp_path / "py")


def test_trainer_steps_give_the_clis_losses_bit_for_bit(cli_run, tmp_path):
    with sw.Trainer(TINY, run_dir=tmp_path / "py", save_every=0) as t:
        steps = [t.step() for _ in range(TINY["steps"])]
        assert t.done
        assert 0.0 <= t.evaluate() <= 1.0
        path = t.save()
        assert pathlib.Path(path).name == "checkpoint-4"
        assert [m.loss for m in t.metrics] == [m.loss for m in steps]
        plan = t.memory_plan()
        assert plan and isinstance(plan, dict)
        with pytest.raises(sw.UsageError, match="no step left"):
            t.step()
    assert [m.loss for m in steps] == losses(cli_run)
    assert losses(tmp_path / "py") == losses(cli_run)


def test_a_config_from_keywords_a_dict_or_a_file_resolves_as_the_command(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[model]\nlayers = 1\n[optimizer]\nsteps = 7\nglobal-batch = 16\n')
    c = sw.TrainConfig.from_file(toml, global_batch=8)
    d = c.to_dict()
    assert d["layers"] == 1 and d["steps"] == 7 and d["global_batch"] == 8  # keywords win over the file
    assert d["hidden"] == 128 and d["mesh"] == "dp=2,tp=2"                # the command's defaults
    assert "--global-batch 8" in repr(c)
    assert sw.TrainConfig({"global-batch": 8}).to_dict()["global_batch"] == 8
    flags = sw.TrainConfig(bf16=True, no_prefetch=True, tied_head=False, moe_layers=[0, 1], save_every=5).to_dict()
    assert flags["bf16"] is True and flags["no_prefetch"] is True and flags["tied_head"] is False
    assert flags["sp"] is False and flags["moe_layers"] == [0, 1] and flags["save_on_interrupt"] is True
    assert sw.TrainConfig().to_dict()["no_prefetch"] is False


def test_an_unknown_or_bad_option_is_the_commands_usage_error(shardwise_bin):
    for kwargs, args in [({"global_batchh": 8}, ["--global-batchh=8"]), ({"steps": "many"}, ["--steps=many"]),
                         ({"progress": "loud"}, ["--progress=loud"])]:
        message = cli_error(shardwise_bin, args)
        with pytest.raises(sw.UsageError) as e:
            sw.train(**kwargs, dry_run=True) if "progress" in kwargs else sw.TrainConfig(**kwargs)
        assert str(e.value) == message
    assert "did you mean '--global-batch'" in cli_error(shardwise_bin, ["--global-batchh=8"])


def test_a_ranks_error_surfaces_as_the_right_subclass_with_the_commands_message(shardwise_bin, tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(1000))
    cases = [
        (sw.DataError, {"data": bad, "data_format": "llmc"}),
        (sw.UsageError, {"mesh": "dp=2,tp=2", "ranks": 2}),
        (sw.CheckpointError, {"resume": tmp_path / "none", "run_dir": tmp_path / "r"}),
    ]
    for kind, options in cases:
        options = {"steps": 2, "progress": "none", **options}
        message = cli_error(shardwise_bin, words(options))
        with pytest.raises(kind) as e:
            sw.train(**options)
        # The failing rank is the first to fail, here as in the command: any of them.
        assert re.sub("^rank [0-9]+ failed: ", "", str(e.value)) == re.sub("^rank [0-9]+ failed: ", "", message)
        with pytest.raises(kind):
            sw.Trainer(**options)


def test_an_exception_in_on_step_is_raised_as_it_is(tmp_path):
    def stop(m):
        raise ValueError(f"stop at {m.step}")
    with pytest.raises(ValueError, match="stop at 1"):
        sw.train(TINY, on_step=stop, run_dir=tmp_path / "r")


INTERRUPTED = """
import sys
import shardwise as sw
def progress(m):
    print("step", m.step, flush=True)
sw.train(mesh="dp=2", layers=1, hidden=32, heads=2, steps=100000, global_batch=8, digits=2, save_every=50000,
         eval_every=0, progress="none", run_dir=sys.argv[1], on_step=progress)
"""


def test_ctrl_c_stops_after_the_step_saves_it_and_raises_keyboard_interrupt(shardwise_bin, tmp_path):
    import signal
    import sys
    run_dir = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", INTERRUPTED, str(run_dir)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        header = []
        for line in p.stdout:  # the run header, then the first step's line from on_step
            header.append(line)
            if line.startswith("step ") or len(header) > 50:
                break
        assert header and header[-1].startswith("step "), "".join(header)
        p.send_signal(signal.SIGINT)
    except BaseException:
        p.kill()
        raise
    out, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGINT, err  # Python's exit on an uncaught KeyboardInterrupt
    assert "KeyboardInterrupt: shardwise train stopped after step" in err, err
    assert "interrupted (SIGINT)" in out and "resume with:" in out, out
    saved = sorted((run_dir / "checkpoints").glob("checkpoint-*"), key=lambda d: int(d.name.split("-")[1]))
    assert saved, out
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert saved[-1].name == f"checkpoint-{steps[-1]}"
    subprocess.run([shardwise_bin, "ckpt", "verify", str(saved[-1])], check=True, capture_output=True)


STEPPING = """
import sys, traceback
import shardwise as sw
t = sw.Trainer(mesh="dp=2", layers=2, hidden=128, heads=2, steps=100000, global_batch=64, digits=2, save_every=50000,
               eval_every=0, progress="none", run_dir=sys.argv[1])
try:
    while True:
        print("stepping", t.steps + 1, flush=True)
        t.step()
except KeyboardInterrupt as e:
    where = "step" if "step" in [f.name for f in traceback.extract_tb(e.__traceback__)] else "elsewhere"
    print("raised in", where, "after step", t.steps, "done", t.done, flush=True)
    raise
"""


def test_ctrl_c_during_a_trainer_step_saves_that_step_then_raises_keyboard_interrupt(shardwise_bin, tmp_path):
    """SIGINT while Trainer.step() runs (no with-statement): the ranks finish the step in flight,
    save it (save_every makes save_on_interrupt default on), and step() raises KeyboardInterrupt;
    the checkpoint verifies and holds the step metrics.jsonl ends on."""
    import signal
    import sys
    run_dir = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "-c", STEPPING, str(run_dir)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in p.stdout:
            lines.append(line)
            if line.startswith("stepping 3") or len(lines) > 50:
                break
        assert lines[-1].startswith("stepping 3"), "".join(lines)
        # Steps of this size take a good part of a second: after 0.1 s the worker is in step()'s
        # native wait, not in the microseconds of its own code around it (a signal there raises in
        # the caller's code: the with-statement test covers that).
        time.sleep(0.1)
        p.send_signal(signal.SIGINT)
    except BaseException:
        p.kill()
        raise
    out, err = p.communicate(timeout=120)
    out = "".join(lines) + out
    assert p.returncode == -signal.SIGINT, err
    in_flight = int(re.findall(r"^stepping (\d+)$", out, re.M)[-1])
    assert f"raised in step after step {in_flight} done True" in out, out + err
    assert "interrupted (SIGINT)" in out and "resume with:" in out, out  # close()'s summary, at exit
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == in_flight, steps
    saved = sorted(p.name for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    assert saved == [f"checkpoint-{in_flight}"], saved
    subprocess.run([shardwise_bin, "ckpt", "verify", str(run_dir / "checkpoints" / saved[0])], check=True,
                   capture_output=True)


def test_a_keyboard_interrupt_between_steps_in_a_with_block_saves_the_step(cli_run, shardwise_bin, tmp_path, capfd):
    """A KeyboardInterrupt raised in the caller's code inside `with Trainer(...)`: the with-statement
    saves the step (as Ctrl-C in a step does) and lets the exception go on; resuming from that
    checkpoint gives the uninterrupted run's remaining losses bit for bit (nothing was lost)."""
    with pytest.raises(KeyboardInterrupt):
        with sw.Trainer(TINY, run_dir=tmp_path / "py", save_every=100) as t:
            t.step()
            t.step()
            raise KeyboardInterrupt
    assert t.done and t.checkpoint and pathlib.Path(t.checkpoint).name == "checkpoint-2"
    assert "interrupted (SIGINT): 2 of 4 steps" in capfd.readouterr().out
    subprocess.run([shardwise_bin, "ckpt", "verify", t.checkpoint], check=True, capture_output=True)
    rest = sw.train(TINY, resume=t.checkpoint, run_dir=tmp_path / "resumed")
    assert [m.loss for m in rest.metrics] == losses(cli_run)[2:]
    with sw.Trainer(TINY, run_dir=tmp_path / "later") as later:  # a later run starts without the stop
        later.step()
        assert not later.done


def test_a_keyboard_interrupt_just_after_the_native_step_returned_still_saves_it(tmp_path):
    """A signal landing after the native step's last look at the signals, before step() returns,
    raises KeyboardInterrupt in step()'s Python frame: step() stops the run and saves there too."""
    t = sw.Trainer(TINY, run_dir=tmp_path / "r", save_every=100)
    real = t._run

    class LateSignal:
        def __getattr__(self, name):
            return getattr(real, name)

        def step(self):
            real.step()
            raise KeyboardInterrupt

    t._run = LateSignal()
    with pytest.raises(KeyboardInterrupt):
        t.step()
    t._run = real
    assert t.done and pathlib.Path(t.checkpoint).name == "checkpoint-1"
    t.close()


def test_a_trainer_left_open_is_closed_at_interpreter_exit(tmp_path):
    import sys
    script = ("import shardwise as sw\n"
              "t = sw.Trainer(mesh='dp=2', layers=1, hidden=32, heads=2, steps=5, global_batch=8, digits=2,\n"
              "               eval_every=0, progress='none', run_dir='run')\n"
              "t.step()\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "done: 1 step in" in p.stdout, p.stdout  # the summary close() prints
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


def test_under_mpirun_each_process_is_one_rank_with_the_clis_losses(cli_run, tmp_path):
    """`mpirun -np 4 python script.py` trains dp=2 x tp=2 with one rank a process, as the command
    does under mpirun: the same losses as the threads' run of the command, bit for bit."""
    import shutil
    import sys
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun (openmpi-bin) is installed by make deps"
    script = ("import shardwise as sw, json, sys\n"
              f"r = sw.train(run_dir='run', **{TINY!r})\n"
              "print('STEPS', r.steps)\n")
    p = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4", sys.executable, "-c", script],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "(4 ranks, mpi)" in p.stdout, p.stdout
    assert losses(tmp_path / "run") == losses(cli_run), p.stdout
