"""params.yaml: loading, layering, validation, and the resolved configuration of one run as its train job reads it.

The resolved run config is the single thing a training run depends on besides its input files;
its hash is the run id that every manifest, result row and table cell refers to.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from pathlib import Path

import yaml

from noisymlt.data.assets import with_asset_files
from noisymlt.data.noise_models import PAPER
from noisymlt.errors import NoisyMLTError, cause
from noisymlt.methods.options import check_options, method_options
from noisymlt.core.schema import ParamsError, check_schema

SCHEMA_PATH = Path(__file__).with_name("params.schema.yaml")
DEFAULT_SCHEDULE = "cl"


def deep_merge(base: dict, override: dict) -> dict:
    """Recursive dict update (lists and scalars replace), as Snakemake layers --configfile."""
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_params(*files: str | Path) -> dict:
    params: dict = {}
    layers = []
    for f in files:
        path = Path(f)
        try:
            layer = yaml.safe_load(path.read_text()) or {}
        except yaml.MarkedYAMLError as exc:  # one line: where, and what the parser found there
            mark = exc.problem_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise NoisyMLTError(f"{path}: cannot read parameters ({where}{exc.problem or exc.context})") from exc
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise NoisyMLTError(f"{path}: cannot read parameters ({cause(exc)})") from exc
        if not isinstance(layer, dict):
            raise NoisyMLTError(f"{path}: top level must be a mapping")
        layers.append((str(path), layer))
        params = deep_merge(params, layer)
    inherit_recipes(params)
    check_layered(params, layers)
    return params


def inherit_recipes(params: dict) -> dict:
    """Each clean-then-retrain method's block completed, in place, with the recipe of the method it retrains
    (``clean.of``): that block's keys, then its own (its label, description and clean; any other it sets wins), so an
    edit of ``erm``'s block reaches Clean-ERM too (noisymlt.pipeline.cleaning). ``params``, for chaining."""
    methods = params.get("methods") or {}
    for name, block in methods.items():
        of = (block.get("clean") or {}).get("of") if isinstance(block, dict) else None
        if of is None:
            continue
        base = methods.get(of)
        if not isinstance(base, dict) or base.get("clean"):
            raise NoisyMLTError(f"methods.{name}.clean.of: {of!r} is not a method without a clean block")
        inherited = {k: copy.deepcopy(v) for k, v in base.items() if k not in ("label", "description")}
        methods[name] = {**inherited, **block}
        if "train" in block and "train" in base:
            methods[name]["train"] = deep_merge(base["train"], block["train"])
    return params


def layer_of(layers: list[tuple[str, dict]], key: str) -> str:
    """The params file that set ``key`` (a dotted path): the last layer holding it, else the last one
    holding the longest part of it; all files when none does (a key that is missing everywhere)."""
    best, depth = None, 0
    for name, layer in layers:
        node, found = layer, 0
        for part in key.split(".") if key else []:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                break
            found += 1
        if found and found >= depth:  # a later layer overrides an earlier one
            best, depth = name, found
    return best or " + ".join(name for name, _ in layers)


def project_root(layers: list[tuple[str, dict]]) -> Path | None:
    """The project's folder: the one holding the first params file (params.yaml, beside the Snakefile), which the
    workflow's jobs run in; None when no layer is a file."""
    for name, _ in layers:
        if Path(name).is_file():
            return Path(name).resolve().parent
    return None


def check_layered(params: dict, layers: list[tuple[str, dict]]) -> None:
    """validate_params on params merged from ``layers`` ((file, its settings), first to last), the files they
    name looked up in the project (project_root), never the current folder: an error names the file that set the
    offending key, then the key."""
    try:
        validate_params(params, root=project_root(layers))
    except ParamsError as exc:
        raise ParamsError(layer_of(layers, exc.key), exc.key, exc.detail) from None


