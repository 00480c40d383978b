# Sourced by the set-up commands: create or reuse the virtual environment in .venv and install
# the package (editable) with its test extra, pinned by constraints.txt. Reinstalls only when
# pyproject.toml or constraints.txt changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp_value="$(cat "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -c1-16)"
stamp_file="$venv/.lightning-bandlimit-installed"
if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating virtual environment in $venv" >&2
    python3 -m venv "$venv"
fi
if [ "$(cat "$stamp_file" 2>/dev/null)" != "$stamp_value" ]; then
    echo "[setup] installing lightning-bandlimit and pinned dependencies (first run: a few minutes)" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -c "$root/constraints.txt" -e "$root[test]"
    echo "$stamp_value" > "$stamp_file"
fi
export PATH="$venv/bin:$PATH"
cd "$root"
