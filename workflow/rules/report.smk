# Run metrics -> results.parquet (long format, with provenance) -> paper-layout tables and figures.


rule aggregate:
    input:
        all_runs(layout.within(layout.RUN, "metrics.json")),
    output:
        # curves, pseudo_labels: the runs' per-epoch records in the layout DVC's plots read (dvc.yaml's `plots`)
        results=layout.RESULTS,
        curves=layout.CURVES,
        pseudo_labels=layout.PSEUDO_LABEL_CURVES,
    params:
        code=code("aggregate"),
    log:
        "logs/report/aggregate.log",
    benchmark:
        "benchmarks/report/aggregate.tsv"
    shell:
        "$NOISYMLT_CLI aggregate {input} --out {output.results} --curves {output.curves} "
        "--pseudo-label-curves {output.pseudo_labels} > {log} 2>&1"


# Each dataset's long-tailed subset beside VOC-MLT's and COCO-MLT's (noisymlt.report.structure): what the paper's
# methods act on, judged before any result. A local rule: it reads three label files in about a second.


localrules:
    structure,


rule structure:
    input:
        labels=layout.TRAIN_LABELS,
        split=layout.CLASS_SPLIT,
        test=layout.TEST_LABELS,
    output:
        json=layout.ext(layout.STRUCTURE, "json"),
        md=layout.ext(layout.STRUCTURE, "md"),
        manifest=layout.ext(layout.STRUCTURE, "manifest.json"),
    params:
        code=code("structure"),
    log:
        "logs/report/structure_{dataset}.log",
    benchmark:
        "benchmarks/report/structure_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI structure --labels {input.labels} --split {input.split} --test-labels {input.test} "
        "--out {output.json} --md {output.md} > {log} 2>&1"


rule table_total:
    input:
        results=layout.RESULTS,
    output:
        tex=layout.ext(layout.TABLE_TOTAL, "tex"),
        md=layout.ext(layout.TABLE_TOTAL, "md"),
        html=report(layout.ext(layout.TABLE_TOTAL, "html"), caption="../report/table_total.rst", category="Tables"),
        rendered=layout.ext(layout.TABLE_TOTAL, "rendered.json"),
        cells=layout.ext(layout.TABLE_TOTAL, "cells.json"),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("table"),
    log:
        "logs/report/table_total.log",
    benchmark:
        "benchmarks/report/table_total.tsv"
    shell:
        "$NOISYMLT_CLI table --results {input} --out {output.tex} --labels {params.labels:q} --methods "
        "{params.methods} > {log} 2>&1"


# Whether the regime is the paper's: the runs fit their training labels, reach their learning rate, and
# Ours' pseudo labels fire (noisymlt.training.fit_diagnostics); and Ours minus each method, paired by seed.


rule table_fit:
    input:
        results=layout.RESULTS,
    output:
        tex=layout.ext(layout.FIT_TABLE, "tex"),
        md=layout.ext(layout.FIT_TABLE, "md"),
        csv=layout.ext(layout.FIT_TABLE, "csv"),
        html=report(layout.ext(layout.FIT_TABLE, "html"), caption="../report/fit.rst", category="Diagnostics", labels={"table": "fit diagnostics", "dataset": "{dataset}"}),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("fit-table"),
    log:
        "logs/report/fit_{dataset}.log",
    benchmark:
        "benchmarks/report/fit_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI fit-table --results {input} --dataset {wildcards.dataset} --out {output.tex} --methods "
        "{params.methods} --labels {params.labels:q} > {log} 2>&1"


rule table_paired:
    input:
        results=layout.RESULTS,
    output:
        tex=layout.ext(layout.PAIRED_TABLE, "tex"),
        md=layout.ext(layout.PAIRED_TABLE, "md"),
        cells=layout.ext(layout.PAIRED_TABLE, "cells.json"),
        html=report(layout.ext(layout.PAIRED_TABLE, "html"), caption="../report/paired.rst", category="Tables", labels={"table": "paired differences", "dataset": "{dataset}"}),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        # each cleaned method minus the method whose recipe it retrains, where the grid has both
        pairs=lambda w: f"--pairs {' '.join(pairs)}" if (pairs := cleaned_pairs()) else "",
        code=code("paired-table"),
    log:
        "logs/report/paired_{dataset}.log",
    benchmark:
        "benchmarks/report/paired_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI paired-table --results {input} --dataset {wildcards.dataset} --out {output.tex} "
        "--methods {params.methods} --labels {params.labels:q} {params.pairs} > {log} 2>&1"


