#!/bin/bash
# A/B: the agent before (processes published) and after (tables by file), system-wide under the
# bench's churn load (a cpu_split loop and a short_processes loop), interleaved rounds.
R=${RELEASE:-target/release}
run() { # BIN HZ -> "percent of a core, peak RSS in KiB"
  local BIN=$1 HZ=$2 W=/tmp/abrun; rm -rf $W; mkdir -p $W
  sh -c "while :; do $R/cpu_split 4000 >/dev/null 2>&1; done" & L=$!
  sh -c "while :; do $R/short_processes 200 >/dev/null 2>&1; done" & C=$!
  sleep 1
  $BIN agent -F $HZ --output-dir $W/win --log-level warn 2>$W/agent.err & A=$!
  tick() { awk '{print $14+$15}' /proc/$A/stat; }
  sleep 8; t1=$(tick); sleep 15; t2=$(tick)
  hwm=$(awk '/VmHWM/{print $2}' /proc/$A/status)
  kill -TERM $A; wait $A 2>/dev/null
  pkill -P $L; pkill -P $C; kill $L $C 2>/dev/null; wait 2>/dev/null
  echo "$(echo "scale=3; ($t2-$t1)/15" | bc) $hwm"
}
for round in 1 2 3; do
  for hz in 99 997; do
    for tool in before after; do
      BIN=${BEFORE:?set BEFORE to the binary to compare with}; [ $tool = after ] && BIN=$R/profiler
      echo "round $round $hz Hz $tool: $(run $BIN $hz)"
    done
  done
done
