from noisymlt.cli import entry

raise SystemExit(entry())
