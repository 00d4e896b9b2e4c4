import sys

from spiderflow.cli import main

sys.exit(main())
