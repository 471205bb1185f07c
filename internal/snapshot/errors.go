package snapshot

import (
	"errors"
	"fmt"
)

// Sentinel errors, for errors.Is. Each is returned wrapped in a message that
// names the snapshot directory and, where one is at fault, the part and its
// file ("snapshot /s: part "ram" (ram.mem): truncated: ...").
var (
	// ErrFormat: the directory is not a microvm snapshot, or its manifest
	// is malformed, out of bounds or names an unsafe file.
	ErrFormat = errors.New("not a valid microvm snapshot")
	// ErrNewerVersion: the snapshot's format version is newer than Version;
	// a newer microvm wrote it.
	ErrNewerVersion = errors.New("snapshot format version newer than this microvm reads")
	// ErrTruncated: a part's file is missing or shorter than the manifest
	// says (a partial copy, a full disk).
	ErrTruncated = errors.New("truncated")
	// ErrCorrupt: a part's content does not match its checksum, or its
	// file is longer than the manifest says.
	ErrCorrupt = errors.New("corrupt")
	// ErrExists: Commit's target holds something already and Overwrite was
	// not asked for (or it is not a snapshot, which Overwrite never
	// replaces).
	ErrExists = errors.New("target exists")
	// ErrWrongBase: a memory diff applied onto a snapshot other than the
	// one it was taken against.
	ErrWrongBase = errors.New("diff belongs to another base snapshot")
	// ErrNoPart: the snapshot has no part of that name (or of that kind).
	ErrNoPart = errors.New("no such part")
)

// partErrorf returns an error naming the snapshot directory, the part and
// its file, then the message.
func partErrorf(dir string, p *Part, format string, args ...any) error {
	return fmt.Errorf("snapshot %s: part %q (%s): %w", dir, p.Name, p.File, fmt.Errorf(format, args...))
}
