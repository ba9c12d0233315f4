#!/usr/bin/env bash
# Builds this example as a separate package that depends on Pickup by path (as `pickup`, the
# identity a `.package(url: ".../pickup.git", ...)` line gives), serves a file from nginx, runs the
# example on it and compares the bytes. Run from anywhere; CI runs it after the tests.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d)"
cleanup() { [ -f "$work/nginx.pid" ] && kill "$(cat "$work/nginx.pid")" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
ln -s "$repo" "$work/pickup"
cp -R "$repo/Examples/Consumer" "$work/consumer"
rm -rf "$work/consumer/.build"
(cd "$work/consumer" && swift build)

mkdir -p "$work/site" "$work/out"
head -c 3000000 /dev/urandom > "$work/site/file.bin"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/nginx.conf" <<CONF
daemon on; master_process off; pid $work/nginx.pid; error_log $work/error.log;
events {}
http { access_log off; client_body_temp_path $work/body; proxy_temp_path $work/proxy; fastcgi_temp_path $work/fcgi;
       server { listen 127.0.0.1:$port; root $work/site; } }
CONF
"$(command -v nginx || echo /usr/sbin/nginx)" -p "$work" -c "$work/nginx.conf"
"$work/consumer/.build/debug/consumer" "http://127.0.0.1:$port/file.bin" "$work/out"
cmp "$work/site/file.bin" "$work/out/file.bin"
cmp "$work/site/file.bin" "$work/out/copy.bin"
echo "consumer example: built against pickup by path, downloaded twice, bytes identical"
