# A backbone pretrained on the synthetic source task (the demo's ImageNet), once; runs whose
# train.weights_path names it wait for it.


rule pretrain:
    output:
        weights="data/pretrained/{name}.pt",
        report="data/pretrained/{name}.json",
        manifest="data/pretrained/{name}.manifest.json",
    params:
        args=pretrain_args,
        code=code("pretrain"),
    threads: 2
    log:
        "logs/pretrain/{name}.log",
    benchmark:
        "benchmarks/pretrain/{name}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"


# One training run per (dataset, noise rate, seed, method), then its evaluation: AP per class and mAP
# total/head/medium/tail of its predictions on the clean test set. One job, as DVC's train stage runs it: the
# demo's ~300 runs would otherwise be ~900 Snakemake jobs (a config file, the training, a 0.2 s evaluation),
# and Snakemake's own CPU per job competes with the runs for the cores. An evaluate-only edit reruns the job
# (its code param holds both digests), which resumes the finished checkpoint and predicts the same bytes.
# The resolved configuration is a param (a changed configuration reruns the job) that the job writes to
# requested_config.json before training reads it; a failed job's command line shows it.
# The job picks its own GPU (one of runs_per_gpu slot locks on the least-loaded card it sees, the cards of its
# SLURM allocation included), so --resources gpu=N spreads jobs over N cards; a packing profile (workflow/profiles/h200)
# counts gpu in run slots, cards x runs_per_gpu (docs/gpu-check.md#runs-packed-per-card). The clean subset goes in twice: its hash into the manifest, its labels into the
# noise-level log (analysis only; training never reads them). The log is empty for methods that publish no
# targets.


rule train:
    input:
        train="data/{dataset}/noisy/g{gamma}_s{seed}.parquet",
        test="data/{dataset}/test_labels.parquet",
        split="data/{dataset}/class_split.json",
        images=lambda w: train_images_ready(w.dataset),
        raw=lambda w: raw_marker(w.dataset),
        subset="data/{dataset}/train_labels.parquet",
        files=run_files,
        caches=run_caches,
        choice=final_choice,  # the method's selection (select.smk), if it has one
    output:
        requested="runs/{dataset}/g{gamma}/s{seed}/{method}/requested_config.json",
        predictions="runs/{dataset}/g{gamma}/s{seed}/{method}/predictions.npz",
        manifest="runs/{dataset}/g{gamma}/s{seed}/{method}/manifest.json",
        config="runs/{dataset}/g{gamma}/s{seed}/{method}/run_config.json",
        # checkpoint.pt is written too (and is a DVC output) but not declared: Snakemake deletes a job's
        # outputs before it runs and after it fails, which would throw away the epochs a rerun resumes from
        noise="runs/{dataset}/g{gamma}/s{seed}/{method}/noise_level.jsonl",
        metrics="runs/{dataset}/g{gamma}/s{seed}/{method}/metrics.json",
        map="runs/{dataset}/g{gamma}/s{seed}/{method}/map.json",  # mAP per head and group: DVC's metrics file
        evaluation="runs/{dataset}/g{gamma}/s{seed}/{method}/metrics.manifest.json",
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
        "logs/train/{dataset}_g{gamma}_s{seed}_{method}.log",
    benchmark:
        "benchmarks/train/{dataset}_g{gamma}_s{seed}_{method}.tsv"
    shell:
        "printf '%s\\n' {params.config:q} > {output.requested} && "
        "$NOISYMLT_CLI train --run-config {output.requested} --train-labels {input.train} "
        "--test-labels {input.test} --split {input.split} --train-images {params.train_images} "
        "--test-images {params.test_images} {params.caches} --out {params.out} --cores {threads} --runs-per-gpu {resources.runs_per_gpu} --no-progress "
        "--keep-stale --expect-code {params.code} --clean-labels {input.subset} --provenance raw_manifest={input.raw} clean_subset={input.subset} "
        "{params.selection} > {log} 2>&1 && "
        "$NOISYMLT_CLI evaluate --predictions {output.predictions} --test-labels {input.test} --split {input.split} "
        "--out {output.metrics} --map-out {output.map} >> {log} 2>&1"
