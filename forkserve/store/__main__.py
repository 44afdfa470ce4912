from forkserve.store import main

raise SystemExit(main())
