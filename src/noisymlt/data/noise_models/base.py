"""What a noise model declares: the fate of every clean positive label, drawn from one random stream.

``draw`` returns one outcome per clean positive, in row-major order (image by image, class by class): ``KEEP``,
``DROP`` (the label is lost, nothing replaces it) or the class that replaces it. ``noisymlt.data.noise`` turns the
outcomes into the noisy table (kept labels and replacements, united per image) and the statistics, the same way for
every model, so a model is its draws and nothing else. ``transition`` is the model's definition as a matrix, for
the statistics tests and the manual: the probability that a clean positive of class i ends as class j (column C:
dropped); the draws must follow it, which tests/test_noise_models.py checks against an independent simulation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from noisymlt.errors import NoisyMLTError, cause

KEEP = -1  # the outcome of a kept positive
DROP = -2  # the outcome of a positive dropped without replacement
PAPER = "cooccurrence"  # the paper's model (SPEC 2): the default, unnamed in paths, run ids and its command words


class NoiseModel:
    name: str = ""  # set by register_noise_model
    label: str = ""  # how tables and figures name it ("uniform"); the manual gives the formula and the citation
    # keys of the model's own settings (noise.NAME.KEY in the params) -> their JSON schema, checked with the params
    options: dict[str, dict] = {}
    # False: a model that may leave an image without any positive label (missing labels); the others never do
    keeps_every_image_labelled: bool = True
    command: str = "noise"  # the noisymlt command that writes its sets (argv), part of their code digest

    def schema(self) -> dict:
        """The JSON schema of the model's block of settings, noise.NAME (from ``options``)."""
        return {"type": "object", "additionalProperties": False, "properties": dict(self.options)}

    def problems(self, options: dict, datasets: list[str], gammas: list[float], root: str | Path | None = None
                 ) -> list[tuple[str, str]]:
        """What is wrong with the settings for a grid over ``datasets`` and ``gammas``: (key under noise.NAME, what),
        checked with the params. Default: every option given, every file it names there, relative paths under the
        project's folder ``root`` (None: files not looked up)."""
        missing = [(key, "the model needs it") for key in self.options if options.get(key) is None]
        files = [] if missing else dict.fromkeys(f for d in datasets for g in gammas for f in self.files(options, d, g))
        return missing + [("", problem) for f in files if (problem := missing_file(f, root))]

    def files(self, options: dict, dataset: str, gamma: float) -> list[str]:
        """Files the noise step reads for one noisy set besides the clean labels (a dependency of its noise job, for Snakemake and so for DVC's stages)."""
        return []

    def argv(self, options: dict, dataset: str, gamma: str, seed: int, labels: str, out: str, stats: str
             ) -> list[str]:
        """The noisymlt words that write one noisy set (``gamma`` as paths write it): ``noisymlt noise``, with the
        model and its settings unless it is the paper's (whose words are those of every finished set)."""
        words = [self.command, "--labels", labels, "--gamma", gamma, "--seed", str(int(seed)), "--out", out, "--stats", stats]
        if self.name != PAPER:
            words += ["--model", self.name, *[w for k, v in options.items() if v is not None
                                              for w in ("--option", f"{k}={v}")]]
        return words

    def prepare(self, options: dict, classes: list[str], source: str) -> object:
        """What ``draw`` needs beyond the labels, read and checked once (a matrix file); ``source`` names where the
        options come from, for errors."""
        return None

    def draw(self, clean: np.ndarray, rows: np.ndarray, cols: np.ndarray, gamma: float, rng: np.random.Generator,
             prepared: object) -> np.ndarray:
        """Outcome of each clean positive (``rows``, ``cols``: np.nonzero(clean), row-major): KEEP, DROP or the
        replacing class."""
        raise NotImplementedError(f"noise model {self.name}: draw")

    def transition(self, clean: np.ndarray, gamma: float, prepared: object) -> np.ndarray:
        """C x (C + 1): row i = where a clean positive of class i ends (column C: dropped) when its image holds the
        typical label set; models whose draw depends on the image (uniform) give the average over ``clean``."""
        raise NotImplementedError(f"noise model {self.name}: transition")


def missing_file(path: str, root: str | Path | None) -> str | None:
    """The problem when ``path`` (relative: to the project's folder ``root``) is not a file; None when it is, or
    when ``root`` is None (not looked up). Jobs run in the project's folder, so that is where a relative path leads,
    whatever the folder the check runs from."""
    if root is None or (Path(root) / path).is_file():
        return None
    return f"{path}: no such file" + ("" if Path(path).is_absolute() else f" in the project ({root})")


