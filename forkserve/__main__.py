from forkserve.cli import main

raise SystemExit(main())
