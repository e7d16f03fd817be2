from bench.netboot.cli import main

raise SystemExit(main())