rule figure_map_vs_gamma:
    input:
        results=layout.RESULTS,
    output:
        png=report(layout.ext(layout.MAP_FIGURE, "png"), caption="../report/map_vs_gamma.rst", category="Figures"),
        pdf=layout.ext(layout.MAP_FIGURE, "pdf"),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),  # the compared methods only: the ablation variants have their figures
        cleaned=json.dumps(cleanings()),
        code=code("figure"),
    log:
        "logs/report/map_vs_gamma.log",
    benchmark:
        "benchmarks/report/map_vs_gamma.tsv"
    shell:
        "$NOISYMLT_CLI figure --results {input} --out {output.png} --methods {params.methods} --labels "
        "{params.labels:q} --cleaned {params.cleaned:q} > {log} 2>&1"


rule table_ablation:
    input:
        results=layout.RESULTS,
    output:
        tex=layout.ext(layout.ABLATION, "tex"),
        md=layout.ext(layout.ABLATION, "md"),
        cells=layout.ext(layout.ABLATION, "cells.json"),
        rendered=layout.ext(layout.ABLATION, "rendered.json"),
        html=report(layout.ext(layout.ABLATION, "html"), caption="../report/ablation.rst", category="Ablations", labels={"ablation": "{name}"}),
    params:
        labels=method_labels(),
        spec=lambda w: json.dumps(config["ablations"][w.name]),
        code=code("table"),
    log:
        "logs/report/ablation_{name}.log",
    benchmark:
        "benchmarks/report/ablation_{name}.tsv"
    shell:
        "$NOISYMLT_CLI table --results {input} --out {output.tex} --ablation-spec {params.spec:q} --labels "
        "{params.labels:q} > {log} 2>&1"


rule table_groups:
    input:
        results=layout.RESULTS,
        labels=layout.TRAIN_LABELS,  # the train labels: the group thresholds it records, stated when scaled
    output:
        tex=layout.ext(layout.TABLE_GROUPS, "tex"),
        md=layout.ext(layout.TABLE_GROUPS, "md"),
        cells=layout.ext(layout.TABLE_GROUPS, "cells.json"),
        html=report(layout.ext(layout.TABLE_GROUPS, "html"), caption="../report/table_groups.rst", category="Tables", labels={"table": "head / medium / tail", "dataset": "{dataset}"}),
        rendered=layout.ext(layout.TABLE_GROUPS, "rendered.json"),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("table"),
    log:
        "logs/report/table_groups_{dataset}.log",
    benchmark:
        "benchmarks/report/table_groups_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI table --results {input.results} --out {output.tex} --groups {wildcards.dataset} "
        "--train-labels {input.labels} --labels {params.labels:q} --methods {params.methods} > {log} 2>&1"


rule figure_sweep:
    input:
        results=layout.RESULTS,
    output:
        png=report(layout.ext(layout.ABLATION, "png"), caption="../report/sweep.rst", category="Ablations", labels={"ablation": "{name}", "kind": "figure"}),
        pdf=layout.ext(layout.ABLATION, "pdf"),
        csv=layout.ext(layout.ABLATION, "csv"),
    params:
        spec=lambda w: json.dumps(config["ablations"][w.name]),
        x=sweep_values,
        code=code("figure"),
    log:
        "logs/report/figure_{name}.log",
    benchmark:
        "benchmarks/report/figure_{name}.tsv"
    shell:
        "$NOISYMLT_CLI figure --results {input} --out {output.png} --ablation-spec {params.spec:q} --x "
        "{params.x:q} > {log} 2>&1"