def register_noise_model(name: str):
    """Class decorator: one instance of the class serves as the model ``name``."""
    def wrap(cls):
        if name in register_noise_model.MODELS:
            raise NoisyMLTError(f"noise model {name!r} registered twice")
        model = cls()
        model.name = name
        model.label = model.label or name
        register_noise_model.MODELS[name] = model
        return cls
    return wrap


register_noise_model.MODELS = {}


def flips(n: int, gamma: float, rng: np.random.Generator) -> np.ndarray:
    """Which of ``n`` positives leave (probability gamma each): the first draw of every model, one uniform each."""
    return rng.random(n) < gamma


def replaced_by_rows(R: np.ndarray, cols: np.ndarray, gamma: float, rng: np.random.Generator) -> np.ndarray:
    """Outcomes of the positives of classes ``cols`` when a leaving positive of class i is replaced by a class drawn
    from row i of ``R`` (C x C, rows summing to 1): a uniform per positive (leave?), then one per leaving positive."""
    out = np.full(cols.size, KEEP, dtype=np.int64)
    flip = flips(cols.size, gamma, rng)
    out[flip] = inverse_cdf(R[cols[flip]], rng.random(int(flip.sum())))
    return out


def inverse_cdf(rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Index drawn from each row's distribution (``rows``: one probability row per draw) by its uniform ``u``:
    the first cumulative entry above u. Zero-probability entries are never drawn."""
    cdf = np.cumsum(rows, axis=1)
    cdf /= cdf[:, -1:]  # last entry exactly 1.0, so a uniform in [0, 1) never runs past the end
    return (cdf <= u[:, None]).sum(axis=1)


def read_matrix(path: str | Path, classes: list[str], what: str) -> np.ndarray:
    """A C x C row-stochastic matrix from a CSV file (a header row of class names, then one row per class, its
    first cell the class name) or a .npy array (told by its bytes, whatever the suffix), checked: numbers, shape,
    class order, values in [0, 1], rows summing to 1."""
    import io

    path = Path(path)
    if not path.is_file():
        raise NoisyMLTError(f"{what}: {path}: no such file")
    C = len(classes)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise NoisyMLTError(f"{what}: {path}: cannot read it ({exc.strerror or exc})") from exc
    if data.startswith(b"\x93NUMPY") or path.suffix.lower() == ".npy":
        try:
            M = np.load(io.BytesIO(data), allow_pickle=False)
        except Exception as exc:  # ValueError (a pickled array), EOFError (empty), OSError, ...: not an array file
            raise NoisyMLTError(f"{what}: {path}: not a readable .npy array ({cause(exc)})") from exc
        if not (np.issubdtype(M.dtype, np.integer) or np.issubdtype(M.dtype, np.floating) or M.dtype == bool):
            raise NoisyMLTError(f"{what}: {path}: holds {M.dtype} values; a matrix holds real numbers")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise NoisyMLTError(f"{what}: {path}: not UTF-8 text ({exc.reason} at byte {exc.start}); a matrix is a "
                                "CSV file or a .npy array") from exc
        lines = [line.split(",") for line in text.splitlines() if line.strip()]
        if not lines:
            raise NoisyMLTError(f"{what}: {path}: empty file")
        header = [c.strip() for c in lines[0][1:]]
        names = [row[0].strip() for row in lines[1:]]
        if header != list(classes) or names != list(classes):
            raise NoisyMLTError(f"{what}: {path}: the header row and the first column must name the dataset's {C} "
                                f"classes in its order ({', '.join(classes[:4])}{', ...' if C > 4 else ''})")
        ragged = [row for row in lines[1:] if len(row) - 1 != C]  # else numpy's error reads "not a number"
        if ragged:
            raise NoisyMLTError(f"{what}: {path}: row {ragged[0][0].strip()!r} has {len(ragged[0]) - 1} values, "
                                f"need {C} (one per class)")
        try:
            M = np.array([[float(v) for v in row[1:]] for row in lines[1:]])
        except ValueError as exc:
            raise NoisyMLTError(f"{what}: {path}: a cell is not a number ({exc})") from exc
    if M.shape != (C, C):
        raise NoisyMLTError(f"{what}: {path}: shape {M.shape}, the dataset has {C} classes: need {C} x {C}")
    M = M.astype(np.float64)
    if not np.isfinite(M).all() or (M < 0).any() or (M > 1).any():
        raise NoisyMLTError(f"{what}: {path}: entries must be probabilities in [0, 1]")
    sums = M.sum(axis=1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-4)  # six written decimals (0.333333 x 3) pass
    if bad.size:
        raise NoisyMLTError(f"{what}: {path}: row {classes[bad[0]]!r} sums to {sums[bad[0]]:.6g}, not 1 "
                            f"({bad.size} row(s) off)")
    return M
