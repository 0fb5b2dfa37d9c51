# Sourced by scripts/demo and scripts/test: make .venv with tooljail installed.
# Usage: setup_venv EXTRAS   (e.g. "daemon" or "daemon,test,gen")
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TOOLJAIL_VENV:-$ROOT/.venv}"

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "error: need root to run: $*" >&2; return 1; fi
}

# apt_install PKG...: install Debian packages that are missing (apt-get update once).
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if ! command -v apt-get >/dev/null; then
        echo "error: please install: ${missing[*]}" >&2; return 1
    fi
    echo "installing system packages: ${missing[*]}" >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

setup_venv() {
    local extras="$1" python="${PYTHON:-python3}"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "error: tooljail needs Python 3.11+ ($python is $("$python" -V 2>&1))" >&2
        return 1
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        # Debian's python3 has no venv/ensurepip until python3-venv is installed.
        if ! "$python" -m venv "$VENV" >/dev/null 2>&1; then
            rm -rf "$VENV"
            local ver
            ver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            apt_install "python${ver}-venv" || apt_install python3-venv
            "$python" -m venv "$VENV"
        fi
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[$extras]"
}
