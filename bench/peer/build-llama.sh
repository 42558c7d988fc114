#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-quantize, llama-server (for
# bench:serve), llama-perplexity (bench:peer's quality columns) and loopserve's greedy/logits probe (llama-greedy.cpp beside this script) from the source bundle that the
# node-llama-cpp npm package ships (bench/peer's own dependency, installed by
# bench/peer/llama.ts on first use), for the native CPU, CPU only; or, with
# VARIANT cuda, llama-server alone with the CUDA backend for the GPU of this
# host (`bench:serve -- --gpu`; needs nvcc and cuBLAS). Built once per
# bundle and variant and cached outside the repository; never commit what
# it makes.
#
# usage: build-llama.sh BUNDLE CACHE_DIR [cpu|cuda]
#   BUNDLE     bench/peer/node_modules/node-llama-cpp/llama/gitRelease.bundle
#   CACHE_DIR  e.g. ~/.cache/loopserve-peer
# Prints the directory holding the executables as its last line.
# Environment: LLAMA_BUILD_JOBS (default: nproc).
set -euo pipefail

die() { echo "build-llama: $*" >&2; exit 1; }

[ $# -eq 2 ] || [ $# -eq 3 ] || die "usage: build-llama.sh BUNDLE CACHE_DIR [cpu|cuda]"
BUNDLE=$1
CACHE=$2
VARIANT=${3:-cpu}
case $VARIANT in
  cpu) TARGETS=(llama-bench llama-quantize llama-server llama-perplexity); BACKEND=(-DGGML_NATIVE=ON -DGGML_CUDA=OFF) ;;
  cuda)
    command -v nvcc >/dev/null || die "the cuda variant needs nvcc (the CUDA toolkit)"
    TARGETS=(llama-server); BACKEND=(-DGGML_NATIVE=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native) ;;
  *) die "unknown variant $VARIANT (cpu or cuda)" ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
GREEDY_SRC=$HERE/llama-greedy.cpp

[ -f "$BUNDLE" ] || die "llama.cpp source bundle not found at $BUNDLE (npm ci --prefix bench/peer installs it)"
for tool in git cmake c++ cc; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed (Debian: apt-get install git cmake build-essential)"
done
[ -f "$GREEDY_SRC" ] || die "missing $GREEDY_SRC"

# The bundle's one head names the llama.cpp commit; the key also covers this
# script and the probe source, so editing either rebuilds.
HEAD=$(git bundle list-heads "$BUNDLE" | awk 'NR==1{print $1}')
[ -n "$HEAD" ] || die "$BUNDLE is not a git bundle with a head"
KEY=$(cat "$0" "$GREEDY_SRC" | sha256sum | cut -c1-12)
ROOT=$CACHE/llama-${HEAD:0:12}-$KEY$([ "$VARIANT" = cpu ] || echo "-$VARIANT")
BIN=$ROOT/bin
EXES=("${TARGETS[@]}")
[ "$VARIANT" = cpu ] && EXES+=(llama-greedy)
built=1
for exe in "${EXES[@]}"; do [ -x "$BIN/$exe" ] || built=0; done
if [ $built = 1 ]; then
  echo "$BIN"
  exit 0
fi

mkdir -p "$CACHE"
SRC=$ROOT/src
if [ ! -d "$SRC/.git" ]; then
  rm -rf "$SRC"
  git clone --quiet "$BUNDLE" "$SRC" 2>&1 | grep -v "detached HEAD" >&2 || true
  git -C "$SRC" -c advice.detachedHead=false checkout --quiet "$HEAD"
fi

JOBS=${LLAMA_BUILD_JOBS:-$(nproc)}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
echo "build-llama: configuring llama.cpp ${HEAD:0:12} in $ROOT/build (native CPU, $VARIANT)" >&2
cmake -S "$SRC" -B "$ROOT/build" "${GEN[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  "${BACKEND[@]}" \
  -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF -DGGML_OPENCL=OFF \
  -DGGML_BLAS=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF >&2
echo "build-llama: building ${TARGETS[*]} with $JOBS jobs (cpu: 8-12 minutes on 2 cores)" >&2
cmake --build "$ROOT/build" --target "${TARGETS[@]}" llama -j "$JOBS" >&2
mkdir -p "$BIN.tmp"
if [ "$VARIANT" = cuda ]; then
  f=$(find "$ROOT/build" -type f -name llama-server -perm -u+x -print -quit)
  [ -n "$f" ] || die "build finished without llama-server"
  cp "$f" "$BIN.tmp/llama-server"
  rm -rf "$BIN"
  mv "$BIN.tmp" "$BIN"
  echo "$BIN"
  exit 0
fi

# The probe links the static libraries the build just made.
LIBS=()
for lib in libllama.a libggml.a libggml-cpu.a libggml-base.a; do
  f=$(find "$ROOT/build" -name "$lib" -print -quit)
  [ -n "$f" ] || die "built tree has no $lib"
  LIBS+=("$f")
done
echo "build-llama: compiling llama-greedy" >&2
c++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$GREEDY_SRC" \
  -Wl,--start-group "${LIBS[@]}" -Wl,--end-group -fopenmp -lpthread -ldl -o "$BIN.tmp/llama-greedy"
for exe in llama-bench llama-quantize llama-server llama-perplexity; do
  f=$(find "$ROOT/build" -type f -name "$exe" -perm -u+x -print -quit)
  [ -n "$f" ] || die "build finished without $exe"
  cp "$f" "$BIN.tmp/$exe"
done
rm -rf "$BIN"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
