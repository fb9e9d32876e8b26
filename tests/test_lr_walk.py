"""The learning rate's walk from the train rule's configuration to the optimizer stays short (issue 71):
experiments/lr_walk/walk.py traces a real run and counts the package functions the lr passes through."""

import json
import subprocess
import sys

from helpers import REPO, copy_build


def test_the_lr_reaches_the_optimizer_in_few_stops_and_no_layer_climbs(tmp_path, tiny_data_project):
    """Ours with the lr from a selection's choice file (the longer of the two routes the workflow takes): the trace
    finds the rule's resolution, the train command, the trainer and the optimizer on the walk, within the issue's
    25 stops and 5 climbs back up the layers."""
    project = copy_build(tiny_data_project, tmp_path / "project")
    out = tmp_path / "walk.json"
    done = subprocess.run([sys.executable, str(REPO / "experiments" / "lr_walk" / "walk.py"), "--project", str(project),
                           "--src", str(REPO / "src"), "--layer", "workflow/profiles/demo/params.yaml", "tiny.yaml",
                           "--method", "ours", "--gamma", "0.5", "--seed", "0", "--selected", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    walk = json.loads(out.read_text())["path"]
    functions = walk["functions"]
    for stop in ("noisymlt/config.py:_with_chosen", "noisymlt/pipeline/train.py:_cmd_train",
                 "noisymlt/training/trainer.py:Trainer.__init__", "noisymlt/training/schedule.py:build_optimizer",
                 "noisymlt/training/schedule.py:lr_at"):
        assert stop in functions, (stop, functions)
    assert functions.index("noisymlt/config.py:config_text") < functions.index("noisymlt/pipeline/train.py:_cmd_train")
    assert walk["stops"] <= 25 and walk["climbs"] <= 5, walk
