"""Training and generation: `shardwise train` and `shardwise generate` from Python.

TrainConfig holds the words of a `shardwise train` command (``global_batch=8`` is
``--global-batch 8``); the command's own parser reads them, so names, defaults, --config sections
and errors are the command's. train() runs a whole run as the command does; Trainer runs one step
at a time. Ranks are threads of this process (the mesh's size, as `shardwise train` without mpirun),
or one rank a process under mpirun.
"""
import atexit
import json
import os
import weakref

import numpy as np

from . import _core
from .graph import with_user_site
from .tracing import check_batch, describe, eval_batch, input_specs, model_builder


def _word(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_word(v) for v in value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)


def _typed(text):
    if not isinstance(text, str):
        return [_typed(t) for t in text]
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class TrainConfig:
    """`shardwise train`'s options: keywords, a dict, or a TOML --config file (from_file).

    ``TrainConfig(mesh="dp=2,tp=2", steps=20)`` is ``shardwise train --mesh dp=2,tp=2 --steps 20``:
    underscores stand for dashes; True/False set a flag; a list is a comma-separated value. An
    unknown name or a bad value raises shardwise.UsageError with the command's message.
    """

    def __init__(self, options=None, /, **kwargs):
        given = dict(options or {})
        given.update(kwargs)
        self._args = []
        for name, value in given.items():
            if name == "config_file":
                name = "config"
            if value is None:
                continue
            self._args.append(f"--{name.replace('_', '-')}={_word(value)}")
        self._line, resolved = _core._train_options(self._args)
        self._resolved = {k.replace("-", "_"): _typed(v) for k, v in json.loads(resolved).items()}

    @classmethod
    def from_file(cls, path, **overrides):
        """The options of a TOML file (`shardwise train --config PATH`); keywords win over the file."""
        return cls(config=os.fspath(path), **overrides)

    @property
    def args(self):
        """The command's words: `shardwise train` followed by these runs the same."""
        return list(self._args)

    def to_dict(self):
        """Every option by name (underscores) with its resolved value: given, from --config, or the default."""
        return dict(self._resolved)

    def __getitem__(self, name):
        return self._resolved[name.replace("-", "_")]

    def __repr__(self):
        return f"TrainConfig({self._line})" if self._line else "TrainConfig()"


class Metrics:
    """One step's line of metrics.jsonl as attributes: step, loss, grad_norm, lr, tokens, elapsed_s,
    tokens_per_s, loader_wait_s, loader_read_s, and accuracy / val_loss / val_ppl / moe when present."""

    def __init__(self, record):
        self.__dict__.update(record)

    def to_dict(self):
        return dict(self.__dict__)

    def __repr__(self):
        return f"Metrics(step={self.step}, loss={self.loss:.4f}, lr={self.lr:.2e}, grad_norm={self.grad_norm:.3f})"


class TrainResult:
    """How a run ended: loss (the last step's), steps (done), run_dir, checkpoint (the newest, or
    None), metrics (this run's steps, Metrics objects) and interrupted (a signal stopped it)."""

    def __init__(self, outcome, metrics):
        self.run_dir = outcome["run_dir"]
        self.checkpoint = outcome["newest_checkpoint"] or None
        self.steps = outcome["steps_done"]
        self.metrics = metrics
        self.loss = metrics[-1].loss if metrics else None
        self.interrupted = outcome["status"] != 0

    def __repr__(self):
        return f"TrainResult(steps={self.steps}, loss={self.loss}, run_dir={self.run_dir!r}, checkpoint={self.checkpoint!r})"


def _config(config, kwargs):
    if config is None:
        return TrainConfig(**kwargs)
    if isinstance(config, dict):
        return TrainConfig(config, **kwargs)
    if kwargs:
        raise TypeError("pass options either in the TrainConfig or as keywords, not both")
    return config


