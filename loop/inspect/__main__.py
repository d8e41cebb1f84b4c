"""`python -m loop.inspect ...`: see `loop.inspect.cli`."""

from loop.inspect.cli import main

raise SystemExit(main())
