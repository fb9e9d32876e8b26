from noisymlt.cli import main

raise SystemExit(main())
