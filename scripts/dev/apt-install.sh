#!/bin/sh
# Install a Debian package if BINARY is missing: as root, or through passwordless sudo; otherwise
# print what is lost and go on (the caller's tests or benchmarks skip or fall back).
#   scripts/dev/apt-install.sh PACKAGE BINARY "what happens without it"
package=$1 binary=$2 without=$3
[ -x "$binary" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package"
elif sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package"
else
    echo "WARNING: $binary missing and not root: $without"
fi
