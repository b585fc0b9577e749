# Sourced by the other scripts: creates .venv and installs the project and
# its test dependencies when they are missing or pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.bookstream-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -e "$ROOT[test]"
  touch "$STAMP"
fi
# TLC (model checking the spec in tla/) needs a Java runtime.
if ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bootstrap: installing a Java runtime for TLC" >&2
    apt-get update -qq >/dev/null && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
  else
    echo "bootstrap: no java on PATH; the TLA+ tests will fail (install a JRE >= 11)" >&2
  fi
fi
export PATH="$VENV/bin:$PATH"
