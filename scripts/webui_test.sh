#!/usr/bin/env bash
# Browser test of the built-in web page: `strata serve` on the demo model, driven by headless
# Chromium through WebDriver (Python selenium). Needs chromium, chromium-driver and selenium
# (Debian: apt-get install chromium chromium-driver python3-selenium).
# Screenshots and server logs go to target/webui-artifacts/. Ends with `webui: N passed, M failed`
# and exits non-zero when any check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --bin strata 2>&1 | tail -n 3
strata="${CARGO_TARGET_DIR:-target}/debug/strata"
out="${CARGO_TARGET_DIR:-target}/webui-artifacts"
rm -rf "$out"
mkdir -p "$out"

# Debian's python3-selenium lives in the system Python; a pip install works from any python3.
python=""
for candidate in /usr/bin/python3 python3; do
    if "$candidate" -c 'import selenium' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    echo "webui: selenium not found (apt-get install python3-selenium, or pip install selenium)"
    echo "webui: 0 passed, 1 failed"
    exit 1
fi

timeout 300 "$python" tests/webui/browser_test.py --strata "$strata" --out "$out"
