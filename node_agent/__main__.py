from node_agent.cli import main

raise SystemExit(main())
