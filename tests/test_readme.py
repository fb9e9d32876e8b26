"""The README quotes the demo's numbers from docs/demo_numbers.json, which the demo writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from noisymlt.cli import main
from noisymlt.errors import NoisyMLTError
from noisymlt.report.readme import END, START, demo_numbers, render, replace_block

REPO = Path(__file__).resolve().parents[1]


def test_readme_block_is_the_rendering_of_the_committed_numbers(tmp_path, capsys):
    assert main(["readme", "--check", "--numbers", str(REPO / "docs" / "demo_numbers.json"),
                 "--readme", str(REPO / "README.md")]) == 0
    # a number typed into the README by hand is caught
    readme = (REPO / "README.md").read_text()
    numbers = json.loads((REPO / "docs" / "demo_numbers.json").read_text())
    row = next(r for r in numbers["rows"] if r["method"] == "ours" and r["group"] == "total")
    line = next(x for x in readme[readme.index(START):readme.index(END)].splitlines() if x.startswith("| Ours |"))
    typed = f"| Ours | {row['mean']:.2f}"
    assert line.startswith(typed)
    (tmp_path / "README.md").write_text(readme.replace(line, line.replace(typed, f"| Ours | {row['mean'] + 5:.2f}")))
    assert main(["readme", "--check", "--numbers", str(REPO / "docs" / "demo_numbers.json"),
                 "--readme", str(tmp_path / "README.md")]) == 1
    diff = capsys.readouterr().out
    assert f"-| Ours | {row['mean'] + 5:.2f}" in diff  # the diff shows the typed row against the generated one


def test_the_readme_shows_the_demo_datasets_structure_beside_voc_mlts():
    """The block's structure table is the committed numbers' ``structure`` entry (the demo's reports/structure_toy.json),
    each statistic beside VOC-MLT's with its tolerance and mark."""
    numbers = json.loads((REPO / "docs" / "demo_numbers.json").read_text())
    entry = numbers["structure"]
    assert entry["dataset"] == numbers["dataset"] and entry["report"] == f"reports/structure_{numbers['dataset']}.md"
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index(START):readme.index(END)]
    assert f"`{entry['report']}`; groups {entry['thresholds']['text']})" in block
    row = next(line for line in block.splitlines() if line.startswith("| images with a tail label |"))
    ok = next(r["ok"] for r in entry["compare"] if r["statistic"] == "tail_image_share")
    assert row == (f"| images with a tail label | {100 * entry['stats']['tail_image_share']:.1f}% | 6.2% | ± 3 points | "
                   f"{'within' if ok else '**outside**'} |")
    assert sum("| ± " in line or "| within a factor" in line for line in block.splitlines()) == 13


def test_demo_numbers_carry_the_structure_report_of_their_dataset(tmp_path):
    from fakes import fake_run
    from fakes import structure_files

    from noisymlt.report.aggregate import aggregate

    files = structure_files(tmp_path)
    out = tmp_path / "reports" / "structure_toy.json"
    assert main(["structure", "--labels", str(files["labels"]), "--split", str(files["split"]), "--test-labels",
                 str(files["test_labels"]), "--out", str(out), "--dataset", "toy"]) == 0
    results = aggregate([fake_run(tmp_path, "erm", 0.5, 0, [0.5])])
    numbers = demo_numbers(results, ["erm"], {"erm": "ERM"}, structure=out)
    entry = numbers["structure"]
    assert entry["report"] == out.with_suffix(".md").as_posix() and entry["stats"]["images"] == 10
    assert entry["reference"]["images"] == 1142  # VOC-MLT's, kept in the file: the block renders from it alone
    text = render(json.loads(json.dumps(numbers)))
    assert "| labels per image | 1.50 | 2.05 | ± 0.3 | **outside** |" in text
    record = json.loads(out.read_text())
    out.write_text(json.dumps({**record, "dataset": "voc"}))
    with pytest.raises(NoisyMLTError, match="structure_toy.json: the structure of dataset 'voc', the results are 'toy'"):
        demo_numbers(results, ["erm"], {"erm": "ERM"}, structure=out)


