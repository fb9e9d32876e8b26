"""results.parquet, paper-layout tables, the cell sidecar and `noisymlt trace`."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from fakes import fake_run
from noisymlt.cli import main
from noisymlt.report.aggregate import aggregate
from noisymlt.report.tables import mean_ci, write_table


def test_mean_ci_is_student_t():
    m, ci = mean_ci(np.array([70.0, 72.0, 71.0, 69.0, 73.0]))
    assert m == pytest.approx(71.0)
    assert ci == pytest.approx(2.7764451 * math.sqrt(2.5) / math.sqrt(5), rel=1e-6)
    assert mean_ci(np.array([5.0])) == (5.0, None)


def test_aggregate_table_and_trace(tmp_path, capsys):
    files = []
    for seed, (a, b, c) in enumerate([(0.60, 0.70, 0.50), (0.62, 0.72, 0.52)]):
        files.append(fake_run(tmp_path, "erm", 0.5, seed, [a]))
        files.append(fake_run(tmp_path, "db", 0.5, seed, [b]))
        files.append(fake_run(tmp_path, "ours", 0.5, seed, [c, 0.9, 0.1], heads=("ensemble", "random", "balanced")))
    frame = aggregate(files)
    # 3 methods x 2 seeds; rows per run = heads x (4 groups + 2 classes)
    assert frame["run_id"].nunique() == 6
    assert len(frame) == 2 * (6 + 6 + 3 * 6)
    assert frame["gamma"].dtype == "float64" and frame["seed"].dtype == "int64"
    assert set(frame["metric"]) == {"mAP", "AP"}

    results = tmp_path / "results.parquet"
    frame.to_parquet(results)
    out = tmp_path / "table.tex"
    sidecar = write_table(pd.read_parquet(results), out, {"erm": "ERM", "db": "DB", "ours": "Ours"})
    tex = out.read_text()
    md = out.with_suffix(".md").read_text()
    # db best (71.00), erm second (61.00); ours' random branch (90) is shaded and never ranked
    assert "\\textbf{71.00 $\\pm$" in tex and "\\underline{61.00 $\\pm$" in tex
    assert "\\rowcolor{Gray}\nOurs-random & 90.00" in tex
    assert "| Ours | 51.00 ± " in md
    cell = sidecar["cells"]["db/main/toy/0.5"]
    assert [r["seed"] for r in cell["runs"]] == [0, 1]
    assert cell["ci95"] == pytest.approx(12.706205 * math.sqrt(2) / math.sqrt(2), rel=1e-6)

    cells_file = str(out.with_suffix(".cells.json"))
    rc = main(["trace", "db/main/toy/0.5", "--sidecar", cells_file])
    text = capsys.readouterr().out
    assert rc == 0 and "run db-0.5-0" in text and "run db-0.5-1" in text
    assert text.count("ok ") == 2 * 4 and "all recorded files and values check out" in text
    assert main(["trace", "nope/main/toy/0.5", "--sidecar", cells_file]) == 2
    assert main(["trace", "--list", "--sidecar", cells_file]) == 0
    assert "ours/ensemble/toy/0.5" in capsys.readouterr().out.splitlines()


def test_trace_flags_every_kind_of_mismatch(tmp_path, capsys):
    files = [fake_run(tmp_path, "db", 0.5, seed, [0.7 + seed / 100]) for seed in (0, 1, 2)]
    out = tmp_path / "table.tex"
    write_table(aggregate(files), out, {"db": "DB"})
    cells = str(out.with_suffix(".cells.json"))
    runs = [f.parent for f in files]

    def trace():
        rc = main(["trace", "db/main/toy/0.5", "--sidecar", cells])
        return rc, capsys.readouterr().out

    assert trace()[0] == 0
    (runs[0] / "noisy.parquet").write_bytes(b"tampered")  # an input changed after training
    rc, text = trace()
    assert rc == 1 and f"CHANGED {runs[0] / 'noisy.parquet'}" in text
    (runs[0] / "noisy.parquet").unlink()
    rc, text = trace()
    assert rc == 1 and f"MISSING {runs[0] / 'noisy.parquet'}" in text
    manifest = json.loads((runs[1] / "manifest.json").read_text())  # retrained under another run id
    (runs[1] / "manifest.json").write_text(json.dumps({**manifest, "run_id": "another-run"}))
    rc, text = trace()
    assert "RUN ID: the table used run db-0.5-1" in text and "another-run" in text
    metrics = json.loads((runs[2] / "metrics.json").read_text())  # results changed after the table was made
    metrics["heads"]["main"]["map"]["total"] = 0.1
    (runs[2] / "metrics.json").write_text(json.dumps(metrics))
    rc, text = trace()
    assert rc == 1 and "STALE: the table shows" in text and f"CHANGED {runs[2] / 'metrics.json'}" in text


@pytest.mark.parametrize("style", ["md", "tex", "html"])
def test_trace_fails_a_hand_edited_table_value_naming_file_and_cell(tmp_path, capsys, style):
    """A reader sees the rendered tables: a value typed over one of them (issue 40: 39.48 -> 44.48 in the .md and
    .tex) must fail trace, naming the file and the cell, whichever cell was traced."""
    files = []
    for seed in (0, 1, 2):
        files.append(fake_run(tmp_path, "erm", 0.5, seed, [0.39 + seed / 100]))
        files.append(fake_run(tmp_path, "db", 0.5, seed, [0.70 + seed / 100]))
        files.append(fake_run(tmp_path, "ours", 0.5, seed, [0.5, 0.9, 0.1], heads=("ensemble", "random", "balanced")))
    out = tmp_path / "table.tex"
    sidecar = write_table(aggregate(files), out, {"erm": "ERM", "db": "DB", "ours": "Ours"})
    cells = str(out.with_suffix(".cells.json"))
    assert main(["trace", "db/main/toy/0.5", "--sidecar", cells]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert "shown" not in sidecar["cells"]["erm/main/toy/0.5"]  # the cells' sidecar is DVC's metrics: numbers only
    record = json.loads(out.with_suffix(".rendered.json").read_text())
    shown = record["shown"]["erm/main/toy/0.5"][style]
    assert shown.startswith("40.00") or "40.00" in shown
    path = out.with_suffix(f".{style}")
    text = path.read_text()
    assert text.count("40.00") == 1
    path.write_text(text.replace("40.00", "45.00"))
    rc = main(["trace", "db/main/toy/0.5", "--sidecar", cells])
    printed = capsys.readouterr().out
    assert rc == 1 and f"TABLE: {path} cell erm/main/toy/0.5 (row ERM, column 1) shows" in printed, printed
    assert "45.00" in printed
    path.write_text(text + "\n% a note\n")  # no value touched, but not the file that was rendered
    assert main(["trace", "db/main/toy/0.5", "--sidecar", cells]) == 1
    assert f"TABLE: {path} changed since it was rendered" in capsys.readouterr().out
    path.write_text(text)
    assert main(["trace", "db/main/toy/0.5", "--sidecar", cells]) == 0
    out.with_suffix(".rendered.json").unlink()  # without the record the tables cannot be checked: said, and a failure
    assert main(["trace", "db/main/toy/0.5", "--sidecar", cells]) == 1
    assert "MISSING" in capsys.readouterr().out


def test_trace_names_a_missing_run_and_notices_predictions_of_another_checkpoint(tmp_path, capsys):
    from noisymlt.core.manifest import file_sha256

    files = [fake_run(tmp_path, "db", 0.5, seed, [0.7 + seed / 100]) for seed in (0, 1)]
    out = tmp_path / "table.tex"
    write_table(aggregate(files), out, {"db": "DB"})
    cells = str(out.with_suffix(".cells.json"))
    runs = [f.parent for f in files]
    # predictions and manifest rewritten from another checkpoint than the one the manifest records
    np.savez(runs[1] / "predictions.npz", checkpoint_sha256=np.array("b" * 64), code_digest=np.array("d1"))
    manifest = json.loads((runs[1] / "manifest.json").read_text())
    manifest["checkpoint_content_sha256"] = "a" * 64
    manifest["outputs"]["predictions"]["sha256"] = file_sha256(runs[1] / "predictions.npz")
    (runs[1] / "manifest.json").write_text(json.dumps(manifest))
    evaluation = json.loads((runs[1] / "metrics.manifest.json").read_text())
    evaluation["inputs"]["predictions"]["sha256"] = manifest["outputs"]["predictions"]["sha256"]
    (runs[1] / "metrics.manifest.json").write_text(json.dumps(evaluation))
    shutil.rmtree(runs[0])  # a deleted run
    assert main(["trace", "db/main/toy/0.5", "--sidecar", cells]) == 1
    text = capsys.readouterr().out
    assert "None" not in text
    assert f"run db-0.5-0  seed=0  MISSING (the table used {runs[0] / 'manifest.json'})" in text
    assert f"MISSING run: {runs[0] / 'manifest.json'} does not exist" in text
    assert f"CHECKPOINT: {runs[1] / 'predictions.npz'} was made from checkpoint {'b' * 16}, the manifest records " \
           f"checkpoint {'a' * 16}" in text
    assert text.count("PROBLEM") == 2


def test_trace_fails_a_result_not_made_by_the_code_its_manifest_names(tmp_path, capsys):
    """Predictions from a checkpoint trained by other code, and a manifest whose code the source no longer gives
    (edited since, or edited and reverted while the job ran)."""
    from noisymlt.core import codedeps
    from noisymlt.core.manifest import file_sha256

    files = [fake_run(tmp_path, "db", 0.5, seed, [0.7]) for seed in (0, 1)]
    out = tmp_path / "table.tex"
    write_table(aggregate(files), out, {"db": "DB"})
    cells = str(out.with_suffix(".cells.json"))
    runs = [f.parent for f in files]
    entries = ["noisymlt.training.trainer", "noisymlt.methods.single", "noisymlt.losses.db"]
    now = codedeps.fresh_digest(*entries)
    for run in runs:  # both runs made by the code on disk: trace passes
        np.savez(run / "predictions.npz", run=np.array(run.name), code_digest=np.array(now))
        manifest = json.loads((run / "manifest.json").read_text())
        manifest.update(code_digest=now, code_entries=entries)
        manifest["outputs"]["predictions"]["sha256"] = file_sha256(run / "predictions.npz")
        (run / "manifest.json").write_text(json.dumps(manifest))
        evaluation = json.loads((run / "metrics.manifest.json").read_text())
        evaluation["inputs"]["predictions"]["sha256"] = manifest["outputs"]["predictions"]["sha256"]
        (run / "metrics.manifest.json").write_text(json.dumps(evaluation))
    assert main(["trace", "db/main/toy/0.5", "--sidecar", cells]) == 0, capsys.readouterr().out
    capsys.readouterr()
    # seed 0: the predictions came from a checkpoint of other code; seed 1: its manifest names code the source
    # no longer gives
    np.savez(runs[0] / "predictions.npz", run=np.array("0"), code_digest=np.array("0123456789abcdef"))
    for run in runs:
        manifest = json.loads((run / "manifest.json").read_text())
        manifest["outputs"]["predictions"]["sha256"] = file_sha256(run / "predictions.npz")
        if run == runs[1]:
            manifest["code_digest"] = "fedcba9876543210"
            np.savez(run / "predictions.npz", run=np.array("1"), code_digest=np.array("fedcba9876543210"))
            manifest["outputs"]["predictions"]["sha256"] = file_sha256(run / "predictions.npz")
        (run / "manifest.json").write_text(json.dumps(manifest))
    assert main(["trace", "db/main/toy/0.5", "--sidecar", cells]) == 1
    text = capsys.readouterr().out
    assert f"CODE: {runs[0] / 'predictions.npz'} came from a checkpoint trained by code 0123456789abcdef; the " \
           f"manifest records code {now}" in text
    assert f"CODE: the train step ran code fedcba9876543210; the source now gives {now} (edited since: rerun the " \
           "workflow)" in text


METHODS = {"erm": "ERM", "rs_focal": "RS-Focal", "ours": "Ours"}  # keys as in params.yaml, labels as in the tables
GAMMAS = [0.3, 0.5, 0.7, 0.9]


def map_results(tmp_path):
    """Compared methods at every noise rate (two seeds) and an ablation variant at 0.5, as the demo's
    results.parquet holds both."""
    files = []
    for g in GAMMAS:
        for s in (0, 1):
            files.append(fake_run(tmp_path, "erm", g, s, [0.6 - g / 2 + s / 100]))
            files.append(fake_run(tmp_path, "rs_focal", g, s, [0.7 - g / 2]))
            files.append(fake_run(tmp_path, "ours", g, s, [0.8 - g / 2, 0.1, 0.2],
                                  heads=("ensemble", "random", "balanced")))
    files.append(fake_run(tmp_path, "ours_no_both", 0.5, 0, [0.99, 0.1, 0.2], heads=("ensemble", "random", "balanced")))
    return aggregate(files)


def test_map_vs_gamma_figure_draws_the_compared_methods_only(tmp_path):
    from figure_checks import check_layout, strings
    from noisymlt.report.figures import map_vs_gamma_figure

    results = map_results(tmp_path)
    fig = map_vs_gamma_figure(results, list(METHODS), METHODS)
    check_layout(fig, internal_names=[*METHODS, "ours_no_both", "toy"])
    panels = fig.axes
    assert [ax.get_title() for ax in panels] == ["total", "head", "medium", "tail"]
    for ax in panels:
        assert [line.get_label() for line in ax.get_lines()] == list(METHODS.values())  # no ablation variant
        assert list(ax.get_xticks()) == GAMMAS  # ticks at the data's noise rates
    for ax in panels[2:]:  # labelled under the bottom row (the columns share their x axis)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0.3", "0.5", "0.7", "0.9"]
    ours = panels[0].get_lines()[2]  # the ensemble head, mean over seeds, in %
    assert list(ours.get_xdata()) == GAMMAS
    assert [round(y, 6) for y in ours.get_ydata()] == [65.0, 55.0, 45.0, 35.0]
    assert [round(y, 6) for y in panels[0].get_lines()[0].get_ydata()] == [45.5, 35.5, 25.5, 15.5]
    # every axis titled: x under the bottom row, y beside the left column
    assert [ax.get_xlabel() for ax in panels] == ["", "", "noise rate $\\gamma$", "noise rate $\\gamma$"]
    assert [ax.get_ylabel() for ax in panels] == ["mAP (%)", "", "mAP (%)", ""]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(METHODS.values())
    assert "Toy-MLT-Noise: mAP, mean over 2 seeds" in strings(fig)


def test_map_vs_gamma_figure_of_two_datasets_names_them(tmp_path):
    from figure_checks import check_layout
    from noisymlt.report.figures import map_vs_gamma_figure

    toy = map_results(tmp_path)
    results = pd.concat([toy.assign(dataset="coco"), toy.assign(dataset="voc")], ignore_index=True)
    fig = map_vs_gamma_figure(results, list(METHODS), METHODS)
    check_layout(fig, internal_names=[*METHODS, "voc", "coco"])
    assert [ax.get_title() for ax in fig.axes][::3] == ["VOC-MLT-Noise: total", "VOC-MLT-Noise: tail",
                                                        "COCO-MLT-Noise: medium"]


def test_map_vs_gamma_figure_draws_a_cleaned_method_as_the_one_it_retrains_and_fits_the_demos_legend(tmp_path):
    """The demo's fourteen compared methods: the legend stays inside one column (four columns of names such as
    Clean-DB-Focal ran off both sides); a clean-then-retrain method takes its base's colour and marker, hollow,
    dashed, the oracle's dotted; `figure` reads those from the methods' clean blocks."""
    from figure_checks import check_layout
    from noisymlt.report.figures import cleaned_variants, map_vs_gamma_figure

    names = ["erm", "focal", "rs", "rs_focal", "ldam", "bbn", "mlgcn", "dividemix", "db", "db_focal", "clean_erm",
             "clean_db_focal", "oracle_erm", "ours"]
    labels = {"erm": "ERM", "focal": "Focal Loss", "rs_focal": "RS-Focal", "db_focal": "DB-Focal",
              "clean_erm": "Clean-ERM", "clean_db_focal": "Clean-DB-Focal", "oracle_erm": "Oracle-ERM", "ours": "Ours"}
    base = map_results(tmp_path)
    results = pd.concat([base[base["method"] != "rs_focal"]]
                        + [base[base["method"] == "erm"].assign(method=m) for m in names if m not in ("erm", "ours")],
                        ignore_index=True)
    clean = {"clean_erm": {"of": "erm", "flags": "cleanlab"}, "clean_db_focal": {"of": "db_focal", "flags": "cleanlab"},
             "oracle_erm": {"of": "erm", "flags": "oracle"}}
    fig = map_vs_gamma_figure(results, names, labels, cleaned_variants(clean))
    check_layout(fig)
    line = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    for cleaned, of, style in (("Clean-ERM", "ERM", "--"), ("Clean-DB-Focal", "DB-Focal", "--"),
                               ("Oracle-ERM", "ERM", ":")):
        assert line[cleaned].get_color() == line[of].get_color() and line[cleaned].get_marker() == line[of].get_marker()
        assert line[cleaned].get_linestyle() == style and line[cleaned].get_markerfacecolor() == "white"
        assert line[of].get_linestyle() == "-"
    assert len({line[m].get_color() for m in ("ERM", "Focal Loss", "DB-Focal", "Ours")}) == 4


def test_figure_command_writes_png_and_pdf_and_needs_the_methods(tmp_path, capsys):
    results = tmp_path / "results.parquet"
    map_results(tmp_path).to_parquet(results)
    out = tmp_path / "fig.png"
    args = ["figure", "--results", str(results), "--out", str(out)]
    assert main(args) == 2 and "name the compared methods" in capsys.readouterr().err
    assert main([*args, "--methods", *METHODS, "--labels", json.dumps(METHODS)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.with_suffix(".pdf").read_bytes()[:5] == b"%PDF-"


def test_ablation_table_layout_rows_and_paper_column(tmp_path):
    files = [fake_run(tmp_path, m, 0.5, s, [v + s / 100]) for s in (0, 1, 2)
             for m, v in (("base", 0.60), ("variant", 0.65))]
    # the variant also has main-grid runs at another rate and a fourth seed: not the ablation's
    files += [fake_run(tmp_path, "variant", 0.9, 0, [0.1]), fake_run(tmp_path, "variant", 0.5, 3, [0.9])]
    block = {"label": "Ablation X", "dataset": "toy", "methods": ["base", "variant"], "gammas": [0.5], "seeds": [0, 1, 2],
             "rows": {"base": "-- / --", "variant": "Stitch-Up"}, "paper": {"base": [66.84, 65.33, 77.02, 60.33]}}
    from noisymlt.report.tables import write_ablation_table

    out = tmp_path / "ab.tex"
    sidecar = write_ablation_table(aggregate(files), out, {}, block)
    md = out.with_suffix(".md").read_text()
    assert "| -- / -- | _61.00 ± 2.48_ | _61.00 ± 2.48_ | _61.00 ± 2.48_ | _61.00 ± 2.48_ | 66.84 |" in md
    assert "| Stitch-Up | **66.00 ± 2.48** |" in md and "0.9" not in md
    assert "Method & Total & Head & Medium & Tail & Paper" in out.read_text()
    assert "variant/main/0.5/tail" in sidecar["cells"]


def test_groups_table_has_head_medium_tail_per_noise_rate_and_branches(tmp_path):
    from noisymlt.report.tables import write_groups_table

    files = []
    for seed in range(3):
        files.append(fake_run(tmp_path, "erm", 0.5, seed, [0.60 + 0.01 * seed]))
        files.append(fake_run(tmp_path, "ours", 0.5, seed, [0.70, 0.65, 0.68], heads=("ensemble", "random", "balanced")))
        files.append(fake_run(tmp_path, "ours", 0.9, seed, [0.30, 0.20, 0.25], heads=("ensemble", "random", "balanced")))
    sidecar = write_groups_table(aggregate(files), tmp_path / "t.tex", {"erm": "ERM", "ours": "Ours"}, "toy")
    md = (tmp_path / "t.md").read_text().splitlines()
    assert md[4] == ("| Method | head (γ=0.5) | medium (γ=0.5) | tail (γ=0.5) "
                     "| head (γ=0.9) | medium (γ=0.9) | tail (γ=0.9) |")
    rows = {line.split(" | ")[0][2:]: line for line in md[6:]}
    assert list(rows) == ["ERM", "Ours", "Ours-random", "Ours-balance"]
    # ERM's seeds 0.60, 0.61, 0.62: mean 61.00, t-interval 4.303 * 0.01 / sqrt(3) * 100
    assert rows["ERM"] == "| ERM | " + " | ".join(["_61.00 ± 2.48_"] * 3 + ["--"] * 3) + " |"  # rank 2 of 2
    assert rows["Ours"].count("**70.00 ± 0.00**") == 3 and "65.00 ± 0.00" in rows["Ours-random"]
    assert set(sidecar["cells"]) >= {"ours/balanced/0.9/tail", "erm/main/0.5/head"}
    tex = (tmp_path / "t.tex").read_text()
    assert "\\multicolumn{3}{c}{0.5}" in tex and "\\rowcolor{Gray}\nOurs-balance" in tex
    html = (tmp_path / "t.html").read_text()
    assert html.count("<tr>") == 5 and "<b>70.00 ± 0.00</b>" in html


def sweep_case(tmp_path, dataset="toy"):
    files = []
    for seed in range(3):
        for method, m in (("ours_no_pseudo", 0.60), ("ours_k3", 0.55), ("ours_k4", 0.50)):
            files.append(fake_run(tmp_path, method, 0.5, seed, [m + 0.01 * seed, m, m],
                                  heads=("ensemble", "random", "balanced")))
    # a run outside the ablation's seeds and noise rates: not its point
    files.append(fake_run(tmp_path, "ours_k3", 0.9, 0, [0.1, 0.1, 0.1], heads=("ensemble", "random", "balanced")))
    results = aggregate(files).assign(dataset=dataset)
    block = {"label": "Number K of stitched images (p = 1, without Co-Learning)", "dataset": dataset,
             "gammas": [0.5], "seeds": [0, 1, 2], "methods": ["ours_no_pseudo", "ours_k3", "ours_k4"],
             "sweep": {"option": "stitchup.k", "label": "number K of stitched images"},
             "paper": {"ours_no_pseudo": [68.53, None, None, None], "ours_k4": [67.06, None, None, None]}}
    return results, block


def test_sweep_figure_plots_each_methods_swept_value(tmp_path):
    from figure_checks import check_layout, strings
    from noisymlt.methods.options import stitchup_option
    from noisymlt.report.figures import sweep_figure, sweep_points

    methods = {"ours_no_pseudo": {}, "ours_k3": {"stitchup": {"k": 3}}, "ours_k4": {"stitchup": {"k": 4}}}
    xs = {m: stitchup_option(b, "stitchup.k") for m, b in methods.items()}
    assert xs == {"ours_no_pseudo": 2, "ours_k3": 3, "ours_k4": 4}
    assert stitchup_option({"stitchup": {"enabled": False}}, "stitchup.k") == 1
    assert stitchup_option({}, "stitchup.p") == 1.0
    results, block = sweep_case(tmp_path)
    points = sweep_points(results, block, xs)
    assert points["x"].tolist() == [2, 3, 4] and points["gamma"].tolist() == [0.5] * 3
    assert points["mean"].round(4).tolist() == [61.0, 56.0, 51.0]  # the ensemble head, mean over seeds
    fig = sweep_figure(points, block, xs)
    check_layout(fig, internal_names=[*methods, "toy", "voc"])
    # toy results and the paper's VOC numbers never share a scale: a panel each, each titled with its dataset
    measured, paper = fig.axes
    assert measured.get_title() == "measured on Toy-MLT-Noise\n3 seeds, $\\gamma$ = 0.5\nmean ± 95% CI"
    # an error bar per point: mean ± t(0.975, n - 1) * sd / sqrt(n) of the three seeds' values
    from scipy import stats

    (bars,) = measured.collections
    for (x, m), seg in zip(((2, 0.60), (3, 0.55), (4, 0.50)), bars.get_segments()):
        values = 100 * np.array([m + 0.01 * s for s in range(3)])
        half = stats.t.ppf(0.975, 2) * values.std(ddof=1) / np.sqrt(3)
        assert seg[:, 0].tolist() == [x, x]
        assert seg[:, 1] == pytest.approx([values.mean() - half, values.mean() + half])
    assert paper.get_title() == "paper, VOC-MLT-Noise\n$\\gamma$ = 0.5"
    assert [list(line.get_ydata().round(4)) for line in measured.get_lines()] == [[61.0, 56.0, 51.0]]
    assert [list(line.get_ydata()) for line in paper.get_lines()] == [[68.53, 67.06]]
    assert list(paper.get_lines()[0].get_xdata()) == [2, 4]
    assert all(list(ax.get_xticks()) == [2, 3, 4] for ax in fig.axes)
    assert measured.get_ylim()[1] < 66.3 < paper.get_ylim()[0]  # each scale fits its own data
    assert "number K of stitched images" in strings(fig) and "total mAP (%)" in strings(fig)


def test_sweep_figure_on_the_papers_dataset_shares_one_panel(tmp_path):
    from figure_checks import check_layout
    from noisymlt.report.figures import sweep_figure, sweep_points

    results, block = sweep_case(tmp_path, dataset="voc")
    xs = {"ours_no_pseudo": 2, "ours_k3": 3, "ours_k4": 4}
    fig = sweep_figure(sweep_points(results, block, xs), block, xs)
    check_layout(fig, internal_names=["voc"])
    (ax,) = fig.axes
    assert ax.get_title() == "VOC-MLT-Noise\n3 seeds, $\\gamma$ = 0.5\nmean ± 95% CI"
    assert [line.get_label() for line in ax.get_lines()] == ["measured, $\\gamma$ = 0.5", "paper, VOC-MLT-Noise"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["measured, $\\gamma$ = 0.5", "paper, VOC-MLT-Noise"]


def test_sweep_figure_command_gives_identical_bytes_for_identical_results(tmp_path):
    results, block = sweep_case(tmp_path)
    path = tmp_path / "results.parquet"
    results.to_parquet(path)
    out = tmp_path / "k.png"
    args = ["figure", "--results", str(path), "--out", str(out), "--ablation-spec", json.dumps(block),
            "--x", json.dumps({"ours_no_pseudo": 2, "ours_k3": 3, "ours_k4": 4})]
    assert main(args) == 0
    assert pd.read_csv(tmp_path / "k.csv")["mean"].round(4).tolist() == [61.0, 56.0, 51.0]
    first = out.read_bytes(), out.with_suffix(".pdf").read_bytes()
    assert main(args) == 0
    assert (out.read_bytes(), out.with_suffix(".pdf").read_bytes()) == first


def test_branch_rows_are_titled_as_in_the_paper():
    from noisymlt.report.tables import branch_title

    assert branch_title("Ours", "random") == "Ours-random" and branch_title("Ours", "balanced") == "Ours-balance"
    assert branch_title("-- / --", "random") == "-- / -- (random)"  # an ablation row ending in punctuation
    assert branch_title("Stitch-Up + PL", "balanced") == "Stitch-Up + PL-balance"


def test_figure_checks_catch_what_the_old_figures_did():
    """The layout check fails on a legend over the data, a title off the edge, small text and internal names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from figure_checks import check_layout

    def figure(**kwargs):
        fig, ax = plt.subplots(figsize=(3.4, 2.5), layout="constrained")
        ax.plot([0.3, 0.5], [1, 2], label="ERM")
        ax.set_title(kwargs.get("title", "total"), fontsize=kwargs.get("size", 8))
        if kwargs.get("inside"):
            ax.legend(loc="upper right")
        return fig

    check_layout(figure())
    for kwargs, message in [({"inside": True}, "legend covers"), ({"title": "x" * 120}, "runs off"),
                            ({"size": 5}, "'total' is 5.0 pt"), ({"title": "rs_focal"}, "internal name")]:
        with pytest.raises(AssertionError, match=message):
            check_layout(figure(**kwargs))
    with pytest.raises(AssertionError, match="internal name 'erm'"):
        check_layout(figure(title="erm"), internal_names=["erm"])


