#!/usr/bin/env bash
# Installs kprobefs from this tree into a virtual environment of its own, puts the
# `kprobefs` command on PATH and its man page where man finds it.
#
#   ./install.sh               install (or update) kprobefs
#   ./install.sh --test        the same, with what the test suite needs (Debian
#                              packages and the `test` extra)
#   ./install.sh --uninstall   remove what an install made
#   ./install.sh --venv-path   print where the virtual environment is, and stop
#
# Why a virtual environment: Debian 12's python3 is "externally managed" (PEP 668), so
# `pip install` into it is refused, and it should be: pip would mix its files with
# apt's.  A virtual environment is Debian's own advice; it leaves the system Python
# alone and takes the exact versions kprobefs needs (unicorn 2.1.4; Debian 12 has 2.0).
#
# Where things go:
#                         as root                        as another user
#   environment           /opt/kprobefs                  ~/.local/share/kprobefs
#   the command           /usr/local/bin/kprobefs        ~/.local/bin/kprobefs
#   the man page          /usr/local/share/man/man8/     ~/.local/share/man/man8/
#   the systemd unit      (copied by hand, docs/usage.md) ~/.config/systemd/user/
# KPROBEFS_VENV, KPROBEFS_BINDIR, KPROBEFS_MANDIR and KPROBEFS_UNITDIR choose other
# places.  /usr/local is the local administrator's, as Debian policy has it; nothing is
# written under /usr otherwise.  A user's unit (systemd/kprobefs-user.service, run with
# systemctl --user) is installed, not enabled.
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(id -u)" -eq 0 ]; then
    venv=${KPROBEFS_VENV:-/opt/kprobefs}
    bindir=${KPROBEFS_BINDIR:-/usr/local/bin}
    mandir=${KPROBEFS_MANDIR:-/usr/local/share/man/man8}
else
    data=${XDG_DATA_HOME:-$HOME/.local/share}
    venv=${KPROBEFS_VENV:-$data/kprobefs}
    bindir=${KPROBEFS_BINDIR:-$HOME/.local/bin}
    mandir=${KPROBEFS_MANDIR:-$data/man/man8}
    unitdir=${KPROBEFS_UNITDIR:-${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user}
fi

mode=install
case "${1:-}" in
    "") ;;
    --test) mode=test ;;
    --uninstall) mode=uninstall ;;
    --venv-path) echo "$venv"; exit 0 ;;
    -h|--help) sed -n '2,25s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac

if [ "$mode" = uninstall ]; then
    [ "$(readlink -f "$bindir/kprobefs" 2>/dev/null)" = "$(readlink -f "$venv/bin/kprobefs" 2>/dev/null)" ] \
        && rm -f "$bindir/kprobefs"
    rm -f "$mandir/kprobefs.8"
    rm -rf "$venv"
    unit=""
    if [ -n "${unitdir:-}" ] && [ -f "$unitdir/kprobefs.service" ]; then
        rm -f "$unitdir/kprobefs.service"
        unit=", $unitdir/kprobefs.service"
    fi
    echo "kprobefs removed ($venv, $bindir/kprobefs, $mandir/kprobefs.8$unit)"
    exit 0
fi

# Debian packages: libfuse2 for the FUSE loop fusepy offers, python3-venv for the
# environment (Debian's python3 has no ensurepip without it).  Never Debian's `fuse`:
# it Breaks fuse3 (tests/install_packages.sh says more).
packages=(libfuse2)
python3 -c 'import ensurepip' 2>/dev/null || packages+=(python3-venv)
if [ "$mode" = test ]; then
    read -r -a test_packages <<< "$(bash tests/install_packages.sh --list)"
    packages+=("${test_packages[@]}")
fi
need=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "install.sh: missing Debian packages; as root run: apt-get install ${need[*]}" >&2
        exit 1
    fi
    echo "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --no-remove: fail rather than take anything away from the system.
    apt-get install -y -qq --no-remove "${need[@]}" >/dev/null
fi

# An environment whose interpreter is gone (the Python it was made from was removed)
# is made again.
if [ -e "$venv" ] && ! "$venv/bin/python" -c '' 2>/dev/null; then
    rm -rf "$venv"
fi
[ -e "$venv/bin/python" ] || python3 -m venv "$venv"
extra=""
[ "$mode" = test ] && extra="[test]"
# --use-pep517: fusepy is an sdist with only a setup.py; pip 23 would install it the
# legacy way and print a deprecation.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --use-pep517 ".$extra"

mkdir -p "$bindir" "$mandir"
ln -sfn "$venv/bin/kprobefs" "$bindir/kprobefs"
if [ -f docs/kprobefs.8 ]; then
    install -m 644 docs/kprobefs.8 "$mandir/kprobefs.8"
fi
if [ -n "${unitdir:-}" ]; then
    # the user's unit, its ExecStart where this install put the command
    mkdir -p "$unitdir"
    sed "s|^ExecStart=%h/.local/bin/kprobefs |ExecStart=$bindir/kprobefs |" \
        systemd/kprobefs-user.service > "$unitdir/kprobefs.service"
    echo "systemd user unit: $unitdir/kprobefs.service (systemctl --user enable --now kprobefs)"
fi

echo "kprobefs installed: $bindir/kprobefs (environment $venv)"
case ":$PATH:" in
    *":$bindir:"*) ;;
    *) echo "note: $bindir is not on PATH; add it, or run $bindir/kprobefs" ;;
esac
