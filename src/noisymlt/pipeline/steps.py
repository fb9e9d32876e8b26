"""Every pipeline step, declared once: its name, inputs, outputs, the params it reads and its command.

Both routes are derived from this table:

- Snakemake: a rule of ``workflow/rules/*.smk`` takes its ``input``, ``output`` and ``shell`` from its step
  (``step.input``, ``step.output``, ``step.shell``) and adds only what is Snakemake's policy (threads, resources,
  priorities, logs, the report's captions);
- DVC: ``noisymlt dvc-yaml`` (``noisymlt.pipeline.dvc_yaml``) writes ``dvc.yaml`` and the run stages' shard files
  from it, with DVC's own templating (``foreach``, ``vars``); the committed files are checked against
  what it writes (tests/test_dvc.py).

A command is the ``noisymlt`` words after ``python -m noisymlt``, with placeholders each route renders its way:
``{input.NAME}`` and ``{output.NAME}`` (a path pattern of ``noisymlt.pipeline.layout``; ``{input}`` for a step's
only input, as Snakemake writes it) and ``{FIELD}``
(a wildcard for Snakemake, ``${item.FIELD}`` of the stage's list for DVC). A path pattern may be a field alone
(``{images}``): a value DVC's list holds per item because DVC's templating cannot compute it.

A step whose words depend on a dataset's kind declares them as ``{args}`` and the function that computes them
(``args``, from noisymlt.pipeline.paths): Snakemake's rule computes them as a param, ``noisymlt params`` writes them
into each item of the DVC stage's list, so both routes run the same explicit command. A step whose DVC stage runs
another command (``dvc_command``) says so: a run or a selection candidate (``noisymlt step train``: its resolved
configuration is written first, then the same declared words run), the selection's choice and the aggregate (they
read lists DVC's templating cannot expand) and the code digests (Snakemake's rule passes its in-memory config, DVC's
stage the params file).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Callable

from noisymlt.data.noise_models import PAPER
from noisymlt.pipeline import layout as L
from noisymlt.pipeline import paths as P

PARAMS_FILE = "dvc-params.json"  # the merged params DVC reads (noisymlt.pipeline.params)


@dataclass(frozen=True)
class Out:
    """An output with DVC options (persist, cache), or one Snakemake must not own (``snakemake=False``)."""

    path: str
    persist: bool = False
    cache: bool = True
    snakemake: bool = True


# Placeholders Snakemake fills itself (a rule's threads and resources, its log): left as they are.
SNAKEMAKE_NAMES = ("input", "output", "log", "threads")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)((?:\.[a-z_]+)?)(:q)?\}")


@dataclass(frozen=True)
class Step:
    name: str  # the Snakemake rule's and the DVC stage's name
    command: str  # noisymlt words with placeholders (module docstring)
    input: dict = field(default_factory=dict)  # NAME -> path pattern, read by both routes
    output: dict = field(default_factory=dict)  # NAME -> path pattern or Out
    computed: tuple = ()  # placeholders that are values computed from the params (a rule's params; DVC: see dvc_values)
    args: Callable[[dict, dict], list[str]] | None = None  # the `{args}` of a step whose words depend on a dataset's
    # kind: (params, the item's fields: a rule's wildcards, a DVC stage's item) -> the words (noisymlt.pipeline.paths)
    then: str | None = None  # a second command of the same job (a run's evaluation after its training)
    over: str | None = None  # DVC: the list in the params' dvc block the stage is repeated over (foreach)
    dvc_input: dict = field(default_factory=dict)  # DVC only: deps where the rule has an input function
    dvc_values: str | None = None  # DVC: the dvc block key holding the computed values (else the stage's items)
    params: tuple = ()  # DVC: keys of dvc-params.json the stage tracks
    code: tuple = ()  # the commands whose code digest files the stage depends on (default: its command word)
    metrics: dict = field(default_factory=dict)  # DVC metrics files (Snakemake: outputs), NAME -> pattern
    dvc_command: str | None = None  # DVC runs this instead of ``command`` (see the module docstring)
    config_first: bool = False  # a run: its resolved config is written to {output.requested} before the command
    scheduling: str = ""  # words only Snakemake's job adds to ``command``: the cores and card slots it was given
    dvc_only: bool = False  # no Snakemake rule (DVC's own bookkeeping)
    snakemake_only: bool = False  # no DVC stage (its inputs are lists DVC's templating cannot expand)
    shard: bool = False  # a run stage: written into each shard file of workflow/dvc/runs (dvc_yaml)
    note: str = ""  # the comment above the stage in dvc.yaml

    # ------------------------------------------------------------------ Snakemake
    def smk(self, words: str) -> str:
        """Words as a rule's shell writes them: wildcards as ``{wildcards.NAME}``, computed values as the rule's
        ``{params.NAME}``; Snakemake's own placeholders (input, output, log, threads, resources) as they are."""
        def one(m: re.Match) -> str:
            name, attr, quote = m.group(1), m.group(2), m.group(3) or ""
            if name in SNAKEMAKE_NAMES or name == "resources":
                return m.group(0)
            return "{%s.%s%s%s}" % ("params" if name in self.computed else "wildcards", name, attr, quote)

        return _PLACEHOLDER.sub(one, words)

    @property
    def shell(self) -> str:
        """The rule's shell command: ``$NOISYMLT_CLI`` (the jobs' interpreter, common.smk) and the step's words, its
        output to the rule's log. Snakemake reruns a job whose rule's shell text changed (its `code` trigger), so a
        step's words are kept as its rule wrote them before they were declared here: a finished grid stays done."""
        shell = f"$NOISYMLT_CLI {self.smk(self.command)}{' ' + self.scheduling if self.scheduling else ''} > {{log}} 2>&1"
        if self.config_first:  # the config is the rule's param `config` (a changed one reruns the job)
            shell = "printf '%s\\n' {params.config:q} > {output.requested} && " + shell
        if self.then:
            shell += f" && $NOISYMLT_CLI {self.smk(self.then)} >> {{log}} 2>&1"
        return shell

    def outputs(self, **wrap) -> dict:
        """The rule's outputs (DVC's metrics files too; not what Snakemake must not own), each optionally wrapped
        (``html=lambda path: report(path, ...)``: the report's captions are Snakemake's)."""
        files = {k: v.path if isinstance(v, Out) else v for k, v in self.output.items()
                 if not isinstance(v, Out) or v.snakemake}
        files.update(self.metrics)
        return {k: wrap[k](v) if k in wrap else v for k, v in files.items()}

    # ------------------------------------------------------------------ DVC
    def code_words(self) -> tuple:
        return self.code or ((self.dvc_command or self.command).split()[0],)


