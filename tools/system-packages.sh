#!/usr/bin/env bash
# Debian packages the project can use but does not need, installed when this machine allows it.
# Used by `make report` / `make test` (and so by CI's .ci/run):
#
#   tools/system-packages.sh PACKAGE...     e.g. chromium dataset-fashion-mnist
#
#   chromium               a browser for kaleido (PNG figures next to the reports) and the browser test
#   dataset-fashion-mnist  the full Fashion-MNIST (optional: the packaged 7,000-image subset is the default)
#   python3.X-venv         Debian's venv module for that Python (its `ensurepip`), which the set-up
#                          needs: the Makefile asks for it only when `python3 -m venv` has failed
#
# Idempotent: a package already installed costs one dpkg query. Installs only with apt-get and
# root or passwordless sudo; otherwise (or when apt-get fails, e.g. offline) it prints one line per
# package saying what will be skipped and the one command that enables it, and exits 0: nothing
# here is required. With $SETUP_LOG set (the Makefile sets it), apt-get's own output goes to that
# file instead of the terminal (one line says so; a failed install prints the file's last lines).
set -u
LOG=${SETUP_LOG:-}

what_skips() {
  case "$1" in
    chromium) echo "PNG figures in reports/ and the browser test will be skipped" ;;
    dataset-fashion-mnist) echo "tests of the full Fashion-MNIST will be skipped (the packaged subset is used)" ;;
    python3*-venv) echo "Python cannot make the virtual environment .venv, so the set-up stops" ;;
    *) echo "features that need it will be skipped" ;;
  esac
}

enable_cmd() {  # the one command that gives this machine the package
  if command -v apt-get >/dev/null 2>&1; then
    echo "sudo apt-get install $1"
  elif [ "$1" = chromium ]; then
    echo ".venv/bin/kaleido_get_chrome   (downloads Chrome for Testing)"
  else
    echo "(not available without Debian's apt-get)"
  fi
}

missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

skip_all() {
  for pkg in "${missing[@]}"; do
    echo "note: $pkg is not installed ($1): $(what_skips "$pkg"). Enable with: $(enable_cmd "$pkg")" >&2
  done
  exit 0
}

command -v apt-get >/dev/null 2>&1 || skip_all "no apt-get here"
if [ "$(id -u)" = 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  skip_all "installing needs root"
fi

LIMIT=()
command -v timeout >/dev/null 2>&1 && LIMIT=(timeout 900)  # apt-get has its own network timeouts too
export DEBIAN_FRONTEND=noninteractive
note=""; [[ " ${missing[*]} " == *" chromium "* ]] && note="; chromium is an ~80 MB download plus libraries"
apt() {  # apt-get, its output into $LOG when set
  if [ -n "$LOG" ]; then
    "${LIMIT[@]}" "${SUDO[@]}" apt-get "$@" >>"$LOG" 2>&1
  else
    "${LIMIT[@]}" "${SUDO[@]}" apt-get "$@"
  fi
}
echo "Installing ${missing[*]} with apt-get (once${note})${LOG:+; its output goes to $LOG} ..." >&2
# Package lists first (a fresh image has none); a failed update may still leave usable lists.
apt update -q || true
if ! apt install -y -q --no-install-recommends "${missing[@]}"; then
  if [ -n "$LOG" ]; then
    echo "apt-get install failed; the last lines of $LOG:" >&2
    tail -n 20 "$LOG" >&2
  fi
  skip_all "apt-get install failed"
fi
