from kvspec.checks.cli.main import main

raise SystemExit(main())
