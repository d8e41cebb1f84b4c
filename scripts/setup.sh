#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian or Ubuntu machine, into the current Python:
# bubblewrap (the sandbox's namespaces; apt, when root or with sudo), then this package.
#   bash scripts/setup.sh          the package
#   bash scripts/setup.sh test     the package with the test and lint tools
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}

if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap (apt-get)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap (sudo apt-get)"
    sudo apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "setup: WARNING: bubblewrap is missing and cannot be installed here;" \
         "sandboxes will run without namespaces (see sandbox/__init__.py)" >&2
  fi
fi

extras=""
case "${1:-}" in
  "") ;;
  test) extras="[test]" ;;
  *) echo "setup: unknown argument '$1' (expected nothing or 'test')" >&2; exit 2 ;;
esac
echo "setup: installing the project${extras} into $($PYTHON -c 'import sys; print(sys.prefix)')"
$PYTHON -m pip install -q --disable-pip-version-check -e ".${extras}"
