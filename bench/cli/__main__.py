from bench.cli.run import main

raise SystemExit(main())
