# Raw data -> label tables -> long-tailed training subset and class split -> decoded-image caches.
# A step whose words depend on a dataset's kind (raw files, parsing, the train images COCO fetches) or on a
# params block (long-tail draw, pretraining, assets, caches) computes them in its `args` param with a function of
# noisymlt.pipeline.paths: its command is `noisymlt {params.args}`, and `snakemake -n -p` prints the words.


# Raw files, once a folder under data/raw, written by the command of the dataset's kind (noisymlt.data.kinds:
# raw_argv); a user's own folder (kind folder) has no rule and is read where it is.


rule make_raw:
    output:
        layout.RAW_MARKER,
    wildcard_constraints:
        raw=raw_targets("raw", downloaded=False),
        marker=raw_targets("marker", downloaded=False),
    params:
        args=lambda w: argv(paths.raw_argv(config, dataset_of_raw(w.raw))),
        code=lambda w: code(paths.raw_argv(config, dataset_of_raw(w.raw))[0]),
    log:
        "logs/data/raw/{raw}/{marker}.log",
    benchmark:
        "benchmarks/data/raw/{raw}/{marker}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


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
        asset="data/assets/{group}/{file}",
    wildcard_constraints:
        group="imagenet|glove",
    params:
        args=lambda w, output: argv(paths.asset_argv(config, output[0])),
    log:
        "logs/data/fetch_asset_{group}_{file}.log",
    benchmark:
        "benchmarks/data/fetch_asset_{group}_{file}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


# The same step for the kinds that download theirs, as a local rule (and without make_raw's code param: a change
# of download's code refetches nothing, the archives are checked against their checksums).


rule download:
    output:
        layout.RAW_MARKER,
    wildcard_constraints:
        raw=raw_targets("raw", downloaded=True),
        marker=raw_targets("marker", downloaded=True),
    params:
        args=lambda w: argv(paths.raw_argv(config, dataset_of_raw(w.raw))),
    log:
        "logs/data/raw/{raw}/{marker}.log",
    benchmark:
        "benchmarks/data/raw/{raw}/{marker}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


# The label table of the train source pool (train_source) or the test set (test), by the kind's parser.


rule parse_labels:
    input:
        lambda w: raw_marker(w.dataset),
    output:
        labels=layout.LABELS,
    wildcard_constraints:
        part="train_source|test",
    params:
        args=lambda w, output: argv(paths.parse_argv(config, w.dataset, w.part, output.labels)),
        code=lambda w, output: code(paths.parse_argv(config, w.dataset, w.part, output.labels)[0]),
    log:
        "logs/data/parse_{dataset}_{part}.log",
    benchmark:
        "benchmarks/data/parse_{dataset}_{part}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


# `noisymlt longtail --labels SOURCE --out SUBSET --split-out SPLIT --source ...` with the dataset's longtail block.


rule longtail:
    input:
        labels=layout.SOURCE_LABELS,
    output:
        labels=layout.TRAIN_LABELS,
        split=layout.CLASS_SPLIT,
    params:
        args=lambda w, input, output: argv(paths.longtail_argv(config, w.dataset, input.labels, output.labels,
                                                                output.split)),
        code=code("longtail"),
    log:
        "logs/data/longtail_{dataset}.log",
    benchmark:
        "benchmarks/data/longtail_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


# Kinds that fetch their train images for the subset only (COCO's fetch-coco-images) do it here, once the subset
# is drawn; the folder is not an output (Snakemake would delete it before a rerun): the fetch keeps what is there.


rule fetch_train_images:
    input:
        labels=layout.TRAIN_LABELS,
        raw=lambda w: raw_marker(w.dataset),
    output:
        layout.TRAIN_IMAGES_READY,
    params:
        args=lambda w, input: argv(paths.train_images_argv(config, w.dataset, input.labels,
                                                            layout.fill(layout.TRAIN_IMAGES, dataset=w.dataset))),
    log:
        "logs/data/fetch_images_{dataset}.log",
    benchmark:
        "benchmarks/data/fetch_images_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


# Every image of the train subset / test set decoded once into a uint8 array (train.loader: cache reads it):
# `noisymlt cache-images --labels PART --images FOLDER --size N --out ARRAY`. Two rules, one per part: the report's
# rule graph keeps one job per rule and DAG level, and the two caches sit at different depths (the train cache
# waits for the long-tail subset), so one rule would be drawn twice.


rule cache_train_images:
    input:
        labels=layout.LABELS,
        images=lambda w: train_images_ready(w.dataset),
    output:
        array=layout.CACHE,
        index=layout.CACHE_INDEX,
        manifest=layout.CACHE_MANIFEST,
    wildcard_constraints:
        part="train",
    params:
        args=lambda w, output: argv(paths.cache_argv(config, w.dataset, w.part, output.array)),
        code=code("cache-images"),
    log:
        "logs/data/cache_images_{dataset}_{part}.log",
    benchmark:
        "benchmarks/data/cache_images_{dataset}_{part}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


use rule cache_train_images as cache_test_images with:
    input:
        labels=layout.LABELS,
        images=lambda w: raw_marker(w.dataset),
    wildcard_constraints:
        part="test",
