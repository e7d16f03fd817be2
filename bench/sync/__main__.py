from bench.sync.cli import main

raise SystemExit(main())
