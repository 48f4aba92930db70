#!/usr/bin/env bash
# The whole test suite, from a fresh machine: system packages, the Python install (the
# real wheel, not an editable one), then pytest.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/install_packages.sh

python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore ".[test]"
exec python3 -m pytest -q -p no:cacheprovider "$@"