def train(config=None, on_step=None, model=None, model_config=None, data=None, inputs=None, **kwargs):
    """Runs `shardwise train` with these options: run directory, checkpoints, metrics.jsonl, the
    header, progress lines and summary on stdout. on_step(metrics) is called on every step, in
    order, as its line reaches metrics.jsonl. Ctrl-C stops the run after its step (saving it when
    the run saves), prints the summary and raises KeyboardInterrupt. Returns a TrainResult.

    `model`, `model_config`, `data` and `inputs` as Trainer's: a model written in Python (a
    shardwise.nn Module) is trained as Trainer(model=...) stepped to the end."""
    if model is not None and not isinstance(model, str):
        return _train_model(config, on_step, dict(kwargs, model=model, model_config=model_config, data=data,
                                                  inputs=inputs))
    for name, value in (("model", model), ("data", data)):
        if value is not None:
            kwargs[name] = value
    if model_config is not None or inputs is not None:
        raise _core.UsageError("model_config= and inputs= are for a model written in Python (model=a shardwise.nn Module)")
    config = _config(config, kwargs)
    metrics = []

    def hook(line):
        m = Metrics(json.loads(line))
        metrics.append(m)
        if on_step is not None:
            on_step(m)

    outcome = json.loads(_core._train(config.args, hook))
    if outcome["status"] != 0:
        raise KeyboardInterrupt(f"shardwise train stopped after step {outcome['steps_done']}")
    return TrainResult(outcome, metrics)


def _train_model(config, on_step, kwargs):
    """train() of a model written in Python: its Trainer stepped to the end, then closed."""
    metrics = []
    with Trainer(config, **kwargs) as trainer:
        while not trainer.done:
            m = trainer.step()
            metrics.append(m)
            if on_step is not None:
                on_step(m)
    return TrainResult({"run_dir": trainer.run_dir, "newest_checkpoint": trainer.checkpoint or "",
                        "steps_done": trainer.steps, "status": 0}, metrics)


def _is_decoder(model):
    from .nn import Decoder

    return isinstance(model, Decoder)


_open_trainers = weakref.WeakSet()


@atexit.register
def _close_open_trainers():
    for t in list(_open_trainers):
        t.close()


def _data_files(data):
    paths = data if isinstance(data, (list, tuple)) and data else [data]
    return all(isinstance(p, (str, os.PathLike)) for p in paths)


