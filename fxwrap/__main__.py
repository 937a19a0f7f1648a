import sys

from fxwrap.cli import main

sys.exit(main())
