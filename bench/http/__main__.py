from bench.http.cli import main

raise SystemExit(main())
