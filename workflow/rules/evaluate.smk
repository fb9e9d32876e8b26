# Predictions -> AP per class and mAP total/head/medium/tail on the clean test set.


rule evaluate:
    input:
        predictions="runs/{dataset}/g{gamma}/s{seed}/{method}/predictions.npz",
        test="data/{dataset}/test_labels.parquet",
        split="data/{dataset}/class_split.json",
    output:
        metrics="runs/{dataset}/g{gamma}/s{seed}/{method}/metrics.json",
        map="runs/{dataset}/g{gamma}/s{seed}/{method}/map.json",  # mAP per head and group: DVC's metrics file
        manifest="runs/{dataset}/g{gamma}/s{seed}/{method}/metrics.manifest.json",
    params:
        cli=NOISYMLT,
        code=code("evaluate"),
    conda:
        "../envs/noisymlt.yaml"
    log:
        "logs/evaluate/{dataset}_g{gamma}_s{seed}_{method}.log",
    benchmark:
        "benchmarks/evaluate/{dataset}_g{gamma}_s{seed}_{method}.tsv"
    shell:
        "{params.cli} evaluate --predictions {input.predictions} --test-labels {input.test} "
        "--split {input.split} --out {output.metrics} --map-out {output.map} > {log} 2>&1"
