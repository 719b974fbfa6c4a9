#!/bin/sh
# Unpack Debian 13's libisal2 (ISA-L 2.31, the first release with GFNI erasure-code paths) into
# ~/.cache/flashraid/isal-2.31, beside the system's, so `flashraid bench parity` can compare
# against the fastest ISA-L available. Nothing is installed system-wide: apt reads a private
# source list and state directory, and the .deb is only unpacked.
set -eu
cache="${FLASHRAID_CACHE:-$HOME/.cache/flashraid}"
target="$cache/isal-2.31"
if [ -e "$target/usr/lib/x86_64-linux-gnu/libisal.so.2" ]; then
    echo "ISA-L 2.31 already unpacked in $target"
    exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
echo "deb http://deb.debian.org/debian trixie main" > "$work/sources.list"
apt_opts="-o Dir::Etc::SourceList=$work/sources.list -o Dir::Etc::SourceParts=/dev/null \
  -o Dir::State::Lists=$work/lists -o Dir::Cache::Archives=$work/archives \
  -o APT::Sandbox::User=root -o Debug::NoLocking=1"
# shellcheck disable=SC2086
apt-get $apt_opts -qq update
# shellcheck disable=SC2086
(cd "$work" && apt-get $apt_opts -qq download libisal2)
mkdir -p "$target"
dpkg -x "$work"/libisal2_*.deb "$target"
echo "ISA-L $(ls "$target/usr/lib/x86_64-linux-gnu/" | grep 'so.2.0' ) unpacked in $target"
