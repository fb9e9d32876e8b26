# [CL]'s own trained models (params authors_checkpoints: NAME -> dataset, file, sha256), each checked against its
# sha256, converted into Ours' two-branch model and evaluated on its dataset's clean test set with [CL]'s test-time
# transform (noisymlt eval-cl-checkpoint): runs/DATASET/authors/NAME/metrics.json beside the runs'. None by default;
# `rule all` asks for every listed one (authors_targets). The checkpoint is an input no rule makes: the user
# downloads it (docs/noise-models.md, "[CL]'s trained models").


rule authors_eval:
    input:
        test=layout.TEST_LABELS,
        split=layout.CLASS_SPLIT,
        checkpoint=lambda w: paths.authors_entry(config, w.name, w.dataset)["file"],
        raw=lambda w: raw_marker(w.dataset),
    output:
        predictions=layout.within(layout.AUTHORS_RUN, "predictions.npz"),
        metrics=layout.within(layout.AUTHORS_RUN, "metrics.json"),
        manifest=layout.within(layout.AUTHORS_RUN, "manifest.json"),
        map=layout.within(layout.AUTHORS_RUN, "map.json"),
    wildcard_constraints:
        name=authors_names(),
    params:
        file=lambda w: paths.authors_entry(config, w.name, w.dataset)["file"],
        checksum=lambda w: paths.authors_entry(config, w.name, w.dataset)["sha256"],
        test_images=lambda w: image_root(w.dataset, "test"),
        options=lambda w: argv(paths.authors_options(config, w.name)),
        code=code("eval-cl-checkpoint"),
    threads: 4
    resources:
        gpu=1,
    log:
        "logs/authors/{dataset}_{name}.log",
    benchmark:
        "benchmarks/authors/{dataset}_{name}.tsv"
    shell:
        "$NOISYMLT_CLI eval-cl-checkpoint --checkpoint {params.file} --sha256 {params.checksum} "
        "--test-labels {input.test} --split {input.split} --test-images {params.test_images} {params.options} "
        "--out runs/{wildcards.dataset}/authors/{wildcards.name} --no-progress --cores {threads} > {log} 2>&1"
