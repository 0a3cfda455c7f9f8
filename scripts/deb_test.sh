#!/usr/bin/env bash
# Builds the Linux .deb with cargo-deb ([package.metadata.deb] in Cargo.toml), installs it with
# dpkg, and checks the installed binary: `strata --version`, then one chat request to
# `strata serve` on the built-in demo model. Runs as root (CI) or with sudo available.
# DEB_ARGS adds cargo-deb flags, e.g. DEB_ARGS=--no-build to package an existing
# target/release/strata without building it again.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

if ! cargo deb --version >/dev/null 2>&1; then
    echo "deb: installing cargo-deb"
    cargo install cargo-deb --locked
fi

echo "deb: building the package"
# shellcheck disable=SC2086 # DEB_ARGS is a list of flags
deb_path="$(cargo deb ${DEB_ARGS:-} 2>&1 | tee /dev/stderr | grep -E '\.deb$' | tail -n 1)"
[ -f "$deb_path" ] || { echo "deb: no .deb was produced"; exit 1; }
echo "deb: built $deb_path ($(du -h "$deb_path" | cut -f1))"

$sudo dpkg -i "$deb_path"
installed=/usr/bin/strata
[ -x "$installed" ] || { echo "deb: $installed missing after dpkg -i"; exit 1; }
"$installed" --version

port=$(( 20000 + RANDOM % 20000 ))
log="$(mktemp)"
"$installed" serve --backend cpu --port "$port" >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT

for _ in $(seq 1 150); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$log"; echo "deb: the installed server exited"; exit 1; }
    sleep 0.2
done
reply="$(curl -sf "http://127.0.0.1:$port/v1/chat/completions" \
    -H 'Content-Type: application/json' \
    -d '{"messages":[{"role":"user","content":"hello"}],"max_tokens":4}')" || {
    cat "$log"
    echo "deb: the chat request failed"
    exit 1
}
echo "$reply" | grep -q '"chat.completion"' || { echo "deb: unexpected reply: $reply"; exit 1; }
echo "deb: the installed strata answered a chat request"
# The web page comes from the binary itself: nothing was installed beside it.
curl -sf "http://127.0.0.1:$port/" | grep -q '<title>strata</title>' || { echo "deb: no web page at /"; exit 1; }
curl -sf "http://127.0.0.1:$port/app.js" >/dev/null || { echo "deb: /app.js missing"; exit 1; }
echo "deb: the installed strata serves its web page"
echo "deb: passed"
