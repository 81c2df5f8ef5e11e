from kvspec.checks.cli import main

raise SystemExit(main())
