#!/bin/sh
# Each node gets its own host keys on first boot, like a freshly installed machine.
set -eu
ssh-keygen -A >/dev/null
if [ -n "${AUTHORIZED_KEY:-}" ]; then
  printf '%s\n' "$AUTHORIZED_KEY" > /root/.ssh/authorized_keys
  chmod 0600 /root/.ssh/authorized_keys
fi
exec /usr/sbin/sshd -D -e
