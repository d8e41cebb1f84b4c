#!/usr/bin/env bash
# Creates the AppWorld virtualenv: the real AppWorld engine (PyPI appworld==0.1.3.post1) in a
# Python of its own, because it pins pydantic<2 and an old FastAPI/httpx stack that cannot live
# beside ours. The trainer never imports appworld; it starts engine processes from this venv
# (tasks/appworld/). Then `appworld install` unpacks the apps bundled in the wheel (offline).
#   bash scripts/setup_appworld.sh              creates or checks .venv-appworld/ (idempotent)
#   APPWORLD_VENV=/path bash scripts/setup_appworld.sh    somewhere else (then export it too)
# The official task data is separate: `appworld download data` (see docs/suites.md, "The
# AppWorld benchmark"); the tests build a small data root of their own at test time.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${APPWORLD_VENV:-.venv-appworld}
BASE_PYTHON=${APPWORLD_PYTHON:-${PYTHON:-python3}}
VERSION=0.1.3.post1
CONSTRAINTS=tasks/appworld/constraints.txt  # the versions the tests were run with

# One probe for "done" (no appworld import, which takes seconds): the pinned version is
# installed and its apps are unpacked. tasks/appworld/venv.py checks the same at run time.
probe='import importlib.metadata as m, importlib.util as u, pathlib, sys
apps = pathlib.Path(u.find_spec("appworld").origin).parent / "apps" / "phone" / "apis.py"
sys.exit(0 if m.version("appworld") == sys.argv[1] and apps.is_file() else 1)'
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$probe" "$VERSION" >/dev/null 2>&1; then
  echo "setup_appworld: appworld $VERSION is ready in $VENV"
  exit 0
fi

if ! "$BASE_PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  echo "setup_appworld: AppWorld needs Python >= 3.11; '$BASE_PYTHON' is not one" \
       "(set APPWORLD_PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
echo "setup_appworld: creating $VENV with appworld $VERSION (about 230 MB)"
"$BASE_PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$CONSTRAINTS" "appworld==$VERSION" \
  2>&1 | sed '/is ignored: it is neither a file nor a directory/d'  # noise from a local index
# Unpacks the encrypted apps bundle shipped inside the wheel into the package (no network),
# and the package's own tests into $APPWORLD_CACHE (kept inside the venv, not in ~/.appworld).
APPWORLD_CACHE="$VENV/appworld-cache" "$VENV/bin/appworld" install >/dev/null
# Engines see the venv read-only: compile the unpacked apps once, or each start recompiles them.
"$VENV/bin/python" -m compileall -q "$("$VENV/bin/python" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("appworld").origin))')" >/dev/null
"$VENV/bin/python" -c "$probe" "$VERSION" || {
  echo "setup_appworld: appworld installed but its apps are missing; run $VENV/bin/appworld install" >&2
  exit 1
}
echo "setup_appworld: ready: $VENV (export APPWORLD_VENV=$(cd "$VENV" && pwd) when it is not the default)"