rule inference_time:
    input:
        runs=timing_runs(layout.within(layout.RUN.replace("{dataset}", "{{dataset}}"), "manifest.json")),
        test=layout.TEST_LABELS,
    output:
        tex=layout.ext(layout.INFERENCE_TIME, "tex"),
        md=layout.ext(layout.INFERENCE_TIME, "md"),
        json=layout.ext(layout.INFERENCE_TIME, "json"),
        html=report(layout.ext(layout.INFERENCE_TIME, "html"), caption="../report/inference_time.rst", category="Tables", labels={"table": "inference time", "dataset": "{dataset}"}),
    params:
        runs=lambda w, input: " ".join(str(Path(m).parent) for m in input.runs),
        train_images=lambda w: image_root(w.dataset, "train"),
        test_images=lambda w: image_root(w.dataset, "test"),
        batch_sizes=" ".join(str(b) for b in config.get("timing", {}).get("batch_sizes", [])),
        trials=config.get("timing", {}).get("trials"),
        labels=method_labels(),
        paper=json.dumps(config.get("timing", {}).get("paper", {})),
        code=code("inference-time"),
    # Without it the job, ready after two runs at gamma 0.5, lost every scheduling round to training jobs: the
    # greedy scheduler ranks equal priorities by the size of their inputs. It then ran last, alone, 39 of the
    # demo's last 40 seconds with one core idle.
    priority: 1
    resources:
        gpu=1,
    log:
        "logs/report/inference_time_{dataset}.log",
    benchmark:
        "benchmarks/report/inference_time_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI inference-time --runs {params.runs} --test-labels {input.test} --train-images "
        "{params.train_images} --test-images {params.test_images} --batch-sizes {params.batch_sizes} --trials "
        "{params.trials} --labels {params.labels:q} --paper {params.paper:q} --out {output.tex} > {log} 2>&1"


rule readme_numbers:
    input:
        results=layout.RESULTS,
        selection=lambda w: readme_selection(),  # select_helpers.smk
        structure=expand(layout.ext(layout.STRUCTURE, "json"), dataset=GRID["datasets"]),  # the demo's: one dataset
    output:
        numbers=layout.README_NUMBERS,
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        pairs=lambda w: f"--pairs {' '.join(pairs)}" if (pairs := cleaned_pairs()) else "",
        oracles=lambda w: f"--oracles {' '.join(oracles)}" if (oracles := oracle_methods()) else "",
        code=code("readme-numbers"),
    log:
        "logs/report/readme_numbers.log",
    benchmark:
        "benchmarks/report/readme_numbers.tsv"
    shell:
        "$NOISYMLT_CLI readme-numbers --results {input.results} --methods {params.methods} --labels "
        "{params.labels:q} --selection {input.selection} --structure {input.structure} {params.pairs} {params.oracles} "
        "--out {output} > {log} 2>&1"


# Training dynamics of Ours at gamma 0.5 (paper Figs. voc_stitchup / coco_stitchup and vis_pl): drawn when the
# workflow trains those runs (common.smk: figure_datasets).


rule figure_noise_level:
    input:
        figure_logs,
    output:
        png=report(layout.ext(layout.NOISE_FIGURE, "png"), caption="../report/noise_level.rst", category="Figures"),
        pdf=layout.ext(layout.NOISE_FIGURE, "pdf"),
        csv=layout.ext(layout.NOISE_FIGURE, "csv"),
        md=layout.ext(layout.NOISE_FIGURE, "md"),
    params:
        title=lambda w: f"{dataset_title(w.dataset)}: {config['methods'][FIGURE_METHOD].get('label', FIGURE_METHOD)}, "
        f"noise rate {FIGURE_GAMMA}",
        code=code("noise-figure"),
    log:
        "logs/report/noise_level_{dataset}.log",
    benchmark:
        "benchmarks/report/noise_level_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI noise-figure --logs {input} --out {output.png} --title {params.title:q} --smooth 5 > "
        "{log} 2>&1"