def test_demo_numbers_are_the_mean_and_t_interval_over_seeds(tmp_path):
    from fakes import fake_run

    from noisymlt.report.aggregate import aggregate

    files = []
    for seed, v in enumerate((0.50, 0.52, 0.54)):
        files.append(fake_run(tmp_path, "erm", 0.5, seed, [v]))
        files.append(fake_run(tmp_path, "erm", 0.9, seed, [v - 0.3]))
        files.append(fake_run(tmp_path, "ours", 0.5, seed, [v + 0.1, 0.2, 0.3], heads=("ensemble", "random", "balanced")))
    numbers = demo_numbers(aggregate(files), ["erm", "ours", "absent"], {"erm": "ERM", "ours": "Ours"})
    rows = {(r["method"], r["gamma"], r["group"]): r for r in numbers["rows"]}
    # 50, 52, 54: mean 52, half-width t(0.975, 2) * 2 / sqrt(3) = 4.303 * 1.1547 = 4.97
    assert rows[("erm", 0.5, "total")] == {"method": "erm", "label": "ERM", "gamma": 0.5, "group": "total",
                                          "mean": 52.0, "ci95": 4.97, "seeds": 3}
    assert rows[("ours", 0.5, "total")]["mean"] == 62.0  # the ensemble, not a branch
    assert ("ours", 0.5, "head") in rows and ("erm", 0.9, "head") not in rows  # groups at the middle rate only
    assert numbers["middle_gamma"] == 0.5
    text = render(numbers)
    assert "| ERM | 52.00 ± 4.97 | 22.00 ± 4.97 |" in text and "| Ours | 62.00 ± 4.97 | -- |" in text


def test_the_readme_shows_every_number_as_the_table_does(tmp_path):
    """One rounding for both (the README once showed one decimal of numbers already rounded to two, which the
    table shows with two): the same digits for every mean and CI."""
    import re

    from fakes import fake_run

    from noisymlt.report.aggregate import aggregate
    from noisymlt.report.tables import write_table

    files = []
    for seed, v in enumerate((0.40123, 0.45377, 0.38555)):
        for g in (0.5, 0.9):
            files.append(fake_run(tmp_path, "erm", g, seed, [v - g / 10]))
            files.append(fake_run(tmp_path, "ldam", g, seed, [v * 0.8 + seed / 37]))
    results = aggregate(files)
    write_table(results, tmp_path / "table_total.tex", {"erm": "ERM", "ldam": "LDAM"})
    table = (tmp_path / "table_total.md").read_text()
    block = render(demo_numbers(results, ["erm", "ldam"], {"erm": "ERM", "ldam": "LDAM"}))
    for label in ("ERM", "LDAM"):
        ours = next(line for line in block.splitlines() if line.startswith(f"| {label} |"))
        theirs = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
        shown = re.findall(r"\d+\.\d+ ± \d+\.\d+", ours)
        assert len(shown) == 2 and shown == re.findall(r"\d+\.\d+ ± \d+\.\d+", theirs), (ours, theirs)


def test_readme_markers_are_required(tmp_path):
    with pytest.raises(NoisyMLTError, match="README.md: expected one pair of demo-numbers marker lines"):
        replace_block("no markers here", "x", "README.md")
    assert replace_block(f"a\n{START}\nold\n{END}\nb", "new", "R") == f"a\n{START}\nnew\n{END}\nb"


