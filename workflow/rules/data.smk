# Raw data -> label tables -> long-tailed training subset and class split.
# Each step's files and command are declared in noisymlt.pipeline.steps (STEPS), as DVC's stages are; the arguments
# that depend on a dataset's kind come from noisymlt.pipeline.paths, which DVC's `noisymlt step` runs too.


# Raw files, once a folder under data/raw, written by the command of the dataset's kind (noisymlt.data.kinds:
# raw_argv); a user's own folder (kind folder) has no rule and is read where it is.


rule make_raw:
    output:
        layout.RAW_MARKER,
    wildcard_constraints:
        raw=raw_targets("raw", downloaded=False),
        marker=raw_targets("marker", downloaded=False),
    params:
        args=lambda w: step_args("raw", dataset=dataset_of_raw(w.raw)),
        code=lambda w: code(step_command("raw", dataset=dataset_of_raw(w.raw))),
    log:
        "logs/data/raw/{raw}/{marker}.log",
    benchmark:
        "benchmarks/data/raw/{raw}/{marker}.tsv"
    shell:
        STEPS["raw"].shell


# Everything fetched from the internet is fetched here, by local rules: under SLURM they run in the snakemake
# process on the login node (compute nodes often have no internet), and no train job opens a connection.


localrules:
    download,
    fetch_train_images,
    fetch_asset,


# ImageNet weights and GloVe vectors (params `assets`, noisymlt.data.assets): each once, into a file named with
# its hash's first 8 digits, which the runs' configs name and their train jobs take as input.


rule fetch_asset:
    output:
        "data/assets/{group}/{file}",
    wildcard_constraints:
        group="imagenet|glove",
    params:
        args=lambda w, output: step_args("assets", path=output[0]),
    log:
        "logs/data/fetch_asset_{group}_{file}.log",
    benchmark:
        "benchmarks/data/fetch_asset_{group}_{file}.tsv"
    shell:
        STEPS["assets"].shell


# The same step for the kinds that download theirs, as a local rule (and without make_raw's code param: a change
# of download's code refetches nothing, the archives are checked against their checksums).


rule download:
    output:
        layout.RAW_MARKER,
    wildcard_constraints:
        raw=raw_targets("raw", downloaded=True),
        marker=raw_targets("marker", downloaded=True),
    params:
        args=lambda w: step_args("raw", dataset=dataset_of_raw(w.raw)),
    log:
        "logs/data/raw/{raw}/{marker}.log",
    benchmark:
        "benchmarks/data/raw/{raw}/{marker}.tsv"
    shell:
        STEPS["raw"].shell


rule parse_labels:
    input:
        lambda w: raw_marker(w.dataset),
    output:
        **STEPS["parse_labels"].outputs(),
    wildcard_constraints:
        part="train_source|test",
    params:
        args=lambda w: step_args("parse_labels", dataset=w.dataset, part=w.part),
        code=lambda w: code(step_command("parse_labels", dataset=w.dataset, part=w.part)),
    log:
        "logs/data/parse_{dataset}_{part}.log",
    benchmark:
        "benchmarks/data/parse_{dataset}_{part}.tsv"
    shell:
        STEPS["parse_labels"].shell


rule longtail:
    input:
        **STEPS["longtail"].input,
    output:
        **STEPS["longtail"].outputs(),
    params:
        args=lambda w: step_args("longtail", dataset=w.dataset),
        code=code("longtail"),
    log:
        "logs/data/longtail_{dataset}.log",
    benchmark:
        "benchmarks/data/longtail_{dataset}.tsv"
    shell:
        STEPS["longtail"].shell


rule fetch_train_images:
    input:
        **STEPS["train_images"].input,
        raw=lambda w: raw_marker(w.dataset),
    output:
        layout.TRAIN_IMAGES_READY,
    params:
        args=lambda w: step_args("train_images", dataset=w.dataset),
    log:
        "logs/data/fetch_images_{dataset}.log",
    benchmark:
        "benchmarks/data/fetch_images_{dataset}.tsv"
    shell:
        STEPS["train_images"].shell


# Every image of the train subset / test set decoded once into a uint8 array (train.loader: cache reads it).
# Two rules, one per part: the report's rule graph keeps one job per rule and DAG level, and the two caches sit
# at different depths (the train cache waits for the long-tail subset), so one rule would be drawn twice.


rule cache_train_images:
    input:
        **STEPS["cache_images"].input,
        images=lambda w: train_images_ready(w.dataset),
    output:
        **STEPS["cache_images"].outputs(),
    wildcard_constraints:
        part="train",
    params:
        args=lambda w: step_args("cache_images", dataset=w.dataset, part=w.part),
        code=code("cache-images"),
    log:
        "logs/data/cache_images_{dataset}_{part}.log",
    benchmark:
        "benchmarks/data/cache_images_{dataset}_{part}.tsv"
    shell:
        STEPS["cache_images"].shell


use rule cache_train_images as cache_test_images with:
    input:
        **STEPS["cache_images"].input,
        images=lambda w: raw_marker(w.dataset),
    wildcard_constraints:
        part="test",
