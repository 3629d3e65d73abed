#!/bin/sh
# Makes sure tmux is present, so `make test` can drive `k3 chat` through a real terminal
# (tests/chat/chat_tty.test.ts). Debian images ship it; installs the Debian package when it is
# missing and we may (root + apt-get); otherwise says what to install.
set -eu
command -v tmux >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tty-tools: installing tmux (once, for the chat terminal test)" >&2
  apt-get update -qq >/dev/null || echo "tty-tools: apt-get update reported errors" >&2
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tmux \
    >/dev/null </dev/null; then
    exit 0
  fi
  echo "tty-tools: could not install tmux; the chat terminal test needs it" >&2
  exit 2
fi
echo "tty-tools: the chat terminal test needs tmux (Debian package); install it and rerun" >&2
exit 2
