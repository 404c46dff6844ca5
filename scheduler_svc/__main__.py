from scheduler_svc.cli import main

raise SystemExit(main())
