import sys

from conspo.cli import main

sys.exit(main())
