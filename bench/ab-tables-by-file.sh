#!/bin/bash
# A/B: the agent before (processes published) and after (tables by file), system-wide under the
# bench's churn load (a cpu_split loop and a short_processes loop), interleaved rounds. Per run:
# the agent's CPU over 30 steady seconds (after 8 s of warm-up; utime+stime ticks of 10 ms), its
# peak RSS, and its bpf(2) calls a second over those seconds by command (bpftrace), of which map
# updates and deletes are the per-process publish's.
# BEFORE=path/to/profiler bash bench/ab-tables-by-file.sh
R=${RELEASE:-target/release}
STEADY=${STEADY:-30}
run() { # BIN HZ -> "percent of a core, peak RSS in KiB, bpf calls a second by command"
  local BIN=$1 HZ=$2 W=/tmp/abrun; rm -rf $W; mkdir -p $W
  sh -c "while :; do $R/cpu_split 4000 >/dev/null 2>&1; done" & L=$!
  sh -c "while :; do $R/short_processes 200 >/dev/null 2>&1; done" & C=$!
  sleep 1
  $BIN agent -F $HZ --output-dir $W/win --log-level warn 2>$W/agent.err & A=$!
  tick() { awk '{print $14+$15}' /proc/$A/stat; }
  sleep 8
  bpftrace -q -e "tracepoint:syscalls:sys_enter_bpf /pid == $A/ { @[args->cmd] = count(); }
    interval:s:$STEADY { exit(); }" > $W/bpf.txt 2>/dev/null & T=$!
  t1=$(tick); sleep $STEADY; t2=$(tick)
  wait $T
  hwm=$(awk '/VmHWM/{print $2}' /proc/$A/status)
  kill -TERM $A; wait $A 2>/dev/null
  pkill -P $L; pkill -P $C; kill $L $C 2>/dev/null; wait 2>/dev/null
  calls=$(awk -v s=$STEADY -F'[][]' '/^@/{split($3,v,": "); printf "cmd%s=%.1f/s ", $2, v[2]/s}' $W/bpf.txt)
  echo "$(echo "scale=3; ($t2-$t1)/$STEADY" | bc) $hwm $calls"
}
for round in 1 2 3; do
  for hz in 99 997; do
    for tool in before after; do
      BIN=${BEFORE:?set BEFORE to the binary to compare with}; [ $tool = after ] && BIN=$R/profiler
      echo "round $round $hz Hz $tool: $(run $BIN $hz)"
    done
  done
done
