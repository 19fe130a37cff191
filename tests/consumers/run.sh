#!/usr/bin/env bash
# Consumer tests: recompose used from outside, as a new user would.
#
#   bash tests/consumers/run.sh [BUILD_DIR]      (scripts/test.sh runs it after the unit tests)
#
# 1. install: `meson install` of the existing build (no rebuild) into a temporary staging root
#    (DESTDIR), then MOVED elsewhere: every consumer below uses the moved tree, so recompose.pc
#    and the CMake package must be relocatable. Checks the headers, the versioned libraries,
#    their soname and RUNPATH (ldd finds LibTorch), recompose.pc and the CMake package.
# 2. pkg-config:  g++ -std=c++20 consumer.cpp $(pkg-config --cflags --libs recompose)
# 3. cmake:       find_package(recompose) + target_link_libraries(consumer recompose::recompose)
# 4. meson-pkgconfig: dependency('recompose') finding the installed recompose.pc
# 5. meson-subproject: dependency('recompose') building subprojects/recompose (this checkout, with
#    examples, benchmarks and tests off: only the two libraries and the consumer are compiled; as a
#    unity build, -Dunity=subprojects, as the README suggests for a project that embeds recompose)
# Each builds tests/consumers/consumer.cpp (an annotated module, apply_checkpoint, one backward,
# gradients checked against no checkpointing) and runs it. Any failure makes the script exit 1.
#
# Environment: RECOMPOSE_JOBS (parallel jobs), RECOMPOSE_CONSUMERS (which of pkg-config, cmake,
# meson-pkgconfig, meson-subproject to run; default all), RECOMPOSE_KEEP_CONSUMERS=1 (keep the
# temporary folder).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd) || { echo "[consumers] no build folder ${1:-$root/build}" >&2; exit 1; }
jobs=${RECOMPOSE_JOBS:-$(nproc)}
which=${RECOMPOSE_CONSUMERS:-pkg-config cmake meson-pkgconfig meson-subproject}
work=$(mktemp -d "${TMPDIR:-/tmp}/recompose-consumers.XXXXXX")
if [ "${RECOMPOSE_KEEP_CONSUMERS:-0}" = 1 ]; then
  echo "[consumers] keeping $work"
else
  trap 'rm -rf "$work"' EXIT
fi

log() { printf '[consumers] %s\n' "$*"; }
results=()
failed=0
# run_step NAME FUNCTION: runs the function under set -e (in the background, so that set -e holds)
# with its output in $work/NAME.log, shown on failure.
run_step() {
  local name=$1
  shift
  local t0=$SECONDS rc=0
  (set -e; "$@") >"$work/$name.log" 2>&1 &
  wait $! || rc=$?
  if [ $rc -eq 0 ] && grep -q '^SKIPPED' "$work/$name.log"; then
    results+=("$(printf '%-18s skipped  %4d s' "$name" $((SECONDS - t0)))")
    log "$name: $(grep '^SKIPPED' "$work/$name.log")"
  elif [ $rc -eq 0 ]; then
    results+=("$(printf '%-18s ok       %4d s' "$name" $((SECONDS - t0)))")
    log "$name: ok ($((SECONDS - t0)) s)"
  else
    results+=("$(printf '%-18s FAILED   %4d s' "$name" $((SECONDS - t0)))")
    failed=1
    log "$name: FAILED ($((SECONDS - t0)) s); its output:"
    sed 's/^/    /' "$work/$name.log" | tail -n 60
  fi
}
need() {
  command -v "$1" >/dev/null 2>&1 || { log "$1 not found: install it (scripts/setup.sh does)"; exit 1; }
}
need meson
need ninja

# Where the build installs, from its own configuration.
eval "$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
opts = {o["name"]: o["value"] for o in json.load(sys.stdin)}
for k in ("prefix", "libdir", "includedir"):
    print(f"{k}={opts[k]!r}")
