#!/usr/bin/env bash
# The whole test suite, from a fresh machine: ./install.sh --test installs the Debian
# packages the tests need and kprobefs itself (the real wheel, not an editable install)
# into its virtual environment, with the test extra; that environment's Python runs
# pytest.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

./install.sh --test
exec "$(./install.sh --venv-path)/bin/python" -m pytest -q -p no:cacheprovider "$@"