def validate_params(params: dict, source: str | None = None, root: str | Path | None = None) -> None:
    """JSON-schema validation (unknown keys, types, ranges) plus the cross-references a schema
    cannot express: grid entries must name configured datasets and registered methods. ``root``: the project's
    folder, where the files the settings name (a folder dataset, a noise matrix) must be; None: not looked up.
    Errors are ParamsError: ``source`` (the file), the dotted key, what is wrong."""
    check_schema(params, params_schema(), "", source)

    for name in params["grid"]["datasets"]:
        if name not in params["datasets"]:
            raise ParamsError(source, "grid.datasets", f"{name!r} has no block under datasets")
    for name, block in params["datasets"].items():
        check_kind_options(name, block, source, root)
    gamma_lists = {"grid.gammas": params["grid"]["gammas"],
                   **{f"ablations.{n}.gammas": a["gammas"] for n, a in params.get("ablations", {}).items()}}
    for key, gammas in gamma_lists.items():
        for g in gammas:
            if not isinstance(g, float):  # a rate's folders are named by str(float): 1 and 1.0 would be two names
                raise ParamsError(source, key, f"write the noise rate {g!r} as {float(g)!r}, so that "
                                               "every path names it one way")
    for name in params["grid"].get("ablations", []):
        if name not in params.get("ablations", {}):
            raise ParamsError(source, "grid.ablations", f"{name!r} has no block under ablations")
        if params["ablations"][name]["dataset"] not in params["datasets"]:
            raise ParamsError(source, f"ablations.{name}.dataset",
                              f"unknown dataset {params['ablations'][name]['dataset']!r}")
    for name, block in (params.get("authors_checkpoints") or {}).items():
        if block["dataset"] not in params["datasets"]:
            raise ParamsError(source, f"authors_checkpoints.{name}.dataset", f"unknown dataset {block['dataset']!r}")
    for name in (params.get("timing") or {}).get("methods", []):
        if name not in params["methods"]:
            raise ParamsError(source, "timing.methods", f"unknown method {name!r} (no block under methods)")
    method_lists = {"grid.methods": params["grid"]["methods"], "grid.clean_methods": params["grid"].get("clean_methods", []),
                    **{f"ablations.{n}.methods": a["methods"] for n, a in params.get("ablations", {}).items()}}
    for key, names in method_lists.items():
        for name in names:
            if name not in params["methods"]:
                raise ParamsError(source, key, f"unknown method {name!r} (no block under methods)")
    for name in params["grid"].get("clean_methods", []):
        if name not in params["grid"]["methods"]:  # a clean cell sits in a row of the main table
            raise ParamsError(source, "grid.clean_methods", f"{name!r} is not in grid.methods")
    if 0.0 in params["grid"]["gammas"]:
        raise ParamsError(source, "grid.gammas", "noise rate 0.0 is the clean column: list its methods under "
                                                 "grid.clean_methods instead")
    for name, block in params["methods"].items():
        schedule = block.get("schedule", DEFAULT_SCHEDULE)
        if schedule not in params.get("schedules", {}):
            known = ", ".join(sorted(params.get("schedules", {}))) or "none"
            raise ParamsError(source, f"methods.{name}.schedule",
                              f"unknown schedule {schedule!r}; schedules defined in params: {known}")
        check_options(block["family"], method_options(block), f"methods.{name}", source)
    validate_selection(params, source)
    check_batch_sizes(params, source)
    check_noise_models(params, source, root)
    check_cleaning(params, source)


def check_cleaning(params: dict, source: str | None = None) -> None:
    """The crossfit block and the clean-then-retrain methods' cross-references (noisymlt.pipeline.cleaning): checked
    last, so that an error in the recipe of the method a cleaned one retrains is named at that method first."""
    crossfit = params.get("crossfit")
    if crossfit and crossfit["method"] not in params["methods"]:
        raise ParamsError(source, "crossfit.method", f"unknown method {crossfit['method']!r} (no block under methods)")
    if crossfit and params["methods"][crossfit["method"]].get("clean"):  # its flags would need its own
        raise ParamsError(source, "crossfit.method", f"{crossfit['method']!r} trains on cleaned labels itself")
    for name, block in params["methods"].items():
        clean = block.get("clean")
        if not clean:
            continue
        used = {*params["grid"]["methods"], *params["grid"].get("clean_methods", []),
                *(m for a in params["grid"].get("ablations", []) for m in params.get("ablations", {}).get(a, {})
                  .get("methods", []))}
        if name in used and clean["flags"] != "oracle" and not (crossfit and crossfit.get("enabled", True)):
            raise ParamsError(source, f"methods.{name}.clean", "flags on cross-fitted probabilities: the params need "
                                                               "a crossfit block, enabled")
        base = params["methods"].get(clean["of"])
        if base is None or base.get("clean"):
            raise ParamsError(source, f"methods.{name}.clean.of", f"{clean['of']!r} is not a method without a clean "
                                                                   "block")