@pytest.mark.slow
def test_demo_sentinel_runs_still_give_the_committed_numbers_on_any_cpu(tmp_path, demo_pretrained):
    """Retrain, through the demo profile, the single runs docs/demo_numbers.json records (ERM, DB-Focal and Ours,
    first seed, middle noise rate). On the numerics fingerprint that made the README's numbers (or one of
    docs/numerics_readings.json) each must give its recorded total mAP exactly; on another CPU type it must land
    inside its 95% prediction interval of one run (noisymlt.report.sentinels)."""
    from helpers import copy_build, snakemake

    from noisymlt.report.sentinels import check, read_readings

    sentinels = json.loads((REPO / "docs" / "demo_numbers.json").read_text())["sentinels"]
    readings = read_readings(REPO / "docs" / "numerics_readings.json")
    assert {key.split("/")[0] for key in sentinels["runs"]} == {"erm", "db_focal", "ours"}
    wf = copy_build(demo_pretrained, tmp_path / "wf")  # the demo's backbone made (conftest): its data and runs here
    runs = {key: "runs/toy/g{1}/s{2}/{0}".format(*key.split("/")) for key in sentinels["runs"]}
    snakemake(wf, "--profile", "workflow/profiles/demo", *(f"{r}/metrics.json" for r in runs.values()), timeout=2400)
    verdicts = []
    for key, run in runs.items():
        heads = json.loads((wf / run / "metrics.json").read_text())["heads"]
        manifest = json.loads((wf / run / "manifest.json").read_text())
        got = {"map": heads["ensemble" if "ensemble" in heads else "main"]["map"]["total"],
               "selected": (manifest["run"].get("selected") or {}).get("values"), "numerics": manifest["numerics"]}
        verdicts.append(check(key, got, sentinels, readings))
    print("\n".join(f"{mode}: {message}" for mode, _, message in verdicts))
    assert all(ok for _, ok, _ in verdicts), [message for _, ok, message in verdicts if not ok]


def test_the_selection_paragraph_names_its_sets_and_says_when_scores_are_means():
    from noisymlt.report.readme import render_selection

    stage = {"keys": ["alpha", "beta"], "winner": "alpha0.7_beta0.2",
             "scores": {"alpha0.8_beta0.1": 32.111, "alpha0.7_beta0.2": 32.504}}
    row = {"label": "Ours", "held_out": 0.2, "chosen": {"beta": 0.2, "lr": 0.02, "alpha": 0.7}, "stages": [stage],
           "sets": [{"gamma": 0.5, "seed": 0}, {"gamma": 0.5, "seed": 1}]}
    two = render_selection([row])[1]
    assert "80% of the noisy training set at γ 0.5 seeds 0 and 1," in two
    assert "held-out 20% of its noisy labels (the mean over the 2 sets);" in two
    assert "chose lr 0.02, α 0.7, β 0.2." in two and "**α 0.7 β 0.2: 32.50**" in two and "α 0.8 β 0.1: 32.11," in two
    one = render_selection([{**row, "sets": row["sets"][:1]}])[1]
    assert "at γ 0.5 seed 0, ranked" in one and "mean over" not in one


def test_a_near_tie_in_selection_is_said_with_the_rule_that_broke_it():
    from noisymlt.report.readme import render_selection

    stage = {"keys": ["alpha", "beta"], "winner": "alpha0.7_beta0.1", "tie_margin": 1.2,
             "tied": ["alpha0.8_beta0.1", "alpha0.7_beta0.1"],
             "scores": {"alpha0.8_beta0.1": 32.86, "alpha0.7_beta0.1": 32.86, "alpha0.9_beta0.4": 29.0}}
    row = {"label": "Ours", "held_out": 0.2, "chosen": {"lr": 0.02, "alpha": 0.7, "beta": 0.1}, "stages": [stage],
           "sets": [{"gamma": 0.5, "seed": 0}]}
    text = render_selection([row])[1]
    assert "**α 0.7 β 0.1: 32.86**" in text
    assert ("α 0.9 β 0.4: 29.00 (2 within the tie margin of 1.2 points, closer than the selection can resolve: "
            "α 0.8 β 0.1, α 0.7 β 0.1; chosen by the stated rule") in text
    alone = {**stage, "tied": ["alpha0.7_beta0.1"]}
    assert "tie margin" not in render_selection([{**row, "stages": [alone]}])[1]
