import sys

from gpucap.arbiter.cli import main

sys.exit(main())
