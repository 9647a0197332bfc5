#!/bin/sh
# The system tools the tests drive: the dashboard's browser tests (tests/frontend/ui)
# drive Debian's chromium through its chromedriver, never a downloaded browser; the
# Node clients' test (tests/frontend/test_node_clients.py) runs node, its packages
# installed with npm. This installs what is missing (apt-get, as root or with
# passwordless sudo) and does nothing, at once, when all is there: the README's test
# command runs it first on every machine.
set -eu
have() {
    [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] &&
        command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1
}
have && exit 0
if [ "$(id -u)" = 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    echo "tests/ui_install.sh: chromium, chromium-driver, node or npm is missing;" \
        "as root: apt-get install -y chromium chromium-driver nodejs npm" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
want="chromium chromium-driver"
command -v node >/dev/null 2>&1 || want="$want nodejs"
command -v npm >/dev/null 2>&1 || want="$want npm"
echo "tests/ui_install.sh: installing $want (apt)" >&2
# A fresh machine may have no package lists yet: update once, only if the install needs it.
$as_root apt-get install -y -q $want >/dev/null ||
    { $as_root apt-get update -q >/dev/null && $as_root apt-get install -y -q $want >/dev/null; }
have || { echo "tests/ui_install.sh: $want still missing after apt-get" >&2; exit 1; }
