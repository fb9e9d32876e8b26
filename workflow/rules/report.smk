# Run metrics -> results.parquet (long format, with provenance) -> paper-layout tables and figures.


rule aggregate:
    input:
        all_runs(layout.within(layout.RUN, "metrics.json")),
    output:
        # curves, pseudo_labels: the runs' per-epoch records in the layout DVC's plots read (dvc.yaml's `plots`)
        **STEPS["aggregate"].outputs(),
    params:
        code=code("aggregate"),
    log:
        "logs/report/aggregate.log",
    benchmark:
        "benchmarks/report/aggregate.tsv"
    shell:
        STEPS["aggregate"].shell


# Each dataset's long-tailed subset beside VOC-MLT's and COCO-MLT's (noisymlt.report.structure): what the paper's
# methods act on, judged before any result. A local rule: it reads three label files in about a second.


localrules:
    structure,


rule structure:
    input:
        **STEPS["structure"].input,
    output:
        **STEPS["structure"].outputs(),
    params:
        code=code("structure"),
    log:
        "logs/report/structure_{dataset}.log",
    benchmark:
        "benchmarks/report/structure_{dataset}.tsv"
    shell:
        STEPS["structure"].shell


rule table_total:
    input:
        **STEPS["table_total"].input,
    output:
        **STEPS["table_total"].outputs(
            html=lambda f: report(f, caption="../report/table_total.rst", category="Tables")),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("table"),
    log:
        "logs/report/table_total.log",
    benchmark:
        "benchmarks/report/table_total.tsv"
    shell:
        STEPS["table_total"].shell


# Whether the regime is the paper's: the runs fit their training labels, reach their learning rate, and
# Ours' pseudo labels fire (noisymlt.training.fit_diagnostics); and Ours minus each method, paired by seed.


rule table_fit:
    input:
        **STEPS["table_fit"].input,
    output:
        **STEPS["table_fit"].outputs(
            html=lambda f: report(f, caption="../report/fit.rst", category="Diagnostics",
                                  labels={"table": "fit diagnostics", "dataset": "{dataset}"})),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("fit-table"),
    log:
        "logs/report/fit_{dataset}.log",
    benchmark:
        "benchmarks/report/fit_{dataset}.tsv"
    shell:
        STEPS["table_fit"].shell


rule table_paired:
    input:
        **STEPS["table_paired"].input,
    output:
        **STEPS["table_paired"].outputs(
            html=lambda f: report(f, caption="../report/paired.rst", category="Tables",
                                  labels={"table": "paired differences", "dataset": "{dataset}"})),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("paired-table"),
    log:
        "logs/report/paired_{dataset}.log",
    benchmark:
        "benchmarks/report/paired_{dataset}.tsv"
    shell:
        STEPS["table_paired"].shell


rule figure_map_vs_gamma:
    input:
        **STEPS["figure_map_vs_gamma"].input,
    output:
        **STEPS["figure_map_vs_gamma"].outputs(
            png=lambda f: report(f, caption="../report/map_vs_gamma.rst", category="Figures")),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),  # the compared methods only: the ablation variants have their figures
        code=code("figure"),
    log:
        "logs/report/map_vs_gamma.log",
    benchmark:
        "benchmarks/report/map_vs_gamma.tsv"
    shell:
        STEPS["figure_map_vs_gamma"].shell


rule table_ablation:
    input:
        **STEPS["table_ablation"].input,
    output:
        **STEPS["table_ablation"].outputs(
            html=lambda f: report(f, caption="../report/ablation.rst", category="Ablations", labels={"ablation": "{name}"})),
    params:
        labels=method_labels(),
        spec=lambda w: json.dumps(config["ablations"][w.name]),
        code=code("table"),
    log:
        "logs/report/ablation_{name}.log",
    benchmark:
        "benchmarks/report/ablation_{name}.tsv"
    shell:
        STEPS["table_ablation"].shell