def argv(words: str, values: dict) -> list[str]:
    """A command's words with every placeholder filled: how ``noisymlt step`` runs a step's declared command under
    DVC. ``values``: ``input.NAME``, ``output.NAME`` and the other placeholders' names -> a text (one word) or a
    list of words (none, one or several: optional flags such as ``--selection FILE``)."""
    def one(m: re.Match) -> str:
        key = m.group(1) + m.group(2)
        if key not in values:
            raise KeyError(f"no value for {{{key}}} in {words!r}")
        value = values[key]
        return shlex.join(map(str, value)) if isinstance(value, (list, tuple)) else shlex.quote(str(value))

    return shlex.split(_PLACEHOLDER.sub(one, words))


def dvc_path(pattern: str, plain: bool) -> str:
    """A path pattern as a stage over a list writes it (``plain``: a list of names, whose fields are all ``${item}``)."""
    return L.dvc(pattern, item=None if plain else "item")


def _files(stem: str, *extensions: str) -> dict:
    """A report's files: NAME -> STEM.EXTENSION, named by the extension's first word (cells.json: cells)."""
    return {ext.split(".")[0]: f"{stem}.{ext}" for ext in extensions}


def _run_outputs(folder: str, noise_log: bool = True) -> dict:
    """A run's (or a candidate's) files, as the rules name them; its checkpoint after its configs: a DVC output,
    persistent (kept across reruns), which Snakemake must not own (it deletes a job's outputs before a rerun)."""
    names = {"requested_config.json": "requested", "predictions.npz": "predictions", "manifest.json": "manifest",
             "run_config.json": "config", "noise_level.jsonl": "noise", "metrics.json": "metrics",
             "metrics.manifest.json": "evaluation"}
    out = {names[n]: f"{folder}/{n}" for n in L.RUN_FILES if noise_log or n != "noise_level.jsonl"}
    items = list(out.items())
    after = list(out).index("config") + (2 if noise_log else 1)
    return dict(items[:after] + [("checkpoint", Out(f"{folder}/checkpoint.pt", persist=True, snakemake=False))]
                + items[after:])


