import sys

from emulator.console import main

sys.exit(main())
