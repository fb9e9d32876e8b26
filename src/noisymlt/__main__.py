import os
import sys

# A preloaded server (noisymlt.preload) runs the command when the environment names one; else, or when
# it cannot, this process does.
code = None
if os.environ.get("NOISYMLT_PRELOAD") and sys.argv[1:2] != ["preload"]:
    from noisymlt.preload import run_via_server

    code = run_via_server(sys.argv[1:])
if code is None:
    from noisymlt.cli import main

    code = main()
raise SystemExit(code)
