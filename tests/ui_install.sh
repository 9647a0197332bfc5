#!/bin/sh
# The dashboard's browser tests (tests/frontend/ui) drive Debian's chromium through its
# chromedriver, never a downloaded browser. This installs the two packages when either
# is missing (apt-get, as root or with passwordless sudo) and does nothing, at once,
# when both are there: the README's test command runs it first on every machine.
set -eu
have() { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }
have && exit 0
if [ "$(id -u)" = 0 ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    echo "tests/ui_install.sh: /usr/bin/chromium or /usr/bin/chromedriver is missing;" \
        "as root: apt-get install -y chromium chromium-driver" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "tests/ui_install.sh: installing chromium and chromium-driver (apt)" >&2
# A fresh machine may have no package lists yet: update once, only if the install needs it.
$as_root apt-get install -y -q chromium chromium-driver >/dev/null ||
    { $as_root apt-get update -q >/dev/null && $as_root apt-get install -y -q chromium chromium-driver >/dev/null; }
have || { echo "tests/ui_install.sh: chromium is still missing after apt-get" >&2; exit 1; }
