import sys

from s4kv.bench.cli import main

sys.exit(main())
