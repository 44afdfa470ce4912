from forkserve.store.command import main

raise SystemExit(main())