class Trainer:
    """A run driven one step at a time: the same run as train() (run directory, metrics.jsonl,
    checkpoints when due, the progress lines), each step when step() asks for it. Close it (or use
    it as a context manager) to print the summary and end its ranks; the interpreter's exit closes
    one left open.

    Ctrl-C during step() (or evaluate, validate, save) stops the run as it stops `shardwise train`:
    the ranks finish the step, save it when the run saves on interrupt (save_on_interrupt, on by
    default with save_every), and then step() raises KeyboardInterrupt; the run is done. A second
    Ctrl-C raises at once while the ranks finish the step (and its save) on their own; close() waits
    for them. A KeyboardInterrupt raised between steps inside ``with Trainer(...)`` saves the same
    way on its way out."""

    def __init__(self, config=None, model=None, model_config=None, data=None, inputs=None, **kwargs):
        """`model`: a shardwise.nn Module whose forward(ids, labels) gives the mean loss (trained in
        place of the built-in model, on [B, seq] batches of the run's data), or None (a string is
        the --model option: the built-in architecture). Its
        checkpoints hold its parameters under their names, and `model_config` (a dict) as config.json.

        Batches of your own: `data` an iterable of batches or a callable (step index -> batch), a
        batch a dict of arrays [global_batch, ...] by input name (NumPy, or anything np.asarray reads
        in place: CPU torch tensors), each step taking the next; or `inputs` one example batch and
        step(batch=...) each step. forward then takes the inputs by name and each rank gets its rows.
        (`data` a path or a list of paths is the --data option: token files for the loader.)"""
        if _data_files(data):
            kwargs["data"], data = data, None
        if isinstance(model, str):  # `--model gpt2|llama`: the built-in architecture by name
            kwargs["model"], model = model, None
        if config is None and _is_decoder(model):
            kwargs.setdefault("layers", len(model.blocks()))  # a pp mesh splits the blocks evenly
        self.config = _config(config, kwargs)
        self._data, self._next = data, None
        if data is not None and not callable(data):
            self._data = iter(data)
            self._next = inputs = next(self._data)  # its shapes and dtypes: the model's inputs
        elif callable(data) and inputs is None:
            inputs = data(0)
        self._specs = None if inputs is None or model is None else input_specs(inputs)
        self._builder = None if model is None else model_builder(model, self._specs)
        self._description = "" if model is None else describe(model)
        self._run = self._sited(_core._StepwiseRun, self.config.args, self._builder, self._description,
                                "" if model_config is None else json.dumps(model_config), list(self._specs or ()))
        self._closed = False
        _open_trainers.add(self)

    def _stopping(self, command):
        # A KeyboardInterrupt raised here (also just before or after the native call, outside its
        # wait) stops the run as one during the call does; nothing when the call already stopped it.
        try:
            return command()
        except KeyboardInterrupt:
            self._run.interrupt()
            raise

    def step(self, batch=None):
        """One optimizer step (with the evaluation and checkpoint the options make due): its Metrics.
        `batch`: this step's batch for a model fed batches of its own (default: the next of `data`)."""
        if self._specs is None and batch is not None:
            raise _core.UsageError("step(batch=...) is for a model fed batches of its own: give the Trainer "
                                   "data= or inputs= (an example batch)")
        fed = () if self._specs is None else (self._batch(batch),)  # none: the loader's batches
        return self._stopping(lambda: Metrics(json.loads(self._sited(self._run.step, *fed))))

    def _batch(self, batch):
        if batch is None:
            if self._next is not None:
                batch, self._next = self._next, None
            elif callable(self._data):
                batch = self._data(self.steps)
            elif self._data is not None:
                batch = next(self._data, None)
            if batch is None:
                raise _core.UsageError("no batch for this step: pass step(batch=...), or data= with a batch per step")
        return check_batch(batch, self._specs, self.config["global_batch"])

    def _sited(self, call, *args):
        """call(*args); a shardwise.Error naming a value of a Python model's graph gets the user's line."""
        try:
            return call(*args)
        except _core.Error as e:
            if self._builder is None:
                raise
            sited = with_user_site(e, self._builder.graphs)
            if sited is e:
                raise
            raise sited from None

    def evaluate(self, batch=None):
        """The held-out exact-match accuracy (the embedded addition task); with `batch`, the outputs a
        model written in Python marks (nn.output; nn.lm_head_loss marks "logits") by name, NumPy
        arrays of their global shape [rows, ...], from its forward without dropout on the run's mesh:
        no gradient, no step. `batch`: its inputs by name, any number of rows (a token model's "ids"
        [rows, seq] int64, "labels" optional)."""
        if batch is None:
            return self._stopping(self._run.evaluate)
        if self._builder is None:
            raise _core.UsageError("evaluate(batch) gives the outputs of a model written in Python (nn.output); the "
                                   "built-in model's logits: shardwise.generate(..., return_logits=True)")
        arrays = eval_batch(batch, self._specs, self.config["seq"])
        outputs = self._stopping(lambda: self._sited(self._run.predict, arrays))
        if not outputs:
            raise _core.UsageError(f"{self._description}: the model marks no output: mark one in forward with "
                                   "nn.output(name, x)")
        return outputs

    def validate(self, data=None):
        """The validation loss (--val-data or --val-fraction). A model fed batches of its own is
        validated on `data`, held-out batches (an iterable of them, or one batch) of the training
        batches' inputs and rows: the mean of their losses, each as a step would report it (its
        micro-batches' mean, forward only, no dropout); the parameters and the run are untouched."""
        if self._specs is None:
            if data is not None:
                raise _core.UsageError("validate(data) is for a model fed batches of its own: this run validates "
                                       "on --val-data or --val-fraction")
            return self._stopping(self._run.validate)
        batches = [data] if isinstance(data, dict) else list(data or ())
        if not batches:
            raise _core.UsageError("validate() of a model fed batches of its own needs held-out batches: "
                                   "validate(data=[batch, ...])")
        losses = []
        for batch in batches:
            checked = check_batch(batch, self._specs, self.config["global_batch"])
            losses.append(self._stopping(lambda: self._sited(self._run.validate, checked)))
        return sum(losses) / len(losses)

    def save(self):
        """A checkpoint of this step in the run's save directory; its path."""
        return self._stopping(lambda: self._run.save() or self._run.newest_checkpoint)

    def memory_plan(self):
        """The per-rank memory plan (`shardwise plan --memory --json`) as a dict."""
        return json.loads(_core._memory_plan(self.config.args, self._builder, self._description,
                                             list(self._specs or ())))

    @property
    def metrics(self):
        """This run's steps so far, Metrics objects."""
        return [Metrics(json.loads(r)) for r in self._run.records]

    @property
    def done(self):
        return self._run.done

    @property
    def steps(self):
        return self._run.steps_done

    @property
    def run_dir(self):
        return self._run.run_dir

    @property
    def checkpoint(self):
        """The newest checkpoint of the run's save directory, or None."""
        return self._run.newest_checkpoint or None

    def close(self):
        """Prints the summary (as `shardwise train` at its end) and ends the ranks; again: nothing."""
        if not self._closed:
            self._closed = True
            _open_trainers.discard(self)
            self._run.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
                self._run.interrupt()  # as a Ctrl-C during a step: saves it with save_on_interrupt
        finally:
            self.close()
        return False


