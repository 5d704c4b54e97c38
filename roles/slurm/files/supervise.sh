#!/bin/sh
# Keeps one daemon running where no service manager does: runs the command in the
# foreground and starts it again a second after it exits; TERM stops the command and then
# this script, so `start-stop-daemon --stop` on this script's pid file stops both.
#   torchfleet-supervise COMMAND [ARG]...
set -u
stop=
child=
trap 'stop=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null' TERM INT
while [ -z "$stop" ]; do
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  if [ -n "$stop" ]; then
    # wait returned for the signal; the command may still be shutting down.
    wait "$child" 2>/dev/null
    break
  fi
  child=
  echo "$(date -u +%FT%TZ) torchfleet-supervise: $1 exited with status $rc; starting it again" >&2
  sleep 1
done
