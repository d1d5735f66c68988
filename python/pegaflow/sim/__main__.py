import sys

from pegaflow.sim.cli import main

sys.exit(main())
