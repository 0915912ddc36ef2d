import os
import sys

# Test helpers (paged_harness, ...) import as top-level modules.
sys.path.insert(0, os.path.dirname(__file__))
