from bench.relay.cli import main

raise SystemExit(main())