def test_the_clean_column_is_a_point_apart_on_the_map_vs_gamma_figure():
    """gamma 0 (grid.clean_methods) is no noise rate: its mean is drawn as a marker without a line to the noise
    rates' curve, at a tick named "clean"; a method with no clean runs draws only its curve."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from noisymlt.report.figures import map_vs_gamma_figure

    rows = [{"metric": "mAP", "dataset": "toy", "method": m, "gamma": g, "seed": s, "head": "main", "group": grp,
             "value": 0.5 - g / 2 + s / 100}
            for m in ("erm", "focal") for g in (0.0, 0.3, 0.5) for s in (0, 1) for grp in ("total", "head", "medium", "tail")
            if not (m == "focal" and g == 0.0)]
    fig = map_vs_gamma_figure(pd.DataFrame(rows), ["erm", "focal"], {"erm": "ERM", "focal": "Focal Loss"})
    ax = fig.axes[0]
    lines = [(list(line.get_xdata()), line.get_linestyle(), line.get_label()) for line in ax.get_lines()]
    assert ([0.3, 0.5], "-", "ERM") in lines and ([0.3, 0.5], "-", "Focal Loss") in lines
    assert [(x, style) for x, style, _ in lines if x == [0.0]] == [([0.0], "None")]  # ERM's clean point only
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[-1].get_xticklabels()] == ["clean", "0.3", "0.5"]
    plt.close(fig)
