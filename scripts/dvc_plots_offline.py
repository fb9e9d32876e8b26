#!/usr/bin/env python
"""`dvc plots show` that renders with no network, and a check of it in headless Chromium.

DVC's plots page loads vega, vega-lite and vega-embed from a CDN, so offline every vega plot stays blank.
This script fetches once the npm packages of the versions DVC's page names (sha256-checked; through
download.mirror like every other download, or from a folder holding the .tgz files), writes an HTML template
with the three scripts inline (DVC's --html-template), and runs `dvc plots show` with it: the page then works
offline and can be copied anywhere.

    python scripts/dvc_plots_offline.py                      # dvc_plots/index.html, self-contained
    python scripts/dvc_plots_offline.py --check              # and check in headless Chromium, network off,
                                                             # that every vega plot drew (exit 1 if one did not)
    python scripts/dvc_plots_offline.py --packages DIR       # vega*.tgz from DIR instead of the npm registry

The template is kept at data/assets/vega/plots_template.html, for `dvc plots show/diff --html-template`.
"""

from __future__ import annotations

import argparse
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# the versions dvc_render's page loads (dvc_render/vega.py), as npm publishes them
PACKAGES = {
    "vega": ("5.20.2", "d77deab01d6104b1239228720721f93003e60797d2faced7ffdd759fa70f989d", "package/build/vega.min.js"),
    "vega-lite": ("5.2.0", "f64ca4745f043447ac86b67dc9e9592ec2b85ac8b8dafc35faf970f142463e4b",
                  "package/build/vega-lite.min.js"),
    "vega-embed": ("6.18.2", "93aeee312e92077b0252ef026c0fe0ec8fa430c19825aeada6cd3a6804e68e1b",
                   "package/build/vega-embed.min.js"),
}
REGISTRY = "https://registry.npmjs.org"
ASSETS = Path("data/assets/vega")

TEMPLATE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    <title>DVC plots (offline)</title>
    {inline}
    <style>table {{ border-spacing: 15px; }}</style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def package_file(name: str, folder: Path | None) -> Path:
    """The package's .tgz: from FOLDER, or fetched once into data/assets/vega (sha256-checked either way)."""
    from noisymlt.data.download import fetch, file_digests
    from noisymlt.errors import NoisyMLTError

    version, sha256, _ = PACKAGES[name]
    tgz = f"{name}-{version}.tgz"
    if folder is not None:
        path = folder / tgz
        if file_digests(path)["sha256"] != sha256:
            raise NoisyMLTError(f"{path}: sha256 is not {sha256} ({name} {version} as npm publishes it)")
        return path
    return Path(fetch(f"{REGISTRY}/{name}/-/{tgz}", ASSETS / tgz, sha256=sha256, progress=False))


def write_template(folder: Path | None) -> Path:
    scripts = []
    for name, (_, _, member) in PACKAGES.items():
        with tarfile.open(package_file(name, folder)) as tar:
            code = tar.extractfile(member).read().decode()
        code = code.replace("</script", "<\\/script")  # inline: no early end of the script element
        scripts.append(f"<script>/* {name} */\n{code}\n</script>")
    out = ASSETS / "plots_template.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(TEMPLATE.format(inline="\n".join(scripts)))
    return out


def check(page: Path) -> tuple[int, int]:
    """(vega plots on the page, plots that drew) in headless Chromium with every network request refused."""
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        raise SystemExit("no chromium on PATH (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
             "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # no network
             "--virtual-time-budget=20000", "--dump-dom", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=300).stdout
    plots = len(re.findall(r"vegaEmbed\(", page.read_text()))
    drawn = len(re.findall(r'<canvas[^>]*class="marks"|<svg[^>]*class="marks"', dom))
    return plots, drawn


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--packages", type=Path, help="folder holding vega-5.20.2.tgz, vega-lite-5.2.0.tgz, "
                                                  "vega-embed-6.18.2.tgz (default: fetch from the npm registry)")
    ap.add_argument("--out", default="dvc_plots", help="folder of the page (default: dvc_plots)")
    ap.add_argument("--check", action="store_true", help="check in headless Chromium that every plot drew")
    args = ap.parse_args()
    template = write_template(args.packages)
    subprocess.run(["dvc", "plots", "show", "--html-template", str(template), "-o", args.out], check=True)
    page = Path(args.out) / "index.html"
    if "cdn.jsdelivr" in page.read_text():
        raise SystemExit(f"{page} still loads scripts from a CDN")
    print(f"{page}: no script from the network")
    if args.check:
        plots, drawn = check(page)
        print(f"headless Chromium, network off: {drawn} of {plots} vega plots drew")
        return 0 if plots and drawn >= plots else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
