# Cross-fitting (params `crossfit`, noisymlt.pipeline.crossfit): every training image's probabilities from a model
# that never saw its label, for the cleanlab rows of the detection table, which ask for out-of-sample ones. The
# training images are cut into K folds once a dataset (stratified on the noisy labels of every noisy set of the
# grid, so one set of fold caches serves them all); on each noisy set the base method trains K times, each run an
# ordinary training run on K - 1 folds that predicts the fold it held out. Nothing here reads a clean label or the
# test set.


wildcard_constraints:
    fold="[0-9]+",


rule crossfit_split:
    input:
        lambda w: list(crossfit_tables(w.dataset).values()),
    output:
        folds=layout.CROSSFIT_FOLDS,
    params:
        noisy=lambda w: [f"{name}={table}" for name, table in crossfit_tables(w.dataset).items()],
        folds=lambda w: config["crossfit"]["folds"],
        seed=lambda w: config["crossfit"]["seed"],
        code=code("crossfit"),
    log:
        "logs/crossfit/split_{dataset}.log",
    shell:
        "$NOISYMLT_CLI crossfit split --noisy {params.noisy:q} --folds {params.folds} --seed {params.seed} "
        "--out {output.folds} > {log} 2>&1"


# One job a noisy set writes every fold's two tables.


rule crossfit_parts:
    input:
        noisy=layout.NOISY,
        folds=layout.CROSSFIT_FOLDS,
    output:
        train=crossfit_parts("train"),
        held=crossfit_parts("held"),
    params:
        code=code("crossfit"),
    localrule: True  # a second's work: never a cluster job
    log:
        "logs/crossfit/parts_{dataset}_g{gamma}{noise}_s{seed}.log",
    shell:
        "$NOISYMLT_CLI crossfit parts --noisy {input.noisy} --folds {input.folds} --train {output.train} "
        "--held {output.held} > {log} 2>&1"


# A fold part's images decoded once (train.loader: cache), from the first noisy set's table of the part.


rule cache_crossfit_images:
    input:
        labels=crossfit_cache_labels,
        images=lambda w: train_images_ready(w.dataset),
    output:
        array=layout.CROSSFIT_CACHE,
        index=layout.CROSSFIT_CACHE_INDEX,
        manifest=layout.CROSSFIT_CACHE_MANIFEST,
    wildcard_constraints:
        part="train|held",
    params:
        images=lambda w: image_root(w.dataset, "train"),
        size=lambda w: paths.cache_size(config, w.dataset),
        code=code("cache-images"),
    log:
        "logs/data/cache_images_{dataset}_crossfit_fold{fold}_{part}.log",
    shell:
        "$NOISYMLT_CLI cache-images --labels {input.labels} --images {params.images:q} --size {params.size} "
        "--out {output.array} --no-progress > {log} 2>&1"


# A fold's run: the base method's final configuration (its selected values too) on every other fold, its "test" set
# the fold it holds out (training images, noisy labels), predicted and not evaluated: its predictions are the
# fold's out-of-sample probabilities.


rule train_fold:
    input:
        train=lambda w: layout.fill(layout.part(layout.CROSSFIT_PART, "train"), **fold_fields(w)),
        held=lambda w: layout.fill(layout.part(layout.CROSSFIT_PART, "held"), **fold_fields(w)),
        split=layout.CLASS_SPLIT,
        images=lambda w: train_images_ready(w.dataset),
        files=run_files,
        caches=lambda w: fold_cache_args(w)[1::2],
        choice=final_choice,
    output:
        **{name.split(".")[0]: layout.within(layout.CROSSFIT_RUN, name) for name in layout.CROSSFIT_RUN_FILES},
    params:
        out=lambda w: crossfit_folder(w, w.fold),
        images=lambda w: image_root(w.dataset, "train"),
        caches=lambda w: argv(fold_cache_args(w)),
        config=fold_run_config,
        code=run_code,
    threads: train_threads
    resources:
        gpu=1,
        runs_per_gpu=1,  # a packing profile raises it (and the gpu total) with set-resources
    log:
        "logs/crossfit/{dataset}_g{gamma}{noise}_s{seed}_{method}_fold{fold}.log",
    benchmark:
        "benchmarks/crossfit/{dataset}_g{gamma}{noise}_s{seed}_{method}_fold{fold}.tsv"
    shell:
        "printf '%s\\n' {params.config:q} > {output.requested_config} && "
        "$NOISYMLT_CLI train --run-config {output.requested_config} --train-labels {input.train} "
        "--test-labels {input.held} --split {input.split} --train-images {params.images} --test-images {params.images} "
        "{params.caches} --out {params.out} --no-progress --keep-stale --expect-code {params.code} "
        "--cores {threads} --runs-per-gpu {resources.runs_per_gpu} > {log} 2>&1"


rule crossfit_gather:
    input:
        runs=lambda w: [layout.within(crossfit_folder(w, k), name) for k in range(config["crossfit"]["folds"])
                        for name in ("predictions.npz", "manifest.json")],
        folds=layout.CROSSFIT_FOLDS,
        noisy=layout.NOISY,
    output:
        layout.OUT_OF_SAMPLE,
    params:
        runs=lambda w: [crossfit_folder(w, k) for k in range(config["crossfit"]["folds"])],
        code=code("crossfit"),
    localrule: True
    log:
        "logs/crossfit/gather_{dataset}_g{gamma}{noise}_s{seed}_{method}.log",
    shell:
        "$NOISYMLT_CLI crossfit gather --runs {params.runs} --folds {input.folds} --noisy {input.noisy} --out {output} "
        "> {log} 2>&1"
