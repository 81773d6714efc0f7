#!/usr/bin/env bash
# ctest_failures.sh LOG...: for each ctest log (ctest --output-on-failure
# output) that holds a failed, timed-out or not-run test, prints the tail of
# each failed test's output and the list of failures; exits 1 if any log
# had one. run_tests.sh calls it at the very end, so a CI log's tail shows
# what failed in the main stage and in the sanitizer stages alike.
found=0
for log in "$@"; do
  [ -f "$log" ] || continue
  grep -qE '\*\*\*(Failed|Timeout|Exception)|Not Run' "$log" || continue
  found=1
  echo
  echo "=== ctest failures in $log; each failed test's output (tail) ==="
  awk '
    /^ *Start +[0-9]+: / { if (failed) dump(); n = 0; failed = 0 }
    { buf[n++] = $0 }
    / Test +#[0-9]+: .*\*\*\*(Failed|Timeout|Exception)/ { failed = 1; name = $0 }
    function dump(  i, from) {
      print "--- " name
      from = n > 80 ? n - 80 : 0
      for (i = from; i < n; i++) print buf[i]
    }
    END { if (failed) dump() }
  ' "$log"
  grep -E '\*\*\*(Failed|Timeout|Exception)|Not Run' "$log"
done
exit $found
