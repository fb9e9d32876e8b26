# noisymlt workflow: download -> labels -> long-tail subset -> noisy labels -> train -> evaluate -> report.
# The rules are in workflow/rules/, one file per phase; this file sits at the project root so that `snakemake`
# finds it, and profiles/default beside it, from there.
# Settings: params.yaml (paper scale); profiles in workflow/profiles layer their own params on top.
# Usage (target first, or `--` before it: `--resources` would swallow a trailing target):
#   snakemake reports/table_total.tex --cores 8 --resources gpu=2
#   snakemake --profile workflow/profiles/demo
from snakemake.utils import min_version

min_version("9.0")


configfile: "params.yaml"


report: "workflow/report/workflow.rst"


# common.smk first validates config against workflow/schemas/params.schema.yaml and the cross-references a
# schema cannot express; a bad setting stops the run with one line naming its params file and key.
include: "workflow/rules/common.smk"
include: "workflow/rules/select_helpers.smk"
include: "workflow/rules/crossfit_helpers.smk"


wildcard_constraints:
    dataset="[a-z0-9_]+",
    gamma="[0-9.]+",
    noise="(-[a-z0-9_]+)?",  # the noise model after the rate, none for the paper's (layout.noise_tag)
    seed="[0-9]+",
    method="[A-Za-z0-9_]+",


include: "workflow/rules/data.smk"
include: "workflow/rules/noise.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/train.smk"


if crossfit_method():  # params crossfit, where the detection table is made

    include: "workflow/rules/crossfit.smk"


include: "workflow/rules/authors.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        report_targets(),
        finished_work(),  # so that a rerun restores what a failed job deleted
        selection_targets(),  # every stage's scores, beside the choices the final runs read
        authors_targets(),  # [CL]'s checkpoints evaluated (params authors_checkpoints), when it lists any
        crossfit_work(),  # the cross-fitting's folds, runs and probabilities behind the detection table


# The three phases dvc.yaml runs one stage each (`snakemake ... -- data`): together, what `all` makes.


localrules:
    data,
    runs,
    reports,


rule data:
    input:
        data_targets(),


rule runs:
    input:
        run_targets(),


rule reports:
    input:
        report_targets(),