def check_noise_models(params: dict, source: str | None = None, root: str | Path | None = None) -> None:
    """A listed model's settings suit the grid (noisymlt.data.noise_models: NoiseModel.problems): class_conditional's
    matrix given and there, [CL]'s files there for every dataset and rate (files looked up under ``root``)."""
    from noisymlt.data.noise_models import noise_model

    grid = params["grid"]
    for name in grid.get("noise_models", []):
        options = params.get("noise", {}).get(name) or {}
        for key, problem in noise_model(name).problems(options, list(grid["datasets"]), list(grid["gammas"]), root):
            raise ParamsError(source, f"noise.{name}" + (f".{key}" if key else ""), problem)


def params_schema() -> dict:
    """params.schema.yaml with what the dataset kinds add (noisymlt.data.kinds): the kind names, and each kind's own
    block (datasets.NAME.toy, datasets.NAME.folder) with its schema; and what the noise models add
    (noisymlt.data.noise_models): their names (grid.noise_models) and their settings' blocks (noise.MODEL)."""
    from noisymlt.data.kinds import all_kinds
    from noisymlt.data.noise_models import all_noise_models

    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    block = schema["properties"]["datasets"]["additionalProperties"]
    kinds = all_kinds()
    block["properties"]["kind"] = {"enum": sorted(kinds), "description": "noisymlt.data.kinds: one module per kind"}
    for kind in kinds.values():
        block["properties"].update(kind.options)
    models = all_noise_models()
    schema["properties"]["grid"]["properties"]["noise_models"]["items"] = {"enum": sorted(models)}
    schema["properties"]["noise"]["properties"] = {name: model.schema() for name, model in models.items()}
    return schema


def check_kind_options(name: str, block: dict, source: str | None = None, root: str | Path | None = None) -> None:
    """A kind's own block (the schema allows every kind's) only under a dataset of a kind that reads it, and what
    the kind finds wrong with it (DatasetKind.problems: settings that exclude each other, files not under ``root``)."""
    from noisymlt.data.kinds import all_kinds, dataset_kind

    kind, kinds = dataset_kind(block), all_kinds()
    for key in block:
        owners = sorted(n for n, k in kinds.items() if key in k.options)
        if owners and key not in kind.options:
            raise ParamsError(source, f"datasets.{name}.{key}", f"kind {kind.name} reads no {key} block (kinds "
                                                                f"that do: {', '.join(owners)})")
    for key, problem in kind.problems(block, None if root is None else Path(root)):
        raise ParamsError(source, f"datasets.{name}.{key}", problem)


def training_images_bound(block: dict) -> int | None:
    """An upper bound on the training images of the dataset ``block`` (its long-tail subset), None where the kind
    cannot tell before its data are read."""
    from noisymlt.data.kinds import dataset_kind

    return dataset_kind(block).training_images_bound(block, block["longtail"].get("max", 800))


def check_batch_sizes(params: dict, source: str | None = None) -> None:
    """A run whose batch is larger than its training set would have no full batch: refused here, before any
    job starts, naming the key that sets it (the trainer checks the exact count when it starts)."""
    for dataset in params["grid"]["datasets"]:
        bound = training_images_bound(params["datasets"][dataset])
        for method in params["grid"]["methods"]:
            size = resolve_run(params, dataset, method, params["grid"]["gammas"][0], 0)["train"]["batch_size"]
            if bound is not None and size > bound:
                key = layer_key(params, dataset, method, "batch_size")
                raise ParamsError(source, key, f"{size} exceeds the training images of dataset {dataset!r} (at most "
                                               f"{bound}) for method {method!r}: an epoch would have no full batch")


def layer_key(params: dict, dataset: str, method: str, name: str) -> str:
    """The dotted key whose value a run's ``train.NAME`` takes (the most specific block that sets it)."""
    block = params["methods"][method]
    schedule = block.get("schedule", DEFAULT_SCHEDULE)
    for key, where in ((f"methods.{method}.train", block.get("train") or {}),
                       (f"schedules.{schedule}.train", params.get("schedules", {}).get(schedule, {}).get("train") or {}),
                       (f"datasets.{dataset}.train", params["datasets"][dataset].get("train") or {})):
        if name in where:
            return f"{key}.{name}"
    return f"train.{name}"


# Model selection (noisymlt.pipeline.selection): which methods select what, checked with the rest of the params.
PSEUDO_KEYS = ("alpha", "beta")  # the hyper-parameters that only methods with pseudo labels have


def method_entry(params: dict, method: str):
    """A method's entry under selection.methods: exact name first, then the first glob pattern matching it."""
    methods = (params.get("selection") or {}).get("methods") or {}
    if method in methods:
        return methods[method]
    for pattern, entry in methods.items():
        if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(method, pattern):
            return entry
    return None


