import sys

from tritongemm.cli import main

sys.exit(main())
