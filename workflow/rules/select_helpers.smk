# Helpers of model selection's rules (select.smk; Snakemake's lint wants no function in a file of rules): the
# candidates' configs and caches, the choice a later stage or a final run reads, the stage files behind the runs.
# noisymlt.pipeline.selection spells the selection itself (its sets, stages, candidates and files).
import functools
from types import SimpleNamespace

from noisymlt.config import config_text, read_choice, resolve_run
from noisymlt.pipeline import layout, paths
from noisymlt.pipeline import selection as S


def selection_owners():
    """(dataset, the method whose selection they read) for the runs the workflow trains, each pair once."""
    runs = (r.split("|") for r in all_runs("{dataset}|{gamma}|{seed}|{method}"))
    pairs = dict.fromkeys((d, S.owner(config, m)) for d, g, s, m in runs)
    return [(dataset, who) for dataset, who in pairs if who is not None]


def selection_data():
    """The selection's files under data/ (its held-out split, each selection set's fit / val parts and their image
    caches) for every method whose candidates the workflow trains."""
    files = []
    for dataset, who in selection_owners():
        files.append(layout.fill(layout.SELECT_SPLIT, dataset=dataset))
        sets = S.selection_sets(config)
        for gamma, seed in sets:
            files += [layout.fill(layout.part(layout.SELECT_PART, part), dataset=dataset, gamma=gamma, seed=seed)
                      for part in ("fit", "val")]
        gamma, seed = sets[0]  # a candidate of the first set: its loader (the caches) is the method's, any set's
        w = SimpleNamespace(dataset=dataset, method=who, gamma=str(gamma), seed=str(seed), noise="")
        files += [f"{array[:-len('.npy')]}.{ext}" for array in candidate_cache_args(w)[1::2] for ext in ("npy", "json")]
    return list(dict.fromkeys(files))


def previous_choice(w):
    """The choice of the stage before (stages after the first): an ancient input, its values in the params."""
    if int(w.stage) == 1:
        return []
    return ancient(checkpoints.select.get(dataset=w.dataset, method=w.method, stage=str(int(w.stage) - 1)).output.choice)


def candidate_values(w):
    values = dict(S.candidates(config, w.method, int(w.stage)))
    if w.tag not in values:
        raise ValueError(f"{w.tag}: no candidate of {w.method} stage {w.stage} is called so "
                         f"(candidates: {', '.join(values)})")
    earlier = {}
    if int(w.stage) > 1:
        earlier = read_choice(previous_choice(w))
    return {**earlier, **values[w.tag]}


def candidate_config(w):
    return config_text(resolve_run(config, w.dataset, w.method, float(w.gamma), int(w.seed),
                                   chosen=candidate_values(w), candidate=True))


def select_cache_labels(w):
    """The table of a selection part (fit, val) its image cache is made from: the first selection set's (the other
    sets' tables hold the same rows, which is all a cache checks)."""
    gamma, seed = S.selection_sets(config)[0]
    return layout.fill(layout.SELECT_PART, dataset=w.dataset, gamma=gamma, seed=seed, part=w.part)


def candidate_cache_args(w):
    return paths.cache_args(w.dataset, resolved(w)["train"].get("loader", "pil"), layout.SELECT_CACHE, ("fit", "val"))


def stage_candidates(w):
    return [f"{S.candidate_dir(w.dataset, w.method, int(w.stage), g, s, tag)}/metrics.json"
            for tag, _ in S.candidates(config, w.method, int(w.stage)) for g, s in S.selection_sets(config)]


@functools.lru_cache(maxsize=None)  # asked once per run and rule; the config is fixed for the invocation
def last_stage(method):
    """(the method whose choice a method's final runs read, its last stage), or None for fixed values."""
    who = S.owner(config, method)
    return None if who is None else (who, str(len(S.stages(config, who))))


def final_choice(w):
    """The choice a final run reads (an ancient input), or nothing for a method with fixed values."""
    owner_stage = last_stage(w.method)
    if owner_stage is None:
        return []
    who, last = owner_stage
    return ancient(checkpoints.select.get(dataset=w.dataset, method=who, stage=last).output.choice)


def selection_targets():
    """Every stage file (every candidate's score and the choice) behind the runs the workflow trains; `all` asks
    for them."""
    files = []
    for dataset, who in selection_owners():
        files += [S.stage_file(dataset, who, k) for k in range(1, len(S.stages(config, who)) + 1)]
    return list(dict.fromkeys(files))


def readme_selection():
    """The last stage file of each grid method's selection, and the committed record of each grid method whose
    values a selection elsewhere chose (selection.records; held to them here): the README's demo numbers quote
    them."""
    owners = S.selecting_methods(config, GRID["methods"])
    records = []
    for method, path in S.recorded_selections(config, GRID["methods"]):
        why = S.record_mismatch(config, method, path)
        if why:
            raise SystemExit(f"noisymlt: {path} (selection.records.{method}): {why}")
        records.append(path)
    return [S.stage_file(d, m, len(S.stages(config, m))) for d in GRID["datasets"] for m in owners] + records
