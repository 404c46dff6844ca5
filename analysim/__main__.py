from analysim.cli import main

raise SystemExit(main())