rule figure_pseudo_labels:
    input:
        # the run's checkpoint.pt and run_config.json sit beside its manifest
        manifest=lambda w: figure_run(w.dataset, figure_seeds(w.dataset)[0], "manifest.json"),
        noisy=lambda w: layout.fill(layout.NOISY, dataset=w.dataset, gamma=FIGURE_GAMMA, seed=figure_seeds(w.dataset)[0]),
        clean=layout.TRAIN_LABELS,
        split=layout.CLASS_SPLIT,
        images=lambda w: train_images_ready(w.dataset),
    output:
        png=report(layout.ext(layout.PSEUDO_FIGURE, "png"), caption="../report/pseudo_labels.rst", category="Figures"),
        pdf=layout.ext(layout.PSEUDO_FIGURE, "pdf"),
    params:
        run=lambda w: figure_run(w.dataset, figure_seeds(w.dataset)[0], "").rstrip("/"),
        train_images=lambda w: image_root(w.dataset, "train"),
        code=code("pseudo-label-figure"),
    log:
        "logs/report/pseudo_labels_{dataset}.log",
    benchmark:
        "benchmarks/report/pseudo_labels_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI pseudo-label-figure --run {params.run} --train-labels {input.noisy} --clean-labels "
        "{input.clean} --split {input.split} --train-images {params.train_images} --out {output.png} > {log} "
        "2>&1"


# The training labels each noisy main-grid run disputes, ranked by each scorer that applies to it (its prediction,
# Ours' pseudo-label rule, DivideMix's label refinement, cleanlab; for the cross-fitting's base method, its prediction
# and cleanlab on the out-of-sample probabilities too, crossfit.smk), and how well each ranking finds the labels that
# are really wrong (the clean subset knows them): noisymlt.inference.suspects. One job a (dataset, method) over its
# runs: a job a run would cost Snakemake more than the scoring. The runs' checkpoints sit beside their manifests.


rule suspects:
    input:
        manifests=lambda w: [f"{paths.run_dir(w.dataset, g, s, w.method, n)}/manifest.json"
                             for n, g, s in paths.suspect_levels(config)],
        clean=layout.TRAIN_LABELS,
        out_of_sample=lambda w: [f for level in paths.suspect_levels(config)
                                 if (f := out_of_sample(w.dataset, w.method, level))],
    output:
        csv=[layout.ext(paths.suspects_stem("{dataset}", "{method}", level), "csv")
             for level in paths.suspect_levels(config)],
        json=[layout.ext(paths.suspects_stem("{dataset}", "{method}", level), "json")
              for level in paths.suspect_levels(config)],
    params:
        runs=lambda w: [paths.run_dir(w.dataset, g, s, w.method, n) for n, g, s in paths.suspect_levels(config)],
        train_images=lambda w: image_root(w.dataset, "train"),  # read only by a run without the image cache
        # the base method's cross-fitted probabilities (crossfit.smk), one file a run: its out-of-sample rows
        out_of_sample=lambda w, input: f"--out-of-sample {' '.join(input.out_of_sample)}" if input.out_of_sample else "",
        code=code("suspects"),
    # at paper scale every run predicts its training images again (ResNet-50 at 224 px): a GPU when there is one
    resources:
        gpu=1,
    log:
        "logs/report/suspects_{dataset}_{method}.log",
    benchmark:
        "benchmarks/report/suspects_{dataset}_{method}.tsv"
    shell:
        "$NOISYMLT_CLI suspects --run {params.runs} --out {output.csv} --clean-labels {input.clean} --train-images "
        "{params.train_images} {params.out_of_sample} --device auto > {log} 2>&1"


rule table_detection:
    input:
        records=lambda w: [layout.ext(paths.suspects_stem(w.dataset, m, level), "json")
                           for m in detection_methods() for level in paths.suspect_levels(config)],
        cleaned=lambda w: cleaning_records(w.dataset),  # what each cleaning of the grid changed
        clean=layout.TRAIN_LABELS,
    output:
        tex=layout.ext(layout.DETECTION_TABLE, "tex"),
        md=layout.ext(layout.DETECTION_TABLE, "md"),
        csv=layout.ext(layout.DETECTION_TABLE, "csv"),
    params:
        labels=method_labels(),
        methods=" ".join(detection_methods()),
        cleaned=lambda w, input: (f"--cleaned {' '.join(input.cleaned)} --clean-labels {input.clean}" if input.cleaned
                                  else ""),
        code=code("detection-table"),
    log:
        "logs/report/label_detection_{dataset}.log",
    benchmark:
        "benchmarks/report/label_detection_{dataset}.tsv"
    shell:
        "$NOISYMLT_CLI detection-table --records {input.records} --out {output.tex} --methods {params.methods} "
        "--labels {params.labels:q} {params.cleaned} > {log} 2>&1"