rule table_groups:
    input:
        **STEPS["table_groups"].input,  # the train labels: the group thresholds it records, stated when scaled
    output:
        **STEPS["table_groups"].outputs(
            html=lambda f: report(f, caption="../report/table_groups.rst", category="Tables",
                                  labels={"table": "head / medium / tail", "dataset": "{dataset}"})),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("table"),
    log:
        "logs/report/table_groups_{dataset}.log",
    benchmark:
        "benchmarks/report/table_groups_{dataset}.tsv"
    shell:
        STEPS["table_groups"].shell


rule figure_sweep:
    input:
        **STEPS["figure_sweep"].input,
    output:
        **STEPS["figure_sweep"].outputs(
            png=lambda f: report(f, caption="../report/sweep.rst", category="Ablations",
                                 labels={"ablation": "{name}", "kind": "figure"})),
    params:
        spec=lambda w: json.dumps(config["ablations"][w.name]),
        x=sweep_values,
        code=code("figure"),
    log:
        "logs/report/figure_{name}.log",
    benchmark:
        "benchmarks/report/figure_{name}.tsv"
    shell:
        STEPS["figure_sweep"].shell


rule inference_time:
    input:
        runs=timing_runs(layout.within(layout.RUN.replace("{dataset}", "{{dataset}}"), "manifest.json")),
        **STEPS["inference_time"].input,
    output:
        **STEPS["inference_time"].outputs(
            html=lambda f: report(f, caption="../report/inference_time.rst", category="Tables",
                                  labels={"table": "inference time", "dataset": "{dataset}"})),
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
        STEPS["inference_time"].shell


rule readme_numbers:
    input:
        **STEPS["readme_numbers"].input,
        selection=lambda w: readme_selection(),  # select.smk
        structure=expand(layout.ext(layout.STRUCTURE, "json"), dataset=GRID["datasets"]),  # the demo's: one dataset
    output:
        **STEPS["readme_numbers"].outputs(),
    params:
        labels=method_labels(),
        methods=" ".join(GRID["methods"]),
        code=code("readme-numbers"),
    log:
        "logs/report/readme_numbers.log",
    benchmark:
        "benchmarks/report/readme_numbers.tsv"
    shell:
        STEPS["readme_numbers"].shell


# Training dynamics of Ours at gamma 0.5 (paper Figs. voc_stitchup / coco_stitchup and vis_pl): drawn when the
# workflow trains those runs (common.smk: figure_datasets).


rule figure_noise_level:
    input:
        figure_logs,
    output:
        **STEPS["figure_noise_level"].outputs(
            png=lambda f: report(f, caption="../report/noise_level.rst", category="Figures")),
    params:
        title=lambda w: f"{dataset_title(w.dataset)}: {config['methods'][FIGURE_METHOD].get('label', FIGURE_METHOD)}, "
        f"noise rate {FIGURE_GAMMA}",
        code=code("noise-figure"),
    log:
        "logs/report/noise_level_{dataset}.log",
    benchmark:
        "benchmarks/report/noise_level_{dataset}.tsv"
    shell:
        STEPS["figure_noise_level"].shell


rule figure_pseudo_labels:
    input:
        # the run's checkpoint.pt and run_config.json sit beside its manifest
        manifest=lambda w: figure_run(w.dataset, figure_seeds(w.dataset)[0], "manifest.json"),
        noisy=lambda w: layout.fill(layout.NOISY, dataset=w.dataset, gamma=FIGURE_GAMMA, seed=figure_seeds(w.dataset)[0]),
        **STEPS["figure_pseudo_labels"].input,
        images=lambda w: train_images_ready(w.dataset),
    output:
        **STEPS["figure_pseudo_labels"].outputs(
            png=lambda f: report(f, caption="../report/pseudo_labels.rst", category="Figures")),
    params:
        run=lambda w: figure_run(w.dataset, figure_seeds(w.dataset)[0], "").rstrip("/"),
        train_images=lambda w: image_root(w.dataset, "train"),
        code=code("pseudo-label-figure"),
    log:
        "logs/report/pseudo_labels_{dataset}.log",
    benchmark:
        "benchmarks/report/pseudo_labels_{dataset}.tsv"
    shell:
        STEPS["figure_pseudo_labels"].shell
