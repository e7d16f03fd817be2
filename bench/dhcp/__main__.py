from bench.dhcp.cli import main

raise SystemExit(main())
