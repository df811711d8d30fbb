from .acquire_release import main

raise SystemExit(main())