def generate(checkpoint, prompt=None, *, prompt_ids=None, max_new_tokens=32, temperature=None, top_k=0, top_p=1.0,
             seed=0, eos_id=None, mesh="dp=1", ranks=0, tokenizer=None, kv_cache=True, return_logits=False):
    """`shardwise generate` from a checkpoint or model directory: the new token ids of each prompt.

    prompt: a text (byte vocabularies, or with a tokenizer), or a list of texts; prompt_ids: one
    sequence of token ids (a list or an array), or a list of them. Options as the command's
    (--temperature, --top-k, --top-p, --seed, --eos-id, --mesh, --no-kv-cache). Returns an int64
    array of new ids for one prompt, a list of them for a list; with return_logits, (ids, logits)
    where logits is an f32 [new tokens, vocab] array (a list of them for a list)."""
    texts, ids, single = [], [], False
    if (prompt is None) == (prompt_ids is None):
        raise _core.UsageError("give the prompt: prompt (text) or prompt_ids (token ids), one of them")
    if prompt is not None:
        single = isinstance(prompt, str)
        texts = [prompt] if single else list(prompt)
    else:
        arr = prompt_ids if isinstance(prompt_ids, np.ndarray) else None
        single = (arr is not None and arr.ndim == 1) or (
            arr is None and len(prompt_ids) > 0 and np.isscalar(prompt_ids[0]))
        ids = [[int(t) for t in prompt_ids]] if single else [[int(t) for t in p] for p in prompt_ids]
    out = _core._generate(os.fspath(checkpoint), texts, ids, max_new_tokens, temperature, top_k, top_p, seed, eos_id,
                          mesh, ranks, os.fspath(tokenizer) if tokenizer else "", kv_cache, return_logits)
    new_ids = [np.asarray(tokens, dtype=np.int64) for tokens, _, _ in out]
    logits = [l for _, _, l in out]
    if single:
        return (new_ids[0], logits[0]) if return_logits else new_ids[0]
    return (new_ids, logits) if return_logits else new_ids
