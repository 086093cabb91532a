import sys

from tritongemm.cli import main

sys.exit(main())  # python -m tritongemm.cli, as python -m tritongemm
