#!/usr/bin/env bash
# fit_out.sh DIR [MAX]: make DIR (a device call's $OUT) hold at most MAX files (default 8), the most
# the device tool brings back from a call (its README, "Limits"): past that it leaves the rest
# behind, and a lease's records with it (2026-12-03: 8 of 16 variant files did not come back).
#
# First the step logs and records (everything but the steps' own .tgz archives) go into one
# logs.tgz; if that is still too many, every archive into one results.tar. Nothing is dropped:
# each file is inside exactly one of what is left. Prints what it packed.
set -euo pipefail
dir=$1
max=${2:-8}
cd "$dir"
count() { find . -mindepth 1 -maxdepth 1 | wc -l; }
[ "$(count)" -le "$max" ] && exit 0

mapfile -t loose < <(find . -mindepth 1 -maxdepth 1 ! -name '*.tgz' -printf '%P\n' | sort)
if [ "${#loose[@]}" -gt 1 ]; then
  tar -czf logs.tgz --remove-files "${loose[@]}"
  echo "fit_out: ${#loose[@]} logs and records packed into $dir/logs.tgz (the device tool brings back $max files)"
fi
[ "$(count)" -le "$max" ] && exit 0

mapfile -t archives < <(find . -mindepth 1 -maxdepth 1 -printf '%P\n' | sort)
tar -cf results.tar --remove-files "${archives[@]}"
echo "fit_out: ${#archives[@]} archives packed into $dir/results.tar"
