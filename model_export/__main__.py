import sys

from model_export.cli import main

sys.exit(main())
