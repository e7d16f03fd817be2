from bench.tftp.cli import main

raise SystemExit(main())
