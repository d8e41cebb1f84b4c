"""Where the AppWorld engine's Python lives, and whether it is usable.

AppWorld pins pydantic<2 and an old FastAPI/httpx stack, so it lives in a virtualenv of its own
(`bash scripts/setup_appworld.sh` makes `.venv-appworld/`; `APPWORLD_VENV` points elsewhere).
Nothing here imports `appworld`: the checks run the venv's Python or read its files.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from tasks.core import SuiteSetupError

APPWORLD_VERSION = "0.1.3.post1"
SETUP_COMMAND = "bash scripts/setup_appworld.sh"
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-appworld"
ENGINE_SIDE = Path(__file__).resolve().parent / "engine_side"


class AppWorldSetupError(SuiteSetupError):
    """The AppWorld suite cannot run here; the one-line message names what is missing and how
    to fix it."""


def venv_python(venv: str | Path | None = None) -> Path:
    """The AppWorld venv's interpreter: `venv`, else $APPWORLD_VENV, else .venv-appworld/."""
    chosen = venv or os.environ.get("APPWORLD_VENV") or DEFAULT_VENV
    python = Path(chosen).expanduser().absolute() / "bin" / "python"
    if not python.exists():
        raise AppWorldSetupError(
            f"the AppWorld virtualenv is missing ({python} does not exist): create it with "
            f"`{SETUP_COMMAND}`, or set APPWORLD_VENV to an existing one"
        )
    return python


_PROBE = """
import importlib.metadata as m, importlib.util as u, pathlib, sys
try:
    version = m.version("appworld")
except m.PackageNotFoundError:
    sys.exit("appworld is not installed")
spec = u.find_spec("appworld")
apps = pathlib.Path(spec.origin).parent / "apps" / "phone" / "apis.py"
print(version, apps.is_file())
"""


@functools.cache
def check_package(python: Path) -> str:
    """The installed appworld version; raises AppWorldSetupError unless it is the pinned one
    with its apps unpacked (`appworld install`). Reads metadata only: no appworld import."""
    venv = python.parent.parent
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _PROBE], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AppWorldSetupError(
            f"cannot run {python} ({exc}); re-create it: {SETUP_COMMAND}"
        ) from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise AppWorldSetupError(
            f"the AppWorld virtualenv {venv} is not usable ({why}): run `{SETUP_COMMAND}`"
        )
    version, unpacked = done.stdout.split()
    if version != APPWORLD_VERSION:
        raise AppWorldSetupError(
            f"{venv} has appworld {version}, this suite is tested with {APPWORLD_VERSION}: "
            f"delete {venv} and run `{SETUP_COMMAND}`"
        )
    if unpacked != "True":
        raise AppWorldSetupError(
            f"appworld's apps are not unpacked in {venv}: run `{venv}/bin/appworld install` "
            f"(offline), or `{SETUP_COMMAND}`"
        )
    return version


def build_small_root(dest: str | Path, python: Path | None = None, timeout_s: float = 600) -> Path:
    """Build the small self-made data root under `dest` (tests, benchmarks, trying the suite
    without the official data; see engine_side/small_root.py). Returns `dest`.

    The result is derived from AppWorld's licensed app code: keep it out of version control."""
    python = python or venv_python()
    check_package(python)
    dest = Path(dest).absolute()
    dest.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(dest),
        "APPWORLD_ROOT": str(dest),
    }
    done = subprocess.run(
        [str(python), "-I", str(ENGINE_SIDE / "small_root.py"), str(dest)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=dest,
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise AppWorldSetupError(f"building the small AppWorld root in {dest} failed: {tail}")
    make_world_readable(dest)
    return dest


def make_world_readable(path: Path) -> None:
    """o+rX on `path` and below: engines run under a uid of their own and read the root."""
    for folder, _, files in os.walk(path):
        os.chmod(folder, os.stat(folder).st_mode | 0o755)
        for name in files:
            file = os.path.join(folder, name)
            if not os.path.islink(file):
                os.chmod(file, os.stat(file).st_mode | 0o444)
