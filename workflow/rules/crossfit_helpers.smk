# Helpers of the cross-fitting's rules (crossfit.smk; Snakemake's lint wants no function in a file of rules) and of
# what reads its out-of-sample probabilities (the suspects rule): the folds' parts, runs, caches and configs.
# noisymlt.pipeline.crossfit spells the cross-fitting itself. Included whether or not crossfit.smk is: rule all and
# the phases ask crossfit_work(), which is empty when nothing is cross-fitted.
import functools
from types import SimpleNamespace

from noisymlt.config import config_text, fold_run
from noisymlt.pipeline import layout, paths
from noisymlt.pipeline.layout import gtag


def crossfit_method():
    """The cross-fitting's base method (its suspects records gain out-of-sample rows), or None when no noisy set is
    cross-fitted (paths.crossfit_levels)."""
    if any(paths.crossfit_levels(config, d) for d in GRID["datasets"]):
        return config["crossfit"]["method"]
    return None


def crossfit_tables(dataset):
    """{set name: noisy table} of every cross-fitted noisy set of ``dataset``: the split is stratified on all."""
    return {f"g{layout.noise_level(g, n)}_s{s}": layout.fill(layout.NOISY, dataset=dataset, gamma=g, seed=s, noise=n)
            for n, g, s in paths.crossfit_levels(config, dataset)}


def crossfit_parts(part):
    """One part (train, held) of every fold of a noisy set, in fold order: the outputs of one crossfit_parts job."""
    return [layout.part(layout.CROSSFIT_PART, part).replace("{fold}", str(k)) for k in range(config["crossfit"]["folds"])]


def fold_fields(w):
    """A fold run's wildcards as layout.fill takes them (its noise model by name)."""
    return dict(dataset=w.dataset, gamma=w.gamma, seed=w.seed, noise=noise_of(w), fold=w.fold)


def crossfit_folder(w, fold):
    return layout.fill(layout.CROSSFIT_RUN, dataset=w.dataset, method=w.method, gamma=w.gamma, seed=w.seed,
                       noise=noise_of(w), fold=fold)


def crossfit_cache_labels(w):
    """The table of a fold part (train, held) its image cache is made from: the first noisy set's (the other sets'
    tables hold the same rows, which is all a cache checks)."""
    noise, gamma, seed = paths.crossfit_levels(config, w.dataset)[0]
    return layout.fill(layout.CROSSFIT_PART, dataset=w.dataset, gamma=gamma, seed=seed, noise=noise, fold=w.fold,
                       part=w.part)


def fold_cache_args(w):
    return paths.cache_args(w.dataset, resolved(w)["train"].get("loader", "pil"), layout.CROSSFIT_CACHE,
                            ("train", "held"), fold=w.fold)


def fold_run_config(w):
    """A fold run's resolved config (noisymlt.config.fold_run), with its method's selected values as a final run's."""
    choice = final_choice(w)  # select_helpers.smk
    return config_text(fold_run(config, w.dataset, w.method, float(w.gamma), int(w.seed), int(w.fold),
                                str(choice) if choice else None, noise_of(w)))


def out_of_sample(dataset, method, level):
    """The cross-fitted probabilities of one noisy set (layout.OUT_OF_SAMPLE) for the suspects of ``method``'s run,
    or None when ``method`` is not the base method."""
    if method != crossfit_method():
        return None
    noise, gamma, seed = level
    return layout.fill(layout.OUT_OF_SAMPLE, dataset=dataset, method=method, gamma=gamma, seed=seed, noise=noise)


@functools.lru_cache(maxsize=None)
def crossfit_work():
    """Every file of the cross-fitting, for rule all and the data and runs phases."""
    method = crossfit_method()
    if method is None:
        return ()
    folds, files = int(config["crossfit"]["folds"]), []
    for dataset in GRID["datasets"]:
        levels = paths.crossfit_levels(config, dataset)
        files += [layout.fill(layout.CROSSFIT_FOLDS, dataset=dataset)] if levels else []
        for level in levels:
            noise, gamma, seed = level
            w = SimpleNamespace(dataset=dataset, method=method, gamma=gtag(gamma), seed=str(seed),
                                noise=layout.noise_tag(noise))
            for fold in range(folds):
                files += [layout.fill(layout.part(layout.CROSSFIT_PART, part), dataset=dataset, gamma=gamma,
                                      seed=seed, noise=noise, fold=fold) for part in ("train", "held")]
                files += [layout.within(crossfit_folder(w, fold), name) for name in layout.CROSSFIT_RUN_FILES]
                files += [f"{array[:-len('.npy')]}.{ext}" for array in fold_cache_args(SimpleNamespace(**vars(w), fold=fold))[1::2]
                          for ext in ("npy", "json")]
            files.append(out_of_sample(dataset, method, level))
    return tuple(dict.fromkeys(files))
