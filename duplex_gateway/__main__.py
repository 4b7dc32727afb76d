import sys

from duplex_gateway.cli import main

sys.exit(main())
