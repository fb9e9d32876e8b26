"""What a job's code digest covers (noisymlt.core.codedeps): the code that can change its result, and no more."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from noisymlt.losses import LOSSES
from noisymlt.methods.options import losses_used
from noisymlt.core import codedeps
from noisymlt.config import load_params
from noisymlt.methods.options import method_options
from noisymlt.pipeline.step_code import method_entries

REPO = Path(__file__).resolve().parents[1]
# Infrastructure that cannot change a result: the CLI, its command table and its dispatch, the preload server (its
# runs equal plain runs byte for byte: test_preload), the `train` command (it only reads the configuration, hashed
# into the run id) and the card it chooses, the per-step digests and `trace`.
NEVER_IN_A_RUN = {"noisymlt.__main__", "noisymlt.cli", "noisymlt.commands", "noisymlt.pipeline.preload",
                  "noisymlt.pipeline.train", "noisymlt.training.cards", "noisymlt.pipeline.step_code",
                  "noisymlt.pipeline.trace", "noisymlt.pipeline.selection", "noisymlt.config"}
ERM = ["noisymlt", "noisymlt.core", "noisymlt.core.codedeps", "noisymlt.core.files", "noisymlt.core.jsonlog",
       "noisymlt.core.locks", "noisymlt.core.manifest", "noisymlt.core.registry", "noisymlt.core.schema",
       "noisymlt.data", "noisymlt.data.assets", "noisymlt.data.imagecache", "noisymlt.data.images",
       "noisymlt.data.labels", "noisymlt.data.sampling", "noisymlt.errors", "noisymlt.evaluation",
       "noisymlt.evaluation.label_scores",
       "noisymlt.evaluation.metrics", "noisymlt.losses", "noisymlt.losses.base", "noisymlt.losses.bce",
       "noisymlt.methods", "noisymlt.methods.base", "noisymlt.methods.options", "noisymlt.methods.single",
       "noisymlt.models", "noisymlt.models.backbones", "noisymlt.models.branch", "noisymlt.models.choices",
       "noisymlt.models.heads", "noisymlt.training", "noisymlt.training.augment", "noisymlt.training.checkpoint",
       "noisymlt.training.device_images", "noisymlt.training.devices", "noisymlt.training.fit_diagnostics",
       "noisymlt.training.inputs", "noisymlt.training.loaders", "noisymlt.training.noise_monitor",
       "noisymlt.training.numerics", "noisymlt.training.probe", "noisymlt.training.run_outputs",
       "noisymlt.training.schedule", "noisymlt.training.speed", "noisymlt.training.trainer",
       "noisymlt.training.transforms", "noisymlt.training.trunkcache"]


@pytest.fixture(scope="module")
def params():
    return load_params(REPO / "params.yaml", REPO / "workflow" / "profiles" / "demo" / "params.yaml")


def test_erm_runs_its_trainer_family_and_bce_only(params):
    assert codedeps.closure(*method_entries(params, "erm")) == ERM
    # the manual says how many modules that is
    stated = re.search(r"`noisymlt code-deps --method erm`\s+lists ERM's (\d+) modules",
                       (REPO / "docs" / "reruns.md").read_text())
    assert stated and int(stated.group(1)) == len(ERM)


def test_each_methods_train_job_holds_its_own_code_and_no_infrastructure(params):
    """A run's closure: no infrastructure; the pseudo-label rule only where the family uses it; a loss only
    where the method trains with it."""
    for method in params["methods"]:
        modules = set(codedeps.closure(*method_entries(params, method)))
        assert not modules & NEVER_IN_A_RUN, (method, sorted(modules & NEVER_IN_A_RUN))
        family = params["methods"][method]["family"]
        assert ("noisymlt.methods.pseudo_labels" in modules) == (family == "colearning"), method
        used = {LOSSES[name] for name in losses_used(family, method_options(params["methods"][method]))}
        assert {m for m in modules if m.startswith("noisymlt.losses.") and m != "noisymlt.losses.base"} == used, method


def test_comments_docstrings_and_layout_do_not_count_and_code_does(tmp_path):
    source = codedeps.modules()["noisymlt.losses.db"].read_text()
    original = tmp_path / "original.py"
    original.write_text(source)
    reworded = tmp_path / "reworded.py"
    reworded.write_text(source.replace('"""', '"""Reworded. ', 1).replace("\n\n\n", "\n\n\n# a comment\n", 1)
                        .replace("bias = self.kappa", "bias = (self.kappa)"))  # the same value, other layout
    edited = tmp_path / "edited.py"
    edited.write_text(source.replace("bias = self.kappa", "bias = 3 * self.kappa"))
    assert codedeps.code_text(reworded) == codedeps.code_text(original) != codedeps.code_text(edited)
    data = tmp_path / "schema.yaml"  # a data file counts byte for byte
    data.write_text("a: 1\n")
    before = codedeps.code_text(data)
    data.write_text("a: 1  # note\n")
    assert codedeps.code_text(data) != before


def _read_afresh(monkeypatch, folder: Path) -> dict:
    """Every module's code text, imports and data files, read by a process with ``folder`` as the kept facts."""
    monkeypatch.setattr(codedeps, "FACTS_DIR", folder)
    for cached in (codedeps._facts_of, codedeps._facts, codedeps._code_text, codedeps.imports_of,
                   codedeps.data_files):
        cached.cache_clear()
    return {name: (codedeps.code_text(path), codedeps.imports_of(name), codedeps.data_files(name))
            for name, path in codedeps.modules().items()}


