"""`noisymlt` (the console script) and `python -m noisymlt`."""

import os
import sys


def entry() -> int:
    """A preload server (noisymlt.pipeline.preload) runs the command when the environment names one; else, or when
    it cannot, this process does. (The server's children call ``cli.main`` itself, so a command never goes
    round to the server twice.)"""
    try:
        # noisymlt.pipeline.preload.ENV, spelled out: importing that module costs ~40 ms a command when there is no server
        if os.environ.get("NOISYMLT_PRELOAD") and sys.argv[1:2] != ["preload"]:
            from noisymlt.pipeline.preload import run_via_server

            code = run_via_server(sys.argv[1:])
            if code is not None:
                return code
        from noisymlt.cli import main

        return main()
    except KeyboardInterrupt:  # Ctrl-C while waiting for the server's child or while importing: no traceback
        print(f"{' '.join(['noisymlt', *sys.argv[1:2]])}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(entry())
