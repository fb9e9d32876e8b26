"""`snakemake --lint`, less the one lint this workflow answers on purpose.

Snakemake's linter asks every rule for a conda environment or a container. This workflow offers neither: jobs run
the Python that runs Snakemake, the project's venv (docs/slurm.md, "How jobs find their Python"), and Snakemake
cannot be told to skip one lint. So that lint is left out here; any other, of a rule or of a Snakefile, is printed
and fails (exit 1).

    .venv/bin/python scripts/lint_workflow.py        # from the project root; `make lint`
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

NOT_OFFERED = "Specify a conda environment or container for each rule."


def lints(cwd: Path | str = ".") -> list[tuple[str, str]]:
    """(what, title) of every lint `snakemake --lint` prints for the workflow in CWD (Snakemake 9's `--lint json`
    prints text)."""
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    found, what = [], None
    for line in out.splitlines():
        if m := re.match(r"Lints for (.*):$", line):
            what = m.group(1)
        elif what and (m := re.match(r"    \* (.*):$", line)):
            found.append((what, m.group(1)))
    if proc.returncode and not found:  # it stopped before linting: a syntax error, a bad setting
        raise SystemExit(f"snakemake --lint failed:\n{out[-3000:]}")
    return found


def main() -> int:
    found = lints()
    others = [f"{what}: {title}" for what, title in found if title != NOT_OFFERED]
    print("\n".join(others) if others else
          f"no lints ({sum(title == NOT_OFFERED for _, title in found)} rules without a conda environment or "
          "container, on purpose: docs/slurm.md)")
    return 1 if others else 0


if __name__ == "__main__":
    sys.exit(main())
