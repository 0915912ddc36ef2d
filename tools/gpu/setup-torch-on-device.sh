#!/bin/bash
# Install the carried torch stack (tools/gpu/torch_bundle.py) into /tmp/site on the GPU machine, before
# make-bundle's setup-on-device.sh installs vLLM there. Run from the repository root in the last call:
#     bash .gpu33/setup-torch.sh && bash .gpu33/setup-on-device.sh
# Steps: check that the chunks t0..tN are in /root/stage and match their sha256, unpack the wheels,
# pip-install them (no dependencies, no index) into $SITE, then show the new torch on the GPU next to
# the image's own CUDA libraries. Running it again skips the install. Exit 3: chunks missing (the
# machine went back or a call was skipped: start again at the first chunk), 4: damaged, 5: the check
# failed.
set -euo pipefail

# >>> facts (torch_bundle.py fills these in; this copy is the template)
TORCH_WHEELS=""
TORCH_CHUNKS=""
TORCH_PAYLOAD=""
# <<< facts

STAGE=${S4KV_STAGE:-/root/stage}
SITE=${S4KV_SITE:-/tmp/site}
WORK=${S4KV_TORCH_WORK:-/root/s4kv-torch}
PY=${S4KV_PYTHON:-python3}
say() { printf '[setup-torch %3ds] %s\n' "$SECONDS" "$*"; }
die() { printf '[setup-torch %3ds] ERROR: %s\n' "$SECONDS" "$1" >&2; exit "${2:-1}"; }

[ -n "$TORCH_PAYLOAD" ] || die "this is the template: run the copy torch_bundle.py wrote into the bundle folder"
read -ra CHUNKS <<<"$TORCH_CHUNKS"
NAMES=("${CHUNKS[@]%%=*}")

if [ -f "$SITE/.s4kv-torch" ] && [ "$(cat "$SITE/.s4kv-torch")" = "$TORCH_PAYLOAD" ]; then
  say "torch stack already installed in $SITE"
else
  missing=()
  for n in "${NAMES[@]}"; do [ -f "$STAGE/$n" ] || missing+=("$n"); done
  ((${#missing[@]} == 0)) || die "missing in $STAGE: ${missing[*]} (carry each in its own call, back to back)" 3
  bad=()
  for spec in "${CHUNKS[@]}"; do
    [ "$(sha256sum "$STAGE/${spec%%=*}" | cut -c1-64)" = "${spec#*=}" ] || bad+=("${spec%%=*}")
  done
  if ((${#bad[@]})); then rm -f "${bad[@]/#/$STAGE/}"; die "damaged or stale chunks, removed: ${bad[*]}" 4; fi
  rm -rf "$WORK" && mkdir -p "$WORK" "$SITE"
  cat "${NAMES[@]/#/$STAGE/}" | tar -x -C "$WORK"
  say "${#NAMES[@]} chunks ok, wheels: $TORCH_WHEELS"
  # the torch stack replaces nothing of the image's: it goes first on PYTHONPATH through $SITE
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip install -q --no-index --no-deps \
    --no-compile --upgrade --target "$SITE" "$WORK"/whl/*.whl
  echo "$TORCH_PAYLOAD" >"$SITE/.s4kv-torch"
  say "installed into $SITE"
fi

say "the image's CUDA libraries (what the new torch loads beside the NCCL it brought):"
"$PY" -m pip list 2>/dev/null | grep -i -E '^(nvidia-|cuda-)' | tr -s ' ' | sed 's/^/    /' || true
if PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'PY'
import torch, triton
x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
ok = torch.allclose((x @ x).float(), x.float() @ x.float(), rtol=0.05, atol=1.0)
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
      f"{torch.__file__}); triton {triton.__version__}; {torch.cuda.get_device_name()}; bf16 matmul ok: {ok}")
raise SystemExit(0 if ok else 1)
PY
then say "ready"; else die "the new torch does not run on this GPU" 5; fi
