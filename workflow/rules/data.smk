# Raw data -> label tables -> long-tailed training subset and class split -> decoded-image caches.
# A step whose words the dataset's kind spells (raw files, parsing, the train images COCO fetches) takes them from
# the kind (noisymlt.pipeline.paths) as its `args` param: `noisymlt {params.args}`, and `snakemake -n -p` prints
# the words. Every other rule writes its command here, its values in params.


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
        url=lambda w, output: paths.asset_entry(config, output.asset)["url"],
        sha256=lambda w, output: paths.asset_entry(config, output.asset)["sha256"],
        name=lambda w, output: "assets.{group}.{name}".format(**paths.asset_entry(config, output.asset)),
        # params download, as the kinds' download commands take it: a mirror only when one is set
        mirror=lambda w: ["--mirror", m] if (m := (config.get("download") or {}).get("mirror")) else [],
        retries=(config.get("download") or {}).get("retries", 5),
    log:
        "logs/data/fetch_asset_{group}_{file}.log",
    benchmark:
        "benchmarks/data/fetch_asset_{group}_{file}.tsv"
    shell:
        "$NOISYMLT_CLI fetch-asset --url {params.url:q} --sha256 {params.sha256:q} --out {output.asset} "
        "--name {params.name:q} {params.mirror:q} --retries {params.retries} > {log} 2>&1"


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


# The subset and class split by the dataset's longtail block; an option the block leaves out is not written
# (noisymlt.pipeline.paths: longtail_options).


rule longtail:
    input:
        labels=layout.SOURCE_LABELS,
    output:
        labels=layout.TRAIN_LABELS,
        split=layout.CLASS_SPLIT,
    params:
        source=lambda w: paths.dataset_block(config, w.dataset)["longtail"]["source"],
        draw=lambda w: paths.longtail_options(config, w.dataset)["draw"],
        cap=lambda w: paths.longtail_options(config, w.dataset)["cap"],
        groups=lambda w: paths.longtail_options(config, w.dataset)["groups"],
        official=lambda w: paths.longtail_options(config, w.dataset)["official"],
        code=code("longtail"),
    log:
        "logs/data/longtail_{dataset}.log",
    benchmark:
        "benchmarks/data/longtail_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI longtail --labels {input.labels} --out {output.labels} --split-out {output.split} "
        "--source {params.source} {params.draw:q} {params.cap:q} {params.groups:q} {params.official:q} > {log} 2>&1"


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


# Every image of the train subset / test set decoded once into a uint8 array (train.loader: cache reads it), at the
# dataset's train.cache_size. Two rules, one per part: the report's rule graph keeps one job per rule and DAG level,
# and the two caches sit at different depths (the train cache waits for the long-tail subset), so one rule would be
# drawn twice.


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
        images=lambda w: image_root(w.dataset, w.part),
        size=lambda w: paths.cache_size(config, w.dataset),
        code=code("cache-images"),
    log:
        "logs/data/cache_images_{dataset}_{part}.log",
    benchmark:
        "benchmarks/data/cache_images_{dataset}_{part}.tsv"
    shell:
        "$NOISYMLT_CLI cache-images --labels {input.labels} --images {params.images:q} --size {params.size} "
        "--out {output.array} --no-progress > {log} 2>&1"


use rule cache_train_images as cache_test_images with:
    input:
        labels=layout.LABELS,
        images=lambda w: raw_marker(w.dataset),
    wildcard_constraints:
        part="test",
