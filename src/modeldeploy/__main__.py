import sys

from modeldeploy.cli import main

sys.exit(main())
