"""k4.Step: a decode step's tensors by schema path, in memory (k4.run) or in a file (k4.open).

    step["/inputs/h_in"], step["rank1/merge/outputs/attn"]
    step.rank(1).stage("merge").outputs["attn"]
    step.paths()                     every tensor path the step holds
    step.save("golden.h5")           the bytes `k4 golden` writes with the same options
"""
from . import _k4
from .tensor import from_native


class _Group:
    """The inputs or outputs of one stage of one rank, a read-only mapping by tensor name."""

    def __init__(self, step, prefix, names):
        self._step, self._prefix, self._names = step, prefix, names

    def __getitem__(self, name):
        if name not in self._names:
            raise KeyError(f"{self._prefix}{name}: not in this step (has {', '.join(self._names)})")
        return self._step[self._prefix + name]

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(str(e)) from None

    def keys(self):
        return list(self._names)

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)

    def items(self):
        return [(n, self[n]) for n in self._names]


class _Stage:
    def __init__(self, step, rank, name):
        pre = f"/rank{rank}/{name}/"
        paths = step.paths()
        self.name, self.rank = name, rank
        self.inputs = _Group(step, pre + "inputs/", [p[len(pre) + 7:] for p in paths if p.startswith(pre + "inputs/")])
        self.outputs = _Group(step, pre + "outputs/", [p[len(pre) + 8:] for p in paths if p.startswith(pre + "outputs/")])

    def __repr__(self):
        return f"k4 stage {self.name} of rank {self.rank}: inputs {self.inputs.keys()}, outputs {self.outputs.keys()}"


class _Rank:
    def __init__(self, step, rank):
        self._step, self.rank = step, rank

    def stage(self, name):
        if name not in _k4.stage_names():
            raise ValueError(f"'{name}' is not a stage ({', '.join(_k4.stage_names())})")
        return _Stage(self._step, self.rank, name)

    def __getattr__(self, name):
        if name in _k4.stage_names():
            return self.stage(name)
        raise AttributeError(name)


class Step:
    """A step's tensors by their schema names (docs/golden-format.md)."""

    def __init__(self, native):
        self._n = native
        self._paths = None

    @property
    def config(self):
        return self._n.config

    @property
    def tp(self):
        return self._n.tp

    @property
    def tokens(self):
        return self._n.tokens

    @property
    def path(self):
        """The file a step opened with k4.open reads (None in memory)."""
        return getattr(self._n, "path", None)

    def paths(self):
        if self._paths is None:
            self._paths = list(self._n.paths())
        return self._paths

    def __getitem__(self, path):
        t = from_native(self._n.tensor(path))
        t.k4_path = path.lstrip("/")
        return t

    def __contains__(self, path):
        p = path if path.startswith("/") else "/" + path
        return p in self.paths()

    def rank(self, r):
        if not 0 <= r < self.tp:
            raise IndexError(f"rank {r} is outside 0..{self.tp - 1}")
        return _Rank(self, r)

    @property
    def ranks(self):
        return [_Rank(self, r) for r in range(self.tp)]

    def outputs(self):
        """Every stage output path (what a kernel dumps)."""
        return [p for p in self.paths() if "/outputs/" in p]

    def save(self, path, overwrite=False, kv_form="auto", weights_file=None):
        """Writes the golden: the same bytes as `k4 golden` with the same options.
        weights_file: as `k4 golden --weights-file FILE` (the layer's weights written there
        when it is absent, else checked to be this step's and reused; the golden refers to it)."""
        if not hasattr(self._n, "save"):
            raise TypeError(f"{self.path}: a step read from a file is saved by copying the file")
        self._n.save(str(path), overwrite, kv_form, "" if weights_file is None else str(weights_file))
        return path

    def __repr__(self):
        where = self.path or "in memory"
        return f"k4.Step({self._n.config.name}, tp {self.tp}, S {self.tokens}, {where})"
