# A backbone pretrained on the synthetic source task (the demo's ImageNet), once, by block pretrain.NAME; runs whose
# train.weights_path names it wait for it.


rule pretrain:
    output:
        weights=layout.PRETRAINED,
        report=layout.PRETRAINED_REPORT,
        manifest=layout.PRETRAINED_MANIFEST,
    params:
        config=lambda w: json.dumps(paths.pretrain_block(config, w.name), sort_keys=True),
        code=code("pretrain"),
    threads: 2
    log:
        "logs/pretrain/{name}.log",
    benchmark:
        "benchmarks/pretrain/{name}.tsv"
    shell:
        "$NOISYMLT_CLI pretrain --config {params.config:q} --out {output.weights} --no-progress > {log} 2>&1"


# Clean, then retrain (noisymlt.pipeline.cleaning): a noisy set with the labels a cleaning flags dropped from the loss
# or flipped, the training table of the methods whose block has that `clean`; flags on the base method's cross-fitted
# probabilities, or, for an oracle, the labels that differ from the clean ones (the one reader of them here).


rule clean_labels:
    input:
        noisy=layout.NOISY,
        flags_from=lambda w: (layout.TRAIN_LABELS if w.flags == "oracle" else
                              layout.fill(layout.OUT_OF_SAMPLE, dataset=w.dataset, method=config["crossfit"]["method"],
                                          gamma=w.gamma, seed=w.seed, noise=noise_of(w))),
    output:
        table=layout.CLEANED,
        record=layout.ext(layout.CLEANED[:-len(".parquet")], "json"),
    wildcard_constraints:
        flags="cleanlab|model|oracle",
        action="drop|flip",
    params:
        source=lambda w, input: ("--clean-labels " if w.flags == "oracle" else "--out-of-sample ") + input.flags_from,
        code=code("clean-labels"),
    localrule: True  # a second's work
    log:
        "logs/clean/{dataset}_g{gamma}{noise}_s{seed}_{flags}_{action}.log",
    shell:
        "$NOISYMLT_CLI clean-labels --noisy {input.noisy} --flags {wildcards.flags} --action {wildcards.action} "
        "{params.source} --out {output.table} > {log} 2>&1"


# One training run per (dataset, noise rate, seed, method), then its evaluation: AP per class and mAP
# total/head/medium/tail of its predictions on the clean test set. One job: the demo's ~300 runs would otherwise be
# ~900 Snakemake jobs (a config file, the training, a 0.2 s evaluation), and Snakemake's own CPU per job competes
# with the runs for the cores. An evaluate-only edit reruns the job (its code param holds both digests), which
# resumes the finished checkpoint and predicts the same bytes.
# The resolved configuration is a param (a changed configuration reruns the job) that the job writes to
# requested_config.json before training reads it; a failed job's command line shows it.
# The job picks its own GPU (one of runs_per_gpu slot locks on the least-loaded card it sees, the cards of its
# SLURM allocation included), so --resources gpu=N spreads jobs over N cards; a packing profile (workflow/profiles/h200)
# counts gpu in run slots, cards x runs_per_gpu (docs/gpu-check.md#runs-packed-per-card). The clean subset goes in
# twice: its hash into the manifest, its labels into the noise-level log (analysis only; training never reads
# them). The log is empty for methods that publish no targets.
# checkpoint.pt is written too but not declared: Snakemake deletes a job's outputs before it runs and after it
# fails, which would throw away the epochs a rerun resumes from.


rule train:
    input:
        train=train_table,  # its noisy set, or that set cleaned (a clean-then-retrain method: crossfit.smk)
        test=layout.TEST_LABELS,
        split=layout.CLASS_SPLIT,
        subset=layout.TRAIN_LABELS,
        images=lambda w: train_images_ready(w.dataset),
        raw=lambda w: raw_marker(w.dataset),
        files=run_files,
        caches=run_caches,
        choice=final_choice,  # the method's selection (select.smk), if it has one
    output:
        **run_outputs(layout.RUN),
    params:
        out=run_dir,
        train_images=lambda w: image_root(w.dataset, "train"),
        test_images=lambda w: image_root(w.dataset, "test"),
        caches=cache_args,
        config=final_run_config,
        code=run_code,
        evaluate_code=code("evaluate"),
        selection=lambda w: f"--selection {f}" if (f := S.final_choice_file(config, w.dataset, w.method)) else "",
    threads: train_threads
    resources:
        gpu=1,
        runs_per_gpu=1,  # a packing profile raises it (and the gpu total) with set-resources
    log:
        "logs/train/{dataset}_g{gamma}{noise}_s{seed}_{method}.log",
    benchmark:
        "benchmarks/train/{dataset}_g{gamma}{noise}_s{seed}_{method}.tsv"
    shell:
        "printf '%s\\n' {params.config:q} > {output.requested} && "
        "$NOISYMLT_CLI train --run-config {output.requested} --train-labels {input.train} --test-labels {input.test} "
        "--split {input.split} --train-images {params.train_images} --test-images {params.test_images} {params.caches} "
        "--out {params.out} --no-progress --keep-stale --expect-code {params.code} --clean-labels {input.subset} "
        "--provenance raw_manifest={input.raw} clean_subset={input.subset} {params.selection} "
        "--cores {threads} --runs-per-gpu {resources.runs_per_gpu} > {log} 2>&1 && "
        "$NOISYMLT_CLI evaluate --predictions {output.predictions} --test-labels {input.test} --split {input.split} "
        "--out {output.metrics} --map-out {output.map} >> {log} 2>&1"
