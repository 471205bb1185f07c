#!/usr/bin/env bash
# Build the microvm guest kernel: Debian's linux-source-6.1, `make tinyconfig`,
# then guest/kernel/microvm.config merged on top and `make olddefconfig`.
#
# Usage: guest/kernel/build.sh [OUTDIR [FRAGMENT [TARGET...]]]
#
# OUTDIR defaults to build/kernel in the repository, FRAGMENT to
# guest/kernel/microvm.config, TARGETs to "vmlinux bzImage". Writes each
# TARGET into OUTDIR (vmlinux: the PVH-bootable ELF). The nested-KVM box's L1
# kernel is the same build with guest/kvmbox/l1.config and bzImage only
# (`make kvmbox`). The kernel source is extracted once into
# build/kernel-cache/src and built out of tree in build/kernel-cache/obj-NAME
# (NAME: the fragment's file name without .config), so a rebuild after a
# fragment change is incremental. When OUTDIR already holds every target and a
# stamp matching the hash of the fragment and of this script, nothing is done;
# when the artefact cache (scripts/lib/artefact-cache.sh, ~/.cache/microvm)
# holds a kernel built from the same inputs, it is copied.
#
# Environment: JOBS (default: nproc) sets make's parallelism.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
outdir="${1:-$root/build/kernel}" # an explicit OUTDIR is relative to the current directory
case "$outdir" in
/*) ;;
*) outdir="$PWD/$outdir" ;;
esac
fragment="${2:-$here/microvm.config}"
[[ -f "$fragment" ]] || { printf 'kernel: error: no fragment %s\n' "$fragment" >&2; exit 1; }
fragment="$(cd "$(dirname "$fragment")" && pwd)/$(basename "$fragment")"
targets=("${@:3}")
((${#targets[@]})) || targets=(vmlinux bzImage)
for t in "${targets[@]}"; do
	case "$t" in
	vmlinux | bzImage) ;;
	*) printf 'kernel: error: unknown target %s (vmlinux or bzImage)\n' "$t" >&2; exit 1 ;;
	esac
done
name="$(basename "$fragment" .config)"
cache="$root/build/kernel-cache"
srcdir="$cache/src"
objdir="$cache/obj-$name"
series="6.1"
tarball="/usr/src/linux-source-$series.tar.xz"
jobs="${JOBS:-$(nproc)}"

log() { printf 'kernel: %s\n' "$*" >&2; }
die() {
	printf 'kernel: error: %s\n' "$*" >&2
	exit 1
}

# --- Cache check -------------------------------------------------------------
stamp_want="$( (cat "$fragment" "${BASH_SOURCE[0]}"; echo "${targets[*]}") | sha256sum | cut -d' ' -f1)"
stamp_file="$outdir/.build-stamp"
have_all=true
for t in "${targets[@]}"; do [[ -f "$outdir/$t" ]] || have_all=false; done
if $have_all && [[ -f "$stamp_file" ]] && [[ "$(cat "$stamp_file")" == "$stamp_want" ]]; then
	log "up to date: ${targets[*]} in $outdir (stamp $stamp_want)"
	exit 0
fi

# --- The artefact cache (scripts/lib/artefact-cache.sh) -------------------------
# Keyed on the fragment, this script, the targets, the kernel source
# package's version and the compiler: a second clone on this machine copies
# the kernel instead of building it.
. "$root/scripts/lib/artefact-cache.sh"
cache_key() {
	{
		cat "$fragment" "${BASH_SOURCE[0]}"
		echo "${targets[*]}"
		dpkg-query -W -f='${Version}\n' "linux-source-$series" 2>/dev/null || echo "no linux-source-$series"
		gcc --version 2>/dev/null | head -n 1
	} | artefact_key
}
if entry=$(artefact_get kernel "$name-$(cache_key)"); then
	mkdir -p "$outdir"
	for t in "${targets[@]}" config; do
		artefact_copy "$entry" "$t" "$outdir/$t" || die "copying $t from the cache $entry failed"
	done
	printf '%s\n' "$stamp_want" >"$stamp_file"
	log "from the cache: ${targets[*]} in $outdir ($entry)"
	exit 0
fi

# --- Build dependencies --------------------------------------------------------
have_deps() {
	[[ -f "$tarball" ]] &&
		command -v flex >/dev/null && command -v bison >/dev/null &&
		command -v bc >/dev/null && command -v make >/dev/null &&
		command -v gcc >/dev/null &&
		[[ -f /usr/include/libelf.h && -f /usr/include/openssl/opensslv.h ]]
}
if ! have_deps; then
	"$root/scripts/deps" kernel || die "missing build dependencies (scripts/deps kernel)"
	have_deps || die "dependencies still missing after install (expected $tarball, flex, bison, bc, libelf.h, openssl headers)"
fi

# --- Source, extracted once ----------------------------------------------------
# Two builds (the test kernel and the box's L1) may start at once.
mkdir -p "$cache"
exec 9>"$cache/.extract.lock"
flock 9
if [[ ! -f "$srcdir/.extracted" ]]; then
	log "extracting $tarball into $srcdir (once)"
	rm -rf "$srcdir" "$srcdir.tmp"
	mkdir -p "$srcdir.tmp"
	tar -C "$srcdir.tmp" --strip-components=1 -xf "$tarball"
	touch "$srcdir.tmp/.extracted"
	mv "$srcdir.tmp" "$srcdir"
fi
flock -u 9

# One build per object directory at a time (make kernel from a test and from
# make test may overlap); the second waits, then finds the stamp current.
exec 8>"$cache/.build-$name.lock"
flock 8
if [[ -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_want" ]]; then
	have_all=true
	for t in "${targets[@]}"; do [[ -f "$outdir/$t" ]] || have_all=false; done
	if $have_all; then
		log "built meanwhile by another process: ${targets[*]} in $outdir"
		exit 0
	fi
fi

# --- Configuration ---------------------------------------------------------------
# Reproducible identification strings in the image.
export KBUILD_BUILD_USER=microvm KBUILD_BUILD_HOST=microvm
export KBUILD_BUILD_TIMESTAMP="${KBUILD_BUILD_TIMESTAMP:-1970-01-01}"
kmake() { make -s -C "$srcdir" O="$objdir" ARCH=x86_64 "$@"; }

mkdir -p "$objdir"
log "configuring: tinyconfig + $(basename "$fragment") + olddefconfig"
kmake tinyconfig >/dev/null
"$srcdir/scripts/kconfig/merge_config.sh" -m -O "$objdir" "$objdir/.config" "$fragment" >/dev/null
kmake olddefconfig >/dev/null

# Every line of the fragment must have survived dependency resolution: a silently
# dropped option (unmet dependency, renamed symbol) is the usual way a guest
# kernel ends up without a console or without vsock.
missing=()
while IFS= read -r line; do
	if [[ "$line" =~ ^(CONFIG_[A-Za-z0-9_]+)=(.*)$ ]]; then
		grep -qxF -- "$line" "$objdir/.config" ||
			missing+=("$line (got: $(grep -E "^(# )?${BASH_REMATCH[1]}[= ]" "$objdir/.config" || echo 'absent'))")
	elif [[ "$line" =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
		! grep -qE "^${BASH_REMATCH[1]}=" "$objdir/.config" ||
			missing+=("$line (got: $(grep -E "^${BASH_REMATCH[1]}=" "$objdir/.config"))")
	fi
done <"$fragment"
if ((${#missing[@]})); then
	printf 'kernel: error: options in %s not set as asked:\n' "$fragment" >&2
	printf '  %s\n' "${missing[@]}" >&2
	exit 1
fi
log "all $(grep -cE '^(CONFIG_|# CONFIG_.* is not set)' "$fragment") fragment options verified"

# --- Build ------------------------------------------------------------------------
log "building ${targets[*]} with make -j$jobs (minutes on 2 CPUs)"
start=$SECONDS
kmake -j"$jobs" "${targets[@]}"
log "built in $((SECONDS - start)) s"

mkdir -p "$outdir"
for t in "${targets[@]}"; do
	src="$objdir/vmlinux"
	[[ "$t" == bzImage ]] && src="$objdir/arch/x86/boot/bzImage"
	cp "$src" "$outdir/$t.tmp" && mv "$outdir/$t.tmp" "$outdir/$t"
	log "wrote $outdir/$t ($(stat -c %s "$outdir/$t") bytes)"
done
cp "$objdir/.config" "$outdir/config"
printf '%s\n' "$stamp_want" >"$stamp_file"
cached=()
for t in "${targets[@]}" config; do cached+=("$outdir/$t"); done
artefact_put kernel "$name-$(cache_key)" "${cached[@]}"
