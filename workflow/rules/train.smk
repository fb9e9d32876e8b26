# A backbone pretrained on the synthetic source task (the demo's ImageNet), once; runs whose
# train.weights_path names it wait for it.


rule pretrain:
    output:
        weights="data/pretrained/{name}.pt",
        report="data/pretrained/{name}.json",
    params:
        cli=NOISYMLT,
        args=pretrain_args,
        code=code("pretrain"),
    threads: 2
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/pretrain/{name}.log",
    benchmark:
        "benchmarks/pretrain/{name}.tsv"
    shell:
        "{params.cli} {params.args} > {log} 2>&1"


# The resolved configuration of a run, written to a file the train job reads: a failed job then shows
# a short command line, and a changed configuration (Snakemake's params trigger) rewrites this file,
# which reruns the training.


rule run_config:
    input:
        final_choice,  # the method's selection (select.smk), if it has one
    output:
        "runs/{dataset}/g{gamma}/s{seed}/{method}/requested_config.json",
    params:
        config=final_run_config,
    localrule: True
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/train/{dataset}_g{gamma}_s{seed}_{method}.config.log",
    # a shell job (milliseconds): a `run:` block would start a whole Snakemake process per run
    shell:
        "printf '%s\\n' {params.config:q} > {output} 2> {log}"


# One training run per (dataset, noise rate, seed, method). The job picks its own GPU
# (CUDA_VISIBLE_DEVICES under SLURM, else a per-GPU lock), so --resources gpu=N spreads jobs over N cards.
# The clean subset goes in twice: its hash into the manifest, its labels into the noise-level log (analysis
# only; training never reads them). The log is empty for methods that publish no targets.


rule train:
    input:
        train="data/{dataset}/noisy/g{gamma}_s{seed}.parquet",
        config="runs/{dataset}/g{gamma}/s{seed}/{method}/requested_config.json",
        test="data/{dataset}/test_labels.parquet",
        split="data/{dataset}/class_split.json",
        images=lambda w: train_images_ready(w.dataset),
        raw=lambda w: raw_marker(w.dataset),
        subset="data/{dataset}/train_labels.parquet",
        files=run_files,
        caches=run_caches,
    output:
        predictions="runs/{dataset}/g{gamma}/s{seed}/{method}/predictions.npz",
        manifest="runs/{dataset}/g{gamma}/s{seed}/{method}/manifest.json",
        config="runs/{dataset}/g{gamma}/s{seed}/{method}/run_config.json",
        # checkpoint.pt is written too (and is a DVC output) but not declared: Snakemake deletes a job's
        # outputs before it runs and after it fails, which would throw away the epochs a rerun resumes from
        noise="runs/{dataset}/g{gamma}/s{seed}/{method}/noise_level.jsonl",
    params:
        cli=NOISYMLT,
        out=run_dir,
        train_images=lambda w: image_root(w.dataset, "train"),
        test_images=lambda w: image_root(w.dataset, "test"),
        caches=cache_args,
        code=run_code,
        selection=lambda w: f"--selection {f}" if (f := S.final_choice_file(config, w.dataset, w.method)) else "",
    threads: train_threads
    resources:
        gpu=1,
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/train/{dataset}_g{gamma}_s{seed}_{method}.log",
    benchmark:
        "benchmarks/train/{dataset}_g{gamma}_s{seed}_{method}.tsv"
    shell:
        "{params.cli} train --run-config {input.config} --train-labels {input.train} "
        "--test-labels {input.test} --split {input.split} --train-images {params.train_images} "
        "--test-images {params.test_images} {params.caches} --out {params.out} --cores {threads} --no-progress "
        "--keep-stale --expect-code {params.code} --clean-labels {input.subset} --provenance raw_manifest={input.raw} clean_subset={input.subset} "
        "{params.selection} > {log} 2>&1"