def uses_pseudo_labels(params: dict, method: str) -> bool:
    block = params["methods"][method]
    return block["family"] == "colearning" and (block.get("pseudo") or {}).get("source", "cross") != "none"


def validate_selection(params: dict, source: str | None = None) -> None:
    """The selection block's cross-references the schema cannot express (noisymlt.pipeline.selection); errors name the key."""
    block = params.get("selection")
    if not block:
        return
    methods = params["methods"]
    for key, entry in (block.get("methods") or {}).items():
        where = f"selection.methods.{key}"
        names = [m for m in methods if fnmatch.fnmatchcase(m, key)]
        if not names and not any(ch in key for ch in "*?["):  # a pattern may match none (a layer's subset)
            raise ParamsError(source, where, f"no method is called {key!r} (no block under methods)")
        if entry is None:
            continue
        if isinstance(entry, dict):
            target = entry["same_as"]
            if target not in methods:
                raise ParamsError(source, f"{where}.same_as", f"unknown method {target!r}")
            if isinstance(method_entry(params, target), dict):
                raise ParamsError(source, f"{where}.same_as", f"{target!r} takes another method's values itself; "
                                                              "name that method")
            continue
        seen: set[str] = set()
        for i, stage in enumerate(entry):
            for name in stage:
                if name in seen:
                    raise ParamsError(source, f"{where}.{i}", f"{name!r} is selected in two stages")
                seen.add(name)
                if name not in block["grids"]:
                    raise ParamsError(source, f"{where}.{i}", f"no grid for {name!r} under selection.grids")
                for m in names:
                    if name in PSEUDO_KEYS and not uses_pseudo_labels(params, m):
                        raise ParamsError(source, f"{where}.{i}", f"{m!r} has no pseudo labels to select {name} for")


def chosen_that_apply(params: dict, method: str, values: dict) -> dict:
    """The chosen values that mean something to a method: alpha/beta only where pseudo labels are on."""
    return {k: v for k, v in values.items() if k not in PSEUDO_KEYS or uses_pseudo_labels(params, method)}


def threshold_groups(params: dict) -> dict[str, list[str]]:
    """The class groups a selected alpha / beta applies to, in every branch (selection.thresholds)."""
    return params["selection"].get("thresholds") or {"alpha": ["head"], "beta": ["tail"]}


def resolve_run(params: dict, dataset: str, method: str, gamma: float, seed: int, chosen: dict | None = None,
                chosen_by: str = "", candidate: bool = False, noise: str = PAPER) -> dict:
    """Everything one (dataset, gamma, seed, method) run depends on, with defaults layered:
    global train block < dataset overrides < the method's schedule < the method's own overrides < the values a
    model selection chose (``chosen``: lr, alpha, beta; recorded with ``chosen_by``, the choice file they came
    from, so a changed choice makes another run id).
    ``candidate``: a selection candidate's run (noisymlt.pipeline.selection), its values recorded as the
    candidate's, trained on the fit part only, its warm-up scaled to that part's share of the images so that it
    keeps its share of the shorter run.
    ``noise``: the noise model of its labels; another than the paper's adds a ``noise`` block (its name and
    settings, params noise.MODEL), so its run id differs, and the paper's runs keep theirs."""
    if dataset not in params["datasets"]:
        raise NoisyMLTError(f"unknown dataset {dataset!r}; configured: {', '.join(params['datasets'])}")
    if method not in params["methods"]:
        raise NoisyMLTError(f"unknown method {method!r}; configured: {', '.join(sorted(params['methods']))}")
    ds = params["datasets"][dataset]
    mcfg = copy.deepcopy(params["methods"][method])
    schedule = mcfg.pop("schedule", DEFAULT_SCHEDULE)
    clean = mcfg.pop("clean", None)
    schedules = params.get("schedules", {})
    if schedule not in schedules:
        raise NoisyMLTError(f"methods.{method}.schedule: unknown schedule {schedule!r}; "
                            f"configured: {', '.join(sorted(schedules)) or 'none'}")
    train = params["train"]
    for layer in (ds.get("train", {}), schedules[schedule].get("train", {}), mcfg.pop("train", {})):
        train = deep_merge(train, layer)
    train, mcfg = with_asset_files(params, ds["kind"], train, mcfg)  # the local files it reads, by name
    resolved = {
        "dataset": dataset,
        "kind": ds["kind"],
        "gamma": float(gamma),
        "seed": int(seed),
        "method": method,
        "method_cfg": mcfg,
        "schedule": schedule,
        "train": train,
        "db_loss": ds["db_loss"],
        "colearning": ds.get("colearning", {}),
    }
    if noise != PAPER:
        resolved["noise"] = {"model": noise, **(params.get("noise", {}).get(noise) or {})}
    if clean:  # its training table (noisymlt.pipeline.cleaning), and the cross-fitting its flags come from
        resolved["clean"] = {**clean, **({} if clean["flags"] == "oracle" else {"crossfit": dict(params["crossfit"])})}
    if chosen:
        resolved = _with_chosen(params, resolved, chosen, "candidate" if candidate else chosen_by)
    if candidate:
        held_out = float(params["selection"]["held_out"])
        resolved["train"]["warmup_iters"] = max(1, round(resolved["train"]["warmup_iters"] * (1 - held_out)))
        resolved["candidate"] = {"held_out": held_out, "split_seed": int(params["selection"]["split_seed"])}
    return resolved


