#!/bin/sh
# /proc/stat's cpu lines every 10 s beside a measurement, at most 720 times (2 h), for
# benchmarks/steal_time.py. Each sample is a `T <unix time>` line, then the cpu lines.
#
#     sh benchmarks/proc_stat_sampler.sh OUT.log PIDFILE &
#
# It writes its PID to PIDFILE; stop it with `kill "$(cat PIDFILE)"`, never by name.
out=$1
pidfile=$2
if [ -z "$out" ] || [ -z "$pidfile" ]; then
  echo "usage: sh benchmarks/proc_stat_sampler.sh OUT.log PIDFILE" >&2
  exit 2
fi
echo $$ > "$pidfile"
i=0
while [ $i -lt 720 ]; do
  echo "T $(date +%s.%N)" >> "$out"
  grep '^cpu' /proc/stat >> "$out"
  sleep 10
  i=$((i+1))
done
