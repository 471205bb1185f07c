# scripts/lib/artefact-cache.sh: the cache of slow artefacts (kernels,
# Debian images), sourced by the scripts that build them. An entry is a
# directory $root/KIND/KEY holding the artefact's files and SHA256SUMS,
# where KEY is the hash of everything the artefact is built from (sources,
# configuration, the script, tool versions): a second clone on the same
# machine finds it, and a changed input makes another key, so it rebuilds
# exactly what that input feeds. docs/testing.md, "The artefact cache".
#
#   root      $MICROVM_CACHE_DIR, else $XDG_CACHE_HOME/microvm, else
#             ~/.cache/microvm (make clean-cache empties it; an entry
#             unused for 30 days is removed when its kind is next stored)
#
# An entry is written in a temporary directory beside it and renamed into
# place whole, SHA256SUMS last, so a reader never sees half of one, and of
# two runs storing the same key one wins and the other's copy is dropped.
# Reading checks every file against SHA256SUMS; an entry that fails (a
# disk fault, a hand edit) is removed with one line and the artefact is
# built again. A cache that cannot be written (a full disk, a read-only
# home) costs the next run a build, never this one its result.

artefact_cache_root() {
	printf '%s\n' "${MICROVM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/microvm}"
}

# artefact_key: the sha256 of standard input, for a KEY.
artefact_key() {
	sha256sum | cut -d' ' -f1
}

# artefact_get KIND KEY: prints the entry's directory and succeeds when the
# entry is there and whole; a corrupt one is removed.
artefact_get() {
	local entry
	entry="$(artefact_cache_root)/$1/$2"
	[[ -d "$entry" ]] || return 1
	# An entry appears by a rename with its SHA256SUMS inside, so one
	# without it is not a store in progress but a damaged entry, which
	# would otherwise stand in the way of every later store of the key.
	if [[ ! -f "$entry/SHA256SUMS" ]] || ! (cd "$entry" && sha256sum --quiet --strict -c SHA256SUMS) >/dev/null 2>&1; then
		printf 'cache: %s/%s does not match its SHA256SUMS; removing it and building again\n' "$1" "$2" >&2
		# Renamed first, so that a reader at the same time sees it gone
		# rather than half removed.
		mv -T "$entry" "$entry.bad.$$" 2>/dev/null && rm -rf "$entry.bad.$$"
		return 1
	fi
	touch "$entry" 2>/dev/null || true # last use, for the pruning in artefact_put
	printf '%s\n' "$entry"
}

# artefact_put KIND KEY FILE...: stores the FILEs (under their base names)
# as the entry KIND/KEY, unless it is there already. Never fails the caller.
artefact_put() {
	local kind=$1 key=$2 dir tmp f
	shift 2
	dir="$(artefact_cache_root)/$kind"
	if [[ -f "$dir/$key/SHA256SUMS" ]]; then
		return 0
	fi
	# (Callers run under set -e: nothing here may fail.) Leftovers of
	# runs killed while storing, a day old, and entries unused for 30
	# days (their inputs changed: another key took their place) go.
	if [[ -d "$dir" ]]; then
		find "$dir" -mindepth 1 -maxdepth 1 -name '.tmp-*' -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
		find "$dir" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -mtime +30 -exec rm -rf {} + 2>/dev/null || true
	fi
	if ! mkdir -p "$dir" 2>/dev/null || ! tmp=$(mktemp -d "$dir/.tmp-$key.XXXXXX" 2>/dev/null); then
		printf 'cache: cannot write %s; not cached\n' "$dir" >&2
		return 0
	fi
	for f; do
		if ! cp "$f" "$tmp/" 2>/dev/null; then
			printf 'cache: storing %s in %s failed (disk full?); not cached\n' "$(basename "$f")" "$dir" >&2
			rm -rf "$tmp"
			return 0
		fi
	done
	if ! (cd "$tmp" && sha256sum -- * >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS) 2>/dev/null; then
		printf 'cache: storing %s/%s failed (disk full?); not cached\n' "$kind" "$key" >&2
		rm -rf "$tmp"
		return 0
	fi
	# Fails when another run stored the key first: its entry stays.
	if mv -T "$tmp" "$dir/$key" 2>/dev/null; then
		printf 'cache: stored %s/%s\n' "$kind" "$key" >&2
	else
		rm -rf "$tmp"
	fi
	return 0
}

# artefact_copy ENTRY NAME DEST: copies the entry's file NAME to DEST
# through a temporary file beside it.
artefact_copy() {
	cp "$1/$2" "$3.tmp.$$" && mv "$3.tmp.$$" "$3"
}