def _with_chosen(params: dict, resolved: dict, chosen: dict, chosen_by: str) -> dict:
    """The selection's layer: chosen lr in train, chosen alpha / beta as every branch's thresholds of their class
    groups (a stage that selects alpha only keeps the reference's beta, and the other way round), and a
    `selected` record of the values and where they came from."""
    from noisymlt.methods.options import BRANCH_NAMES
    from noisymlt.methods.pseudo_labels import reference_thresholds

    values = chosen_that_apply(params, resolved["method"], chosen)
    if not values:
        return resolved
    if "lr" in values:
        resolved["train"]["lr"] = float(values["lr"])
    if any(k in values for k in PSEUDO_KEYS):
        groups = threshold_groups(params)
        per_branch = {k: {g: float(values[k]) for g in groups.get(k, [])} for k in PSEUDO_KEYS if k in values}
        base = reference_thresholds(resolved)
        pseudo = resolved["method_cfg"].setdefault("pseudo", {})
        pseudo["thresholds"] = {b: {**base.get(b, {}), **per_branch} for b in BRANCH_NAMES}
    resolved["selected"] = {"values": {k: float(v) for k, v in values.items()}, "by": chosen_by}
    return resolved


# A final run's configuration as its train job reads it: the rule writes config_text(final_run(...)) to the run's
# requested_config.json, which `noisymlt train --run-config` reads.

def read_choice(path: str | Path) -> dict:
    """The values a model selection chose (noisymlt.pipeline.selection), from its choice file."""
    from noisymlt.core.files import read_json

    record = read_json(path, "the selection's choice", require_object=True)
    if "chosen" not in record:
        raise NoisyMLTError(f"{path}: cannot read the selection's choice (no 'chosen')")
    return record["chosen"]


def final_run(params: dict, dataset: str, method: str, gamma: float, seed: int, choice: str | None,
              noise: str = PAPER) -> dict:
    """A final run's resolved config, with its method's chosen values read from the choice file (if any) as the
    configuration's last layer (resolve_run)."""
    chosen = read_choice(choice) if choice else None
    return resolve_run(params, dataset, method, gamma, seed, chosen=chosen, chosen_by=str(choice or ""), noise=noise)


def fold_run(params: dict, dataset: str, method: str, gamma: float, seed: int, fold: int, choice: str | None,
             noise: str = PAPER) -> dict:
    """A cross-fitting run's resolved config (noisymlt.pipeline.crossfit): the final run's, trained on every fold
    but ``fold`` (params crossfit), its warm-up scaled to that share of the images as a selection candidate's is,
    and a ``crossfit`` block that makes its run id its own."""
    resolved = final_run(params, dataset, method, gamma, seed, choice, noise)
    folds = int(params["crossfit"]["folds"])
    resolved["train"]["warmup_iters"] = max(1, round(resolved["train"]["warmup_iters"] * (folds - 1) / folds))
    resolved["crossfit"] = {"folds": folds, "fold": int(fold), "split_seed": int(params["crossfit"]["seed"])}
    return resolved


def config_text(resolved: dict) -> str:
    """A run's resolved config as the text the train job writes to OUT/requested_config.json (with a final
    newline) before it trains: the train command reads it."""
    return json.dumps(resolved, sort_keys=True, indent=1)


def requested_config(params: dict, dataset: str, method: str, gamma: float, seed: int, choice: str | None,
                     noise: str = PAPER) -> str:
    """A final run's requested_config.json text (final_run, config_text)."""
    return config_text(final_run(params, dataset, method, gamma, seed, choice, noise))
