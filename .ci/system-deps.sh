#!/usr/bin/env bash
# System packages the tests need:
#   nginx            the load-balancer example (deploy/nginx.conf) is run for real (test/deploy)
#   systemd          systemd-analyze, to verify deploy/*.service (test/deploy)
#   python3-torch, python3-numpy, python3-tqdm, libopenblas0-pthread
#                    the PyTorch package (torch/) and its equivalence with the kernels (test/torch);
#                    OpenBLAS replaces the reference BLAS torch would otherwise use
#   bible-kjv        the training text (torch/loopserve_torch/data.py)
#   chromium         the web playground is driven in a real headless browser (puppeteer-core)
#   clang, libclang-rt-14-dev
#                    libFuzzer harnesses for the C code that reads untrusted bytes
# `npm test` runs this first, and so does CI through it. Idempotent and quick:
# apt is not touched when every tool is already there. Needs root (or
# passwordless sudo) only when something is missing. Never fails: whatever
# cannot be installed is named, and the tests that need it skip saying so.
# Never starts a service: Debian's nginx package would otherwise try to start
# one on port 80.
set -uo pipefail

# Sets need to the packages whose tool or module is missing.
find_missing() {
  need=()
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)
  command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
  /usr/bin/python3 -c 'import torch.nn, numpy, tqdm' >/dev/null 2>&1 || need+=(python3-torch python3-numpy python3-tqdm)
  [ -e /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || need+=(libopenblas0-pthread)
  command -v bible >/dev/null 2>&1 || need+=(bible-kjv)
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
  command -v clang >/dev/null 2>&1 || need+=(clang)
  ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
}
find_missing

if [ ${#need[@]} -eq 0 ]; then
  echo "system-deps: everything already present"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  # -n: never stop `npm test` at a password prompt.
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo=(sudo -n); else
    echo "system-deps: need root or passwordless sudo to install ${need[*]} (apt-get); the tests that need them will be skipped" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: no apt-get here; install ${need[*]} by hand (the tests that need them will be skipped)" >&2
  exit 0
fi

# policy-rc.d exit 101 = "do not start services from maintainer scripts".
# Installed only for the duration of this script, and only if none exists.
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod 755 "$policy"
  own_policy=1
fi
cleanup() { if [ "$own_policy" -eq 1 ]; then "${sudo[@]}" rm -f "$policy"; fi; }
trap cleanup EXIT

echo "system-deps: installing ${need[*]} (apt-get; PyTorch and Chromium take minutes)"
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt run (another checkout's tests, say) instead of failing.
apt=("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600)
install() { "${apt[@]}" install -y -qq --no-install-recommends "$@" >/dev/null; }
# Only refresh the package lists when they are missing (a fresh container).
if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e '^lock$' -e '^partial$' || true)" ]; then
  "${apt[@]}" update -qq
fi
# Names what is still missing after apt-get (a package this release lacks,
# or one installed but unusable: a directory hidden, a file removed), else done.
report() {
  find_missing
  if [ ${#need[@]} -eq 0 ]; then echo "system-deps: done"; else
    echo "system-deps: still missing after apt-get: ${need[*]}; the tests that need them will be skipped" >&2
  fi
  exit 0
}
if install "${need[@]}"; then report; fi
# Stale lists (404 on a superseded version): refresh once; then one package
# at a time, so that one this release lacks does not keep out the others.
"${apt[@]}" update -qq
if install "${need[@]}"; then report; fi
for p in "${need[@]}"; do install "$p" || true; done
report