def test_kept_facts_read_as_the_files_do_and_a_bad_or_missing_entry_is_read_again(tmp_path, monkeypatch):
    """The facts kept beside the bytecode (one compressed marshal file per file content) give what the files give:
    read without them, from them, from a folder with a corrupt entry, and from a folder that cannot be made."""
    import marshal
    import zlib

    (tmp_path / "none").write_text("a file where the folder would be: nothing can be kept")
    unkept = _read_afresh(monkeypatch, tmp_path / "none")
    assert (tmp_path / "none").is_file()
    first = _read_afresh(monkeypatch, tmp_path / "kept")  # writes them
    entries = sorted((tmp_path / "kept").iterdir())
    sources = {codedeps.hashlib.sha256(path.read_bytes()).hexdigest() for path in codedeps.modules().values()}
    assert {p.name.split("-")[0] for p in entries} == sources and all(p.suffix == ".facts" for p in entries)
    assert first == unkept
    # the kept facts are the ones read: an entry altered on disk changes what is read from it ...
    db = codedeps.modules()["noisymlt.losses.db"]
    entry = next(p for p in entries if p.name.startswith(codedeps.hashlib.sha256(db.read_bytes()).hexdigest()))
    facts = marshal.loads(zlib.decompress(entry.read_bytes()))
    entry.write_bytes(zlib.compress(marshal.dumps({**facts, "code": facts["code"] + "x"})))
    assert _read_afresh(monkeypatch, tmp_path / "kept")["noisymlt.losses.db"][0] != unkept["noisymlt.losses.db"][0]
    # ... and a corrupt one (cut short, or not the facts) is read from the file again, and replaced
    for corrupt in (entry.read_bytes()[:100], zlib.compress(marshal.dumps(["not", "the", "facts"]))):
        entry.write_bytes(corrupt)
        assert _read_afresh(monkeypatch, tmp_path / "kept") == unkept
        assert marshal.loads(zlib.decompress(entry.read_bytes())) == facts
    assert not list((tmp_path / "kept").glob("*.tmp"))
    monkeypatch.undo()  # the process's caches back to the package's own folder
    _read_afresh(monkeypatch, codedeps.FACTS_DIR)


def test_a_step_whose_source_changed_while_it_ran_fails_instead_of_recording(monkeypatch, capsys):
    """Every command loads its code when it starts; if the source on disk gives another digest when it ends,
    it fails (Snakemake deletes a failed job's outputs, DVC does not record them)."""
    from noisymlt.cli import main

    assert main(["code-deps", "--command", "evaluate"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(codedeps, "fresh_digest", lambda *entries: "5555555555555555")
    assert main(["code-deps", "--command", "evaluate"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("noisymlt code-deps: error: noisymlt code-deps: the package source changed while this job "
                          "ran (it ran code ") and "the files on disk now give 5555555555555555" in err


def test_a_preloaded_job_refuses_code_edited_since_the_server_imported_it(monkeypatch):
    """In a job forked by the preload server the modules were imported before the job read its digest: once it
    has, the server's check must find the source as it was imported, or the job stops."""
    import types

    from noisymlt.errors import NoisyMLTError
    from noisymlt.pipeline import preload

    server = types.SimpleNamespace(fingerprint=preload.source_fingerprint())
    monkeypatch.setattr(codedeps, "loaded_check", lambda: preload.Server._check_source(server))
    assert codedeps.load_code("noisymlt.losses.db") == codedeps.digest("noisymlt.losses.db")  # unchanged: runs
    server.fingerprint = {**server.fingerprint, "losses/db.py": [0, 0]}  # as imported before an edit
    with pytest.raises(NoisyMLTError, match="source changed since the preload server imported it"):
        codedeps.load_code("noisymlt.losses.db")
