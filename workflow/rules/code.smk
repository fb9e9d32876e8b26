# DVC's code dependencies (data/code/COMMAND.json, data/code/train/METHOD.json), written by this route too:
# every DVC output must also be a Snakemake output, or `dvc commit` after a Snakemake run fails. Snakemake's
# own jobs do not read them (each gets its digest as its code param). A local rule: it takes a second, not
# worth a cluster job.


localrules:
    code_digests,


rule code_digests:
    output:
        **STEPS["code_digests"].outputs(code=directory),
    params:
        config=lambda w: json.dumps(config, sort_keys=True),  # a function: Snakemake formats plain strings
        digests=lambda w: json.dumps(step_code.digests(config), sort_keys=True),  # rerun when a file would change
    log:
        "logs/code_digests.log",
    benchmark:
        "benchmarks/code_digests.tsv"
    shell:
        STEPS["code_digests"].shell
