# Sourced by scripts/demo, scripts/check and scripts/docs: create .venv (Python 3.11 or 3.12, which
# vineyard 0.24.2 has wheels for) and install dvml with the given extras into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${DVML_PYTHON:-}"
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 12)))'; then
      PYTHON="$candidate"; break
    fi
  done
fi
if [ -z "$PYTHON" ]; then
  echo "dvml needs Python 3.11 or 3.12 (vineyard 0.24.2 has wheels up to 3.12); set DVML_PYTHON." >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
source scripts/_install.sh
if [ -n "${DVML_EXTRAS:-}" ]; then
  venv_install .venv -e ".[${DVML_EXTRAS}]"
else
  venv_install .venv -e .
fi
# An editable install leaves dvml's bytecode to the first import, and where
# PYTHONDONTWRITEBYTECODE is set (as on our CI machines) no process ever writes it: every Dask
# worker and trainer would compile dvml's modules again (~0.25 s of CPU each). Compile it
# once, as pip does for an installed wheel; a changed file is still compiled afresh.
.venv/bin/python -m compileall -q -j 0 dvml >/dev/null
export PATH="$ROOT/.venv/bin:$PATH"
