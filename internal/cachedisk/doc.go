// Package cachedisk keeps CI cache disks: per cache name, numbered
// committed versions of an ext4 image that jobs clone, write and commit
// back. It is the host side of `--cache NAME=GUESTPATH` and of the CI
// executors' caches; `microvm cache ls|rm` is List and Remove.
//
// Data flow of one job:
//
//	Checkout(name, size)      newest good version --clone--> clones/ID.ext4
//	                          (none: a fresh sparse ext4 of size bytes)
//	the job's VM              writes the clone (its own file, never shared)
//	Commit(clone)             fsync, check, rename clones/ID.ext4 -> vN.ext4,
//	                          write vN.json (the commit point), evict
//	Discard(clone)            remove clones/ID.ext4; the versions are untouched
//
// A job whose process is killed (SIGKILL, a crash) before its Commit or
// Discard leaves its clone behind. reap.go finds such clones: no process
// holds a flock on one (a running VM's block device holds its disk's)
// and none was written for CloneGrace (the stretches of a live job when
// its VM does not hold its clone are far shorter). Each Checkout of the
// name removes them first, as does a commit's eviction walking the store;
// List counts them (Info.Abandoned). A clone that cannot be removed is a
// log line, never a failed checkout.
//
// On disk, under the store's directory (DefaultDir: $MICROVM_STATE_DIR/caches):
//
//	NAME/lock                 flock: commit, eviction and clean-up of NAME
//	NAME/v00000007.ext4       a committed version, never written again
//	NAME/v00000007.json       its manifest (manifest.go): size, allocated
//	                          bytes, SHA-256 of the head, created time
//	NAME/clones/ID.ext4       a job's writable clone, until Commit or Discard
//	                          (or, abandoned by a killed job, the next Checkout)
//	NAME/.*                   temporary files of a commit in progress
//
// A version exists once its manifest does: Commit renames the image into
// place first and writes the manifest last (atomicfile), so a process
// killed in between leaves an image without a manifest, and the next
// operation on NAME (scan, under the lock) removes it with any temporary
// file. A version whose image does not match its manifest (truncated,
// bad ext4 magic, a head that changed) is skipped with one log line and
// removed; the next older good version is used instead.
//
// Clones (clone.go) are reflinks (FICLONE) where the file system shares
// blocks (btrfs, XFS) and sparse copies (SEEK_DATA/SEEK_HOLE plus
// copy_file_range) elsewhere (ext4). Either way a clone is a file of its
// own: evicting or removing the version it came from does not change it,
// so eviction never waits for jobs.
//
// Two jobs committing the same name at once both succeed, one after the
// other under NAME's lock, as successive versions: the later commit is the
// newest version and the one the next job clones; the earlier is kept as
// an older version until evicted. No commit is lost half-way and no
// version is torn.
//
// Limits (evict.go): at most Limits.Versions versions per name (oldest
// removed first) and at most Limits.TotalBytes allocated bytes across the
// store, evicting the oldest versions of any name but never the newest
// version of a name other than by Remove.
//
// Lock order: a name's lock is taken blocking by the operation on that
// name; the locks of other names are only tried (eviction across the
// store skips a name that is busy), so two commits cannot deadlock.
// Checkout holds the lock only to find and open the newest version; it
// copies from the open file after letting go, so jobs checking out at
// once do not queue behind each other's copies.
//
// What the checks catch: a missing or torn manifest, an image of another
// length, a head (superblock and group descriptors) that changed or lost
// its ext4 magic. A flipped bit further in is not looked for (that would
// read the whole image on every use); ext4's own metadata checksums in
// the guest are the check there.
package cachedisk