')"
# The LibTorch the build uses (the option may be empty: then meson.build picked the default).
torch_dir=$(sed -n 's/^torch_dir=//p' "$build/recompose.pc")
case $libdir in /*) ;; *) libdir=$prefix/$libdir ;; esac
case $includedir in /*) ;; *) includedir=$prefix/$includedir ;; esac
stage=$work/stage
# Where the staged tree is moved to before any consumer uses it.
moved=$work/moved
sprefix=$moved$prefix
slib=$moved$libdir
sinc=$moved$includedir
torch_lib=$(cd "$torch_dir" 2>/dev/null && pwd)/lib

# ---------------------------------------------------------------------------------------------
check_install() {
  meson install -C "$build" --no-rebuild --destdir "$stage" --quiet
  mv "$stage" "$moved"
  echo "installed into $stage (prefix $prefix), then moved to $moved:"
  (cd "$moved" && find . -type f -o -type l | sort | sed 's/^/  /')
  for h in recompose.h apply_checkpoint.h checkpoint.h selective_checkpoint.h swap.h hooks/forward_annotation.h; do
    [ -f "$sinc/recompose/$h" ] || { echo "missing header $sinc/recompose/$h"; return 1; }
  done
  for name in recompose recompose_hooks; do
    local lib
    lib=$(ls "$slib"/lib$name.so.*.*.* 2>/dev/null | head -n1)
    [ -n "$lib" ] || { echo "missing versioned lib$name.so.X.Y.Z in $slib"; return 1; }
    [ -L "$slib/lib$name.so" ] || { echo "missing development link lib$name.so"; return 1; }
    local soname runpath
    soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    runpath=$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
    echo "$(basename "$lib"): SONAME $soname, RUNPATH $runpath"
    [[ $soname == lib$name.so.* ]] || { echo "lib$name has no versioned SONAME"; return 1; }
    [ -e "$slib/$soname" ] || { echo "no $soname link next to $(basename "$lib")"; return 1; }
    [[ ":$runpath:" == *":$torch_lib:"* ]] || { echo "RUNPATH of $(basename "$lib") lacks $torch_lib"; return 1; }
    # Without LD_LIBRARY_PATH, every dependency must resolve: LibTorch's libraries through the
    # RUNPATH to LibTorch, librecompose_hooks through $ORIGIN (in any prefix).
    if env -u LD_LIBRARY_PATH ldd "$lib" | grep -q 'not found'; then
      env -u LD_LIBRARY_PATH ldd "$lib"
      echo "ldd: a dependency of $(basename "$lib") is not found"
      return 1
    fi
  done
  [ -f "$slib/pkgconfig/recompose.pc" ] || { echo "missing $slib/pkgconfig/recompose.pc"; return 1; }
  [ -f "$slib/cmake/recompose/recomposeConfig.cmake" ] || { echo "missing recomposeConfig.cmake"; return 1; }
  [ -f "$slib/cmake/recompose/recomposeConfigVersion.cmake" ] || { echo "missing recomposeConfigVersion.cmake"; return 1; }
  check_pc_relocated
}

# The installed recompose.pc, used where the moved tree has it: no prefix is redefined.
pcdir=$slib/pkgconfig
pkg() { PKG_CONFIG_PATH="$pcdir" pkg-config "$@"; }
check_pc_relocated() {
  need pkg-config
  local dir
  for var in prefix includedir libdir; do
    dir=$(pkg --variable="$var" recompose)
    echo "recompose.pc: $var=$dir"
    [ "$(cd "$dir" 2>/dev/null && pwd -P)" = "$(cd "$moved${!var}" && pwd -P)" ] ||
      { echo "recompose.pc's $var is not inside the moved install $moved: it is not relocatable"; return 1; }
  done
}

consumer_pkg_config() {
  need pkg-config
  local dir=$work/pkg-config
  mkdir -p "$dir"
  echo "pkg-config --cflags --libs recompose:"
  pkg --cflags --libs recompose
  # shellcheck disable=SC2046
  ${CXX:-c++} -std=c++20 -O1 "$here/consumer.cpp" -o "$dir/consumer" $(pkg --cflags --libs recompose)
  env -u LD_LIBRARY_PATH "$dir/consumer"
}

# A CUDA LibTorch's find_package(Torch) needs the CUDA Toolkit: without one, recompose's package
# must say so (the build is then skipped, as no CMake project can use that LibTorch here).
torch_is_cuda() { [ -e "$torch_dir/lib/libtorch_cuda.so" ]; }
have_cuda_toolkit() {
  local n
  for n in nvcc "${CUDA_PATH:-/usr/local/cuda}/bin/nvcc" /usr/local/cuda/bin/nvcc; do
    "$n" --version >/dev/null 2>&1 && return 0
  done
  return 1
}

consumer_cmake() {
  need cmake
  local dir=$work/cmake
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  if ! cmake -S "$here" -B "$dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$sprefix" \
      >"$work/cmake-configure.log" 2>&1; then
    cat "$work/cmake-configure.log"
    if torch_is_cuda && ! have_cuda_toolkit && tr -s ' \n' ' ' <"$work/cmake-configure.log" | grep -q "needs the CUDA Toolkit (nvcc and headers)"; then
      echo "SKIPPED the build: this LibTorch is a CUDA build and there is no CUDA Toolkit here" \
           "(find_package(Torch) needs one); recompose's message about it was checked"
      return 0
    fi
    return 1
  fi
  cat "$work/cmake-configure.log"
  grep -E '^recompose_DIR' "$dir/CMakeCache.txt"
  cmake --build "$dir" -j "$jobs" --verbose
  env -u LD_LIBRARY_PATH "$dir/consumer"
}

# A Meson project: its meson.build is tests/consumers/meson.build.
meson_project() {
  local dir=$1
  mkdir -p "$dir/subprojects"
  cp "$here/meson.build" "$here/consumer.cpp" "$dir/"
}

consumer_meson_pkgconfig() {
  need pkg-config
  local dir=$work/meson-pkgconfig
  meson_project "$dir"
  # No subproject here: dependency('recompose') can only come from pkg-config.
  meson setup "$dir/build" "$dir" --wrap-mode=nofallback -Dpkg_config_path="$pcdir"
  ninja -C "$dir/build" -j "$jobs"
  env -u LD_LIBRARY_PATH "$dir/build/consumer"
}

consumer_meson_subproject() {
  local dir=$work/meson-subproject
  meson_project "$dir"
  # The checkout itself is the subproject (as a git submodule or a wrap would put it there).
  ln -s "$root" "$dir/subprojects/recompose"
  cat >"$dir/subprojects/recompose.wrap" <<EOF
[wrap-git]
url = file://$root
revision = HEAD
[provide]
dependency_names = recompose
EOF
  # --force-fallback-for: never take an installed recompose.pc instead. -Dunity=subprojects: the
  # libraries compile in a few translation units (meson.build), the consumer on its own.
  meson setup "$dir/build" "$dir" --force-fallback-for=recompose -Drecompose:torch_dir="$torch_dir" \
    -Dunity=subprojects
  ninja -C "$dir/build" -j "$jobs" consumer
  # Only the libraries and the consumer: no example, benchmark or test was configured.
  if ninja -C "$dir/build" -t targets all | grep -qE '(^|/)(gpt|test_checkpoint|test_hooks|checkpoint_bench):'; then
    echo "the subproject configured examples, benchmarks or tests"; return 1
  fi
  env -u LD_LIBRARY_PATH "$dir/build/consumer"
}

t0=$SECONDS
run_step install check_install
if [ $failed -eq 0 ]; then
  for c in $which; do
    case $c in
      pkg-config) run_step pkg-config consumer_pkg_config ;;
      cmake) run_step cmake consumer_cmake ;;
      meson-pkgconfig) run_step meson-pkgconfig consumer_meson_pkgconfig ;;
      meson-subproject) run_step meson-subproject consumer_meson_subproject ;;
      *) log "unknown consumer '$c'"; failed=1 ;;
    esac
  done
fi
echo "consumer tests ($((SECONDS - t0)) s):"
for r in "${results[@]}"; do echo "  $r"; done
exit $failed
