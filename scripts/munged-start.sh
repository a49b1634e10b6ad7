# Sourced by scripts/demo.sh and scripts/gpu-suspend-bench.sh: one way to start a cluster's own
# munged. start_munged DIR SBIN: copies the node's key into DIR/munge (0600, the directory 0700 while
# munged starts, as it insists), starts SBIN/munged in the background on DIR/munge/munge.sock (its
# pid appended to the caller's `pids` array), waits up to 5 s for the socket, then opens DIR/munge
# (0755) so that jobs of other users reach the socket.
start_munged() {
  local dir=$1 sbin=$2
  install -m 600 /etc/munge/munge.key "$dir/munge/munge.key"
  chmod 700 "$dir/munge"
  "$sbin/munged" -F --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --log-file="$dir/munge/munged.log" --pid-file="$dir/munge/munged.pid" \
    --seed-file="$dir/munge/munged.seed" & pids+=($!)
  for _ in $(seq 50); do [ -S "$dir/munge/munge.sock" ] && break; sleep 0.1; done
  chmod 755 "$dir/munge"
}
