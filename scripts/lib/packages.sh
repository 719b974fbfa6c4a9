# Shared by the README's commands: install Debian packages the first time they are needed.
# Sourced, not run. Uses sudo when not root; runs `apt-get update` only if something is missing.

need_packages() {
    missing=""
    for package in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
            missing="$missing $package"
        fi
    done
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" -eq 0 ]; then sudo_cmd=""; else sudo_cmd="sudo"; fi
    echo "Installing Debian packages:$missing"
    $sudo_cmd apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $missing >/dev/null
}

need_rust_components() {
    for component in "$@"; do
        if ! rustup component list --installed 2>/dev/null | grep -q "^$component"; then
            rustup component add "$component"
        fi
    done
}
