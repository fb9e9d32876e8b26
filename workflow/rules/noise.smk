# Clean long-tailed labels -> one noisy copy per (noise model, noise rate, seed), with realised-noise statistics.
# The paper's model writes g{gamma}_s{seed}; another model's name follows the rate (g0.5-uniform_s0). The words come
# from the model (noisymlt.data.noise_models, paths.noise_argv): `noisymlt noise --labels SUBSET --gamma G --seed S
# --out NOISY --stats STATS` for the paper's, with --model and its settings for another; [CL]'s published labels
# are read by `authors-noise`.


rule noise:
    input:
        labels=layout.TRAIN_LABELS,
        model_files=lambda w: paths.noise_files(config, w.dataset, float(w.gamma), layout.noise_name(w.noise)),
    output:
        labels=layout.NOISY,
        stats=layout.NOISY_STATS,
    params:
        args=lambda w: argv(paths.noise_argv(config, w.dataset, w.gamma, w.seed, layout.noise_name(w.noise))),
        code=lambda w: step_code.noise_digest(layout.noise_name(w.noise)),  # its command's and its model's code
    log:
        "logs/noise/{dataset}_g{gamma}{noise}_s{seed}.log",
    benchmark:
        "benchmarks/noise/{dataset}_g{gamma}{noise}_s{seed}.tsv"
    shell:
        "$NOISYMLT_CLI {params.args} > {log} 2>&1"