RUN_FLAGS = "--no-progress --keep-stale --expect-code {code}"  # a run, as both routes train it
# Snakemake's job passes the cores and the card slots its scheduler gave it (DVC's stage: the command's defaults)
SCHEDULING = "--cores {threads} --runs-per-gpu {resources.runs_per_gpu}"
EVALUATE = "evaluate --predictions {output.predictions} --test-labels {input.%s} --split {input.split} " \
           "--out {output.metrics} --map-out {output.map}"

STEPS: tuple[Step, ...] = (
    Step(
        "params", "params ${dvc.layer_args} --out dvc-params.json", dvc_only=True,
        input={f"layer{i}": "${dvc.layer_files[%d]}" % i for i in range(4)} | {"code": "src/noisymlt"},
        output={"params": Out("dvc-params.json", cache=False, persist=True),
                "runs": Out("dvc-params-runs", cache=False, persist=True)},
        code=("-",),
        note="dvc-params.json, rewritten when a layer (or the merging code) changed: `dvc exp run -S LAYER:KEY=VALUE`.\n"
             "The layers are the ones the file was last written from (dvc.layer_args; unused slots of dvc.layer_files\n"
             "repeat the first). The file itself is a git-tracked output (cache: false): DVC's templating reads it at\n"
             "every revision `dvc metrics diff` and `dvc exp show` compare. Persistent, so the command can compare the\n"
             "old values with the new and warn about a change a schedule overrides; dvc-params-runs holds the run\n"
             "stages' lists, a file per shard of workflow/dvc/runs (git-tracked too). Its code dependency is the\n"
             "package itself (the code digests are written from this stage's output).",
    ),
    Step(
        "code_digests", "code-deps --params-json {config:q} --out {output}", computed=("config",),
        dvc_command="code-deps --params dvc-params.json --out {output}",
        dvc_input={"code": "src/noisymlt"}, output={"code": L.CODE_DIR}, params=("methods",), code=("-",),
        note="DVC's code dependencies (data/code/COMMAND.json, data/code/train/METHOD.json): a file is rewritten only\n"
             "when the static import closure of its step changed. A method's losses are part of its training code\n"
             "(`methods`). Snakemake's rule writes the same files from its in-memory config (--params-json).",
    ),
    Step(
        "raw", "{args}", computed=("args",), over="${dvc.raw}",
        args=lambda p, f: P.raw_argv(p, f["dataset"]),
        output={"raw": Out("{raw}", persist=True)}, params=("datasets.{dataset}",), code=("{command}",),
        note="The kind's command (noisymlt.data.kinds: raw_argv), once a raw folder; none for a user's own folder.\n"
             "Snakemake: make_raw (a command that makes the files) and download (a local rule: compute nodes often\n"
             "have no internet), each over the markers of its datasets. DVC cannot name keys that only some kinds\n"
             "have (datasets.toy.toy), so the whole block; download.mirror/retries\n"
             "change how bytes arrive, not which (checksums), so not listed. Persistent: a rerun keeps verified\n"
             "archives and finished extractions instead of DVC deleting gigabytes first; the toy generator swaps its\n"
             "folder in whole (no stale files).",
    ),
    Step(
        "parse_labels", "{args}", computed=("args",), over="${dvc.parse_labels}",
        args=lambda p, f: P.parse_argv(p, f["dataset"], f["part"], L.fill(L.LABELS, **f)),
        dvc_input={"raw": "{raw}"}, output={"labels": L.LABELS},
        params=("datasets.{dataset}.kind",), code=("{command}",),
        note="The kind's command (noisymlt.data.kinds: parse_argv), which reads the raw folder (a user's own too).",
    ),
    Step(
        "longtail", "{args}", computed=("args",), over="${dvc.longtail}",
        args=lambda p, f: P.longtail_argv(p, f["dataset"], *(L.fill(x, **f) for x in (L.SOURCE_LABELS, L.TRAIN_LABELS,
                                                                                        L.CLASS_SPLIT))),
        input={"labels": L.SOURCE_LABELS}, output={"labels": L.TRAIN_LABELS, "split": L.CLASS_SPLIT},
        params=("datasets.{dataset}.kind", "datasets.{dataset}.longtail"), code=("longtail",),
    ),
    Step(
        "train_images", "{args}", computed=("args",), over="${dvc.fetch_images}",
        args=lambda p, f: P.train_images_argv(p, f["dataset"], L.fill(L.TRAIN_LABELS, **f), L.fill(L.TRAIN_IMAGES, **f)),
        input={"labels": L.TRAIN_LABELS}, dvc_input={"raw": "{raw}"},
        output={"images": Out(L.TRAIN_IMAGES, persist=True)},
        params=("datasets.{dataset}.kind",), code=("{command}",),
        note="Snakemake: fetch_train_images. Kinds that fetch their train images for the subset only (COCO's\n"
             "fetch-coco-images); the others read theirs from the raw folder. Persistent: the fetch keeps the images\n"
             "already there, so an interrupted fetch resumes.",
    ),
    Step(
        "pretrain", "{args}", computed=("args",), over="${dvc.pretrain}",
        args=lambda p, f: P.pretrain_argv(p, f["name"], L.fill(L.PRETRAINED, **f)),
        output={"weights": L.PRETRAINED, "report": L.PRETRAINED_REPORT, "manifest": L.PRETRAINED_MANIFEST},
        params=("pretrain.{name}",), code=("pretrain",),
        note="The backbones runs' weights_path names (the demo's ImageNet); none at paper scale.",
    ),
    Step(
        "assets", "{args}", computed=("args",), over="${dvc.assets}",
        args=lambda p, f: P.asset_argv(p, f["path"]),
        output={"asset": "{path}"}, params=("assets.{group}.{name}",), code=("fetch-asset",),
        note="Snakemake: fetch_asset. ImageNet weights, GloVe vectors (params `assets`) the runs read; none in the demo.",
    ),
    Step(
        "cache_images", "{args}", computed=("args",), over="${dvc.caches}",
        args=lambda p, f: P.cache_argv(p, f["dataset"], f["part"], L.fill(L.CACHE, dataset=f["dataset"], part=f["part"])),
        input={"labels": L.LABELS}, dvc_input={"images": "{images}"},
        output={"array": L.CACHE, "index": L.CACHE_INDEX, "manifest": L.CACHE_MANIFEST},
        params=("train.cache_size", "datasets.{dataset}"), code=("cache-images",),
        note="Every image of the train subset / test set decoded once (read by train.loader: cache); `images` is the\n"
             "folder the part's label paths are relative to; the dataset's train block may set cache_size.\n"
             "Snakemake: cache_train_images, cache_test_images (one rule per part: the report's rule graph).",
    ),
    Step(
        "noise", "{args}", computed=("args",), over="${dvc.noisy_sets}",
        args=lambda p, f: P.noise_argv(p, f["dataset"], f["gamma"], f["seed"], L.noise_name(f["noise"])),
        input={"labels": L.TRAIN_LABELS}, dvc_input={"model_file": "{model_file}"}, code=("noise/{model}",),
        output={"labels": L.NOISY, "stats": L.NOISY_STATS},
        note="The grid's noisy sets and the selection's (dvc.noisy_sets), one a noise model, rate and seed; the\n"
             "paper's model's words are `noise --labels ... --gamma ... --seed ... --out ... --stats ...`, another's\n"
             "add --model and its settings (params noise.MODEL); [CL]'s published labels (model authors) run\n"
             "authors-noise. model_file: the file those settings name, or the folder of several, if any.",
    ),
    Step(
        "select_split", "{args}", computed=("args",), over="${dvc.select_datasets}",
        args=lambda p, f: P.select_split_argv(p, f["dataset"], L.fill(L.SELECT_SPLIT, **f)),
        dvc_input={"noisy": "data/{dataset}/noisy"}, output={"split": L.SELECT_SPLIT},
        params=("selection.held_out", "selection.split_seed", "selection.gammas", "selection.seeds"),
        code=("select",),
        note="Model selection (params `selection`, noisymlt.pipeline.selection; Snakemake: workflow/rules/select.smk):\n"
             "a held-out split per dataset, fit / val parts of each selection set (noisy labels only), candidate runs\n"
             "on the fit part scored against the val part, one choice per method and stage. A final run depends on\n"
             "its method's choice file, which holds the chosen values only: a redone selection that chooses the same\n"
             "values changes no hash and reruns no final run. The split reads the selection sets' noisy tables (DVC\n"
             "cannot list a variable number of files: their folder).",
    ),
    Step(
        "select_parts", "select parts --noisy {input.noisy} --split {input.split} --fit {output.fit} --val {output.val}",
        over="${dvc.select_sets}", input={"noisy": L.with_noise(L.NOISY, PAPER), "split": L.SELECT_SPLIT},
        output={"fit": L.part(L.SELECT_PART, "fit"), "val": L.part(L.SELECT_PART, "val")},
    ),
    Step(
        "cache_select_images", "{args}", computed=("args",), over="${dvc.select_caches}",
        args=lambda p, f: P.select_cache_argv(p, f["dataset"], f["part"],
                                              L.fill(L.SELECT_CACHE, dataset=f["dataset"], part=f["part"])),
        dvc_input={"labels": "{labels}", "images": "{images}"},
        output={"array": L.SELECT_CACHE, "index": L.SELECT_CACHE_INDEX, "manifest": L.SELECT_CACHE_MANIFEST},
        params=("train.cache_size", "datasets.{dataset}"), code=("cache-images",),
        note="The fit / val images decoded once (train.loader: cache).",
    ),
    Step(
        "select", "select choose --selection {selection:q} --dataset {dataset} --method {method} --stage {stage} "
                  "{previous}",
        computed=("selection", "previous"), over="${dvc.selections}",
        dvc_command="step select-choose --params dvc-params.json --dataset {dataset} --method {method} --stage {stage}",
        dvc_input={"candidates": L.STAGE_DIR, "previous": "{previous}"},
        output={"stage": L.STAGE_FILE, "choice": L.CHOICE_FILE},
        params=("selection.grids", "selection.gammas", "selection.seeds", "selection.tie_margin", "selection.prefer"),
        code=("step", "select"),
        note="The candidate runs of a selection (train_candidate) and the runs of the grid and the ablations (train)\n"
             "are stages of workflow/dvc/runs/SHARD/dvc.yaml (see there why), in the same DAG: `select` depends on\n"
             "its candidates' folder (`dir`) and on the choice of the stage before (`previous`), `aggregate` on `runs`.\n"
             "Snakemake: a checkpoint, whose choice the later stages and the final runs read.",
    ),
    Step(
        "aggregate", "aggregate {input} --out {output.results} --curves {output.curves} "
                     "--pseudo-label-curves {output.pseudo_labels}",
        dvc_command="step aggregate --params dvc-params.json --runs runs --out {output.results} "
                    "--curves {output.curves} --pseudo-label-curves {output.pseudo_labels}",
        dvc_input={"runs": "runs"},
        output={"results": L.RESULTS, "curves": L.CURVES, "pseudo_labels": L.PSEUDO_LABEL_CURVES},
        params=("grid",), code=("step", "aggregate"),
        note="Collects exactly the runs of the grid and the ablations, as Snakemake does (its input: their\n"
             "metrics files; DVC's: `runs`, which orders it after every train stage and holds nothing else that a\n"
             "pull would not restore, .dvcignore: logs, timings). training_curves.json and pseudo_label_curves.json:\n"
             "the runs' per-epoch records (`plots`).",
    ),
    Step(
        "structure", "structure --labels {input.labels} --split {input.split} --test-labels {input.test} "
                     "--out {output.json} --md {output.md}",
        over="${dvc.grid.datasets}",
        input={"labels": L.TRAIN_LABELS, "split": L.CLASS_SPLIT, "test": L.TEST_LABELS},
        output=_files(L.STRUCTURE, "json", "md", "manifest.json"),
        note="Each dataset's long-tailed subset beside VOC-MLT's and COCO-MLT's.",
    ),
    Step(
        "table_total", "table --results {input} --out {output.tex} --labels {labels:q} --methods {methods}",
        computed=("labels", "methods"), dvc_values="report",
        input={"results": L.RESULTS},
        output=_files(L.TABLE_TOTAL, "tex", "md", "html", "rendered.json"),
        metrics=_files(L.TABLE_TOTAL, "cells.json"),
        params=("grid.methods", "methods"),
        note="Rows: grid.methods, titled by methods.*.label. rendered.json: where each cell stands in the files\n"
             "(noisymlt trace). Metrics: every cell's mean and CI (cells.METHOD/HEAD/DATASET/GAMMA.mean), for\n"
             "`dvc metrics show` and `dvc exp show`.",
    ),
    Step(
        "table_groups", "table --results {input.results} --out {output.tex} --groups {dataset} "
                        "--train-labels {input.labels} --labels {labels:q} --methods {methods}",
        computed=("labels", "methods"), dvc_values="report", over="${dvc.grid.datasets}",
        input={"results": L.RESULTS, "labels": L.TRAIN_LABELS},
        output=_files(L.TABLE_GROUPS, "tex", "md", "cells.json", "html", "rendered.json"),
        params=("grid.methods", "methods"),
        note="The train labels give the group thresholds it records, stated when scaled.",
    ),
    Step(
        "table_fit", "fit-table --results {input} --dataset {dataset} --out {output.tex} --methods {methods} "
                     "--labels {labels:q}",
        computed=("labels", "methods"), dvc_values="report", over="${dvc.grid.datasets}",
        input={"results": L.RESULTS},
        output=_files(L.FIT_TABLE, "tex", "md", "csv", "html"),
        params=("grid.methods", "methods"),
    ),
    Step(
        "figure_map_vs_gamma", "figure --results {input} --out {output.png} --methods {methods} --labels {labels:q}",
        computed=("labels", "methods"), dvc_values="report",
        input={"results": L.RESULTS},
        output=_files(L.MAP_FIGURE, "png", "pdf"),
        params=("grid.methods", "methods"),
        note="Lines: grid.methods (the compared methods only: the ablation variants have their figures); legend:\n"
             "methods.*.label.",
    ),
    Step(
        "authors_eval",
        "eval-cl-checkpoint --checkpoint {file} --sha256 {checksum} --test-labels {input.test} --split {input.split} "
        "--test-images {test_images} {options} --out " + L.AUTHORS_RUN + " --no-progress",
        computed=("file", "checksum", "test_images", "options"), scheduling="--cores {threads}",
        over="${dvc.authors_checkpoints}",
        input={"test": L.TEST_LABELS, "split": L.CLASS_SPLIT},
        dvc_input={"checkpoint": "{file}", "raw": "{raw_marker}"},
        output={"predictions": L.within(L.AUTHORS_RUN, "predictions.npz"),
                "metrics": L.within(L.AUTHORS_RUN, "metrics.json"),
                "manifest": L.within(L.AUTHORS_RUN, "manifest.json")},
        metrics={"map": L.within(L.AUTHORS_RUN, "map.json")},
        params=("authors_checkpoints.{name}",),
        note="[CL]'s own trained models (params authors_checkpoints: NAME -> dataset, file, sha256; none by default),\n"
             "each checked against its sha256, converted into Ours' two-branch model and evaluated on the dataset's\n"
             "test set with [CL]'s test-time transform, as a run is (docs/noise-models.md, \"[CL]'s trained models\").\n"
             "raw: the raw folder's marker file (the test images are in place once it is). Metrics: mAP (%) per head\n"
             "and group, beside the runs'.",
    ),
    Step(
        "train_candidate",
        "train --run-config {output.requested} --train-labels {input.train} --test-labels {input.val} "
        "--split {input.split} --train-images {images} --test-images {images} {caches} --out {out} " + RUN_FLAGS,
        then=EVALUATE % "val", computed=("images", "caches", "out", "code"), config_first=True, scheduling=SCHEDULING,
        over="${shard.candidates}", shard=True,
        dvc_command="step train-candidate --params dvc-params.json --dataset {dataset} --method {method} "
                    "--stage {stage} --tag {tag} --gamma {gamma} --seed {seed} --evaluate",
        input={"train": L.part(L.SELECT_PART, "fit"), "val": L.part(L.SELECT_PART, "val"), "split": L.CLASS_SPLIT},
        dvc_input={"previous": "{previous}", "images": "{images}", "raw": "{raw}", "weights": "{weights}",
                   "embeddings": "{embeddings}", "fit_cache": L.part(L.SELECT_CACHE, "fit"),
                   "val_cache": L.part(L.SELECT_CACHE, "val")},
        output=_run_outputs(L.CANDIDATE, noise_log=False), metrics={"map": L.CANDIDATE + "/map.json"},
        params=("dvc.candidate_configs.{config_key}",), code=("step", "train/{method}", "evaluate"),
        note="A candidate is an ordinary training run on the fit part, its \"test\" set the val part (train images),\n"
             "then evaluated against it (`then`; DVC: --evaluate). `previous`: the choice of the stage before (stage\n"
             "1: the split file); images, raw, weights, embeddings as in `train`. Metrics: validation mAP (%) against\n"
             "the held-out noisy labels, per head and group (`dvc exp show`).",
    ),
    Step(
        "train",
        "train --run-config {output.requested} --train-labels {input.train} --test-labels {input.test} "
        "--split {input.split} --train-images {train_images} --test-images {test_images} {caches} --out {out} "
        + RUN_FLAGS + " --clean-labels {input.subset} --provenance raw_manifest={input.raw} clean_subset={input.subset} "
        "{selection}",
        then=EVALUATE % "test", computed=("train_images", "test_images", "caches", "out", "code", "selection"),
        config_first=True, scheduling=SCHEDULING, over="${shard.runs}", shard=True,
        dvc_command="step train --params dvc-params.json --dataset {dataset} --method {method} --gamma {gamma}{noise} "
                    "--seed {seed} --train-labels {input.train} --test-labels {input.test} --split {input.split} "
                    "--out " + L.RUN + " --evaluate",
        input={"train": L.NOISY, "test": L.TEST_LABELS, "split": L.CLASS_SPLIT, "subset": L.TRAIN_LABELS},
        dvc_input={"raw": "{raw}", "images": "{images}", "weights": "{weights}", "embeddings": "{embeddings}",
                   "train_cache": L.part(L.CACHE, "train"), "test_cache": L.part(L.CACHE, "test"),
                   "choice": "{choice}"},
        output=_run_outputs(L.RUN), metrics={"map": L.RUN + "/map.json"},
        params=("dvc.run_configs.{config_key}", "dvc.train_lr.{dataset}.{method}"),
        code=("step", "train/{method}", "evaluate"),
        note="One stage per run (keyed DATASET-GAMMA-SEED-METHOD): it trains, then evaluates (`then`; DVC: --evaluate),\n"
             "as Snakemake's train job does, in one command: with workflow.preload (the demo) both run in children of\n"
             "one shared preload server (noisymlt.pipeline.preload). One stage, not two: DVC rewrites a lock and\n"
             "rebuilds its index after each stage it runs; a change that reaches the evaluation only (its code) reruns\n"
             "the stage, and the train step then finds its finished checkpoint and only predicts.\n"
             "Inputs: the subset's sha256 goes into the run manifest (`subset`). train.loader pil: `raw` is the raw\n"
             "folder (test images; VOC, toy: train images too) and `images` COCO's fetched train images (other kinds:\n"
             "raw again); train.loader cache: both are the raw folder's marker file, cheap to hash where a folder is\n"
             "walked file by file on every `dvc status`, as for `weights` (train.weights_path) and `embeddings`\n"
             "(ML-GCN's GloVe file) when a run has none. The caches are listed whatever the loader (DVC cannot make a\n"
             "dep conditional); `choice`: its method's model-selection choice (fixed values: the marker).\n"
             "Params: the run id, the hash of its resolved configuration (noisymlt.config.resolve_run), so a params\n"
             "change reruns exactly the runs whose configuration it changes; and its lr, readable, for `dvc exp show`.\n"
             "Outputs: checkpoint.pt is persistent (DVC would delete it before a rerun; kept, an interrupted run\n"
             "resumes from its last epoch) and cached, so a pulled run keeps its weights; Snakemake does not own it\n"
             "(it deletes a job's outputs before it runs). Metrics: mAP (%) per prediction head and group, one row\n"
             "per run folder (`dvc metrics show`).",
    ),
    # Snakemake only: each reads a list of runs that DVC's templating cannot expand, or measures time (not a result)
    Step(
        "table_paired", "paired-table --results {input} --dataset {dataset} --out {output.tex} --methods {methods} "
                        "--labels {labels:q}",
        computed=("labels", "methods"), snakemake_only=True, input={"results": L.RESULTS},
        output=_files(L.PAIRED_TABLE, "tex", "md", "cells.json", "html"),
    ),
    Step(
        "table_ablation", "table --results {input} --out {output.tex} --ablation-spec {spec:q} --labels {labels:q}",
        computed=("spec", "labels"), snakemake_only=True, input={"results": L.RESULTS},
        output=_files(L.ABLATION, "tex", "md", "cells.json", "rendered.json", "html"),
    ),
    Step(
        "figure_sweep", "figure --results {input} --out {output.png} --ablation-spec {spec:q} --x {x:q}",
        computed=("spec", "x"), snakemake_only=True, input={"results": L.RESULTS},
        output=_files(L.ABLATION, "png", "pdf", "csv"),
    ),
    Step(
        "inference_time", "inference-time --runs {runs} --test-labels {input.test} --train-images {train_images} "
                          "--test-images {test_images} --batch-sizes {batch_sizes} --trials {trials} --labels {labels:q} "
                          "--paper {paper:q} --out {output.tex}",
        computed=("runs", "train_images", "test_images", "batch_sizes", "trials", "labels", "paper"),
        snakemake_only=True, input={"test": L.TEST_LABELS},
        output=_files(L.INFERENCE_TIME, "tex", "md", "json", "html"),
    ),
    Step(
        "readme_numbers", "readme-numbers --results {input.results} --methods {methods} --labels {labels:q} "
                          "--selection {input.selection} --structure {input.structure} --out {output}",
        computed=("methods", "labels"), snakemake_only=True, input={"results": L.RESULTS},
        output={"numbers": L.README_NUMBERS},
    ),
    Step(
        "figure_noise_level", "noise-figure --logs {input} --out {output.png} --title {title:q} --smooth 5",
        computed=("title",), snakemake_only=True, output=_files(L.NOISE_FIGURE, "png", "pdf", "csv", "md"),
    ),
    Step(
        "figure_pseudo_labels", "pseudo-label-figure --run {run} --train-labels {input.noisy} --clean-labels "
                                "{input.clean} --split {input.split} --train-images {train_images} --out {output.png}",
        computed=("run", "train_images"), snakemake_only=True,
        input={"clean": L.TRAIN_LABELS, "split": L.CLASS_SPLIT}, output=_files(L.PSEUDO_FIGURE, "png", "pdf"),
    ),
)


def by_name() -> dict[str, Step]:
    return {step.name: step for step in STEPS}
