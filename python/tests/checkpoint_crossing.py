"""A checkpoint crossing between the host and a device, bit for bit (issue 34's proof): two steps
on one side, a save; the other side resumes from it and saves at once, without a step; every file
of the two checkpoints is the same bytes, but manifest.json and run_options.json (they name the
device). Both directions, on the default mesh (dp=2 x tp=2: 4 rank threads). Used by
test_checkpoint_crossing.py (the fake device, in `make test`) and python/tests_gpu (a GPU)."""
import filecmp
import os

import shardwise as sw

RUN = dict(layers=1, hidden=32, heads=4, global_batch=8, steps=4, seed=3, eval_every=0, progress="none")
NAMES_THE_DEVICE = {"manifest.json", "run_options.json"}


def differing_files(a, b):
    """The files of checkpoint a whose bytes differ in checkpoint b (or that b lacks)."""
    out = []
    for root, _, files in os.walk(a):
        for f in files:
            path = os.path.join(root, f)
            rel = os.path.relpath(path, a)
            if rel in NAMES_THE_DEVICE:
                continue
            other = os.path.join(b, rel)
            if not os.path.exists(other) or not filecmp.cmp(path, other, shallow=False):
                out.append(rel)
    return sorted(out)


def trained_and_saved(run_dir, device):
    options = dict(RUN) if device is None else dict(RUN, device=device)
    with sw.Trainer(run_dir=run_dir, **options) as trainer:
        trainer.step()
        trainer.step()
        return trainer.save()


def resumed_and_saved(run_dir, checkpoint, device):
    options = dict(RUN) if device is None else dict(RUN, device=device)
    with sw.Trainer(run_dir=run_dir, resume=checkpoint, **options) as trainer:
        assert trainer.steps == 2
        return trainer.save()


def check_crossing(tmp_path, device):
    """Host -> device and device -> host: the files each side saves are the other's bytes."""
    saved = trained_and_saved(tmp_path / "host", None)
    files = os.listdir(saved)
    assert any(f.endswith(".safetensors") for f in files), files
    assert differing_files(saved, resumed_and_saved(tmp_path / "device_from_host", saved, device)) == []
    saved = trained_and_saved(tmp_path / "device", device)
    assert differing_files(saved, resumed_and_saved(tmp_path / "host_from_device", saved, None)) == []
