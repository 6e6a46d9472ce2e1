import sys
from pathlib import Path

# The e2e helpers live beside the tests (tests/stack.py).
sys.path.insert(0, str(Path(__file__).parent))
