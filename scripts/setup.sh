# Sourced by the scripts beside it: makes sure Python 3.11+ with venv exists (installing
# Debian's packages when run as root), then creates .venv and installs Pigeon into it.
# EXTRA selects optional dependencies ("test"); DEBIAN_PACKAGES adds packages to install.

set -euo pipefail

debian_install() {
    # Install only what is missing, so a machine that has everything does no apt work.
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
        return 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    # Postfix is installed for its smtp-source/smtp-sink tools and the benchmark's private
    # instances; "No configuration" means no system mail service is set up or started.
    echo "postfix postfix/main_mailer_type select No configuration" | debconf-set-selections
    echo "installing Debian packages: ${missing[*]} ..." >&2
    apt-get update -qq
    # Packages such as redis-server, postgresql and dovecot-imapd start a system service when
    # installed; the tests run private instances instead, so none is started (policy-rc.d
    # exit 101 = "not allowed now"), unless the machine already had a policy of its own.
    local policy=/usr/sbin/policy-rc.d own_policy=
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
    fi
    local status=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
    if [ -n "$own_policy" ]; then rm -f "$policy"; fi
    return $status
}

debian_install python3 python3-venv python3-dev gcc ${DEBIAN_PACKAGES:-}

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "Pigeon needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>&1)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# Install again only when the dependencies or a compiled part may have changed (pyproject.toml,
# setup.py, a C module, or one of the modules mypyc compiles, as setup.py names them, newer than
# the last install; or other extras asked for): a restart should not wait for pip, and a stale
# build of an edited module would be imported instead of its source.
stamp=".venv/.installed${EXTRA:+-$EXTRA}"
newer() {
    for f in pyproject.toml setup.py src/pigeon/smtp/_scan.c src/pigeon/inbound/targets/_maildir.c \
        $(grep -o "src/pigeon/[a-z_/]*\.py" setup.py); do
        [ "$f" -nt "$stamp" ] && return 0
    done
    return 1
}
if [ ! -f "$stamp" ] || newer; then
    # (pip is quiet, and the first install compiles for minutes: say so, or it looks hung)
    echo "installing Pigeon and its dependencies into .venv (a few minutes the first time) ..." >&2
    if ! { .venv/bin/python -m pip install -q --upgrade pip &&
           .venv/bin/python -m pip install -q -e ".${EXTRA:+[$EXTRA]}"; } > .venv/pip.log 2>&1; then
        cat .venv/pip.log >&2
        echo "installing Pigeon into .venv failed (the pip output is above)" >&2
        exit 1
    fi
    touch "$stamp"
fi
# Byte-compile Pigeon's own modules now: an environment with PYTHONDONTWRITEBYTECODE set (as
# some CI runners and containers have) would otherwise compile every module from source in
# every process it starts, about 0.4 s of CPU each (the tests start hundreds). Up-to-date
# files are skipped, so this costs nothing on a second run.
.venv/bin/python -m compileall -q -j 0 src >/dev/null
