package image

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
)

// Errors a caller can tell apart with errors.Is.
var (
	// ErrNotFound: no stored image has the name or ID asked for, or the
	// registry has no such repository or tag.
	ErrNotFound = errors.New("image not found")

	// ErrAuth: the registry asked for credentials, or refused the ones it
	// was given.
	ErrAuth = errors.New("registry requires authentication")

	// ErrDigest: bytes read do not match the digest that names them (a
	// layer blob against the manifest, or an uncompressed layer against
	// the config's diff_ids).
	ErrDigest = errors.New("content does not match its digest")

	// ErrLimit: the image needs more than Options allow (bytes unpacked,
	// tar entries, metadata held in memory); the error is a *LimitError
	// that says which limit.
	ErrLimit = errors.New("image exceeds a limit")
)

// Default limits on what one image may unpack to. Layer digests do not
// bound it: whoever makes the image chooses them, and a small gzipped
// layer can expand a thousandfold (a run of zeros), a PAX sparse entry
// without bound (it declares its own size), so the store's disk fills
// before anything else stops it. The defaults are far above real images
// (CUDA and ML images unpack to 10-30 GiB and 100,000-500,000 files) and
// far below what would wreck a host; conversion needs about twice
// DefaultMaxBytes of disk at its peak (the staged tree and the ext4).
const (
	// DefaultMaxBytes bounds the layers' uncompressed tar stream and,
	// separately, the files written from it, each file counted at its
	// full size (a sparse entry's holes count).
	DefaultMaxBytes int64 = 64 << 30
	// DefaultMaxEntries bounds the tar entries read from the layers;
	// each costs an inode, and memory until the image is converted.
	DefaultMaxEntries int64 = 1_000_000
	// DefaultMaxMetaBytes bounds what unpacking holds in memory until
	// the end: xattrs, and the names of directories and hard links
	// (about 100 bytes an entry in real images).
	DefaultMaxMetaBytes int64 = 1 << 30
)

// Limit names, as LimitError.Limit gives them: the Options field that
// raises each.
const (
	LimitBytes     = "MaxBytes"
	LimitEntries   = "MaxEntries"
	LimitMetaBytes = "MaxMetaBytes"
)

// LimitError is an image refused for going past one of Options' limits.
// errors.Is(err, ErrLimit) holds for it.
type LimitError struct {
	Limit string // LimitBytes, LimitEntries or LimitMetaBytes
	Max   int64  // the limit that applied
	What  string // what went past it, e.g. "the layers' files"
}

func (e *LimitError) Error() string {
	max := fmt.Sprintf("%d bytes", e.Max)
	switch {
	case e.Limit == LimitEntries:
		max = fmt.Sprintf("%d entries", e.Max)
	case e.Max >= 1<<30 && e.Max%(1<<30) == 0:
		max = fmt.Sprintf("%d GiB", e.Max>>30)
	case e.Max >= 1<<20 && e.Max%(1<<20) == 0:
		max = fmt.Sprintf("%d MiB", e.Max>>20)
	}
	return fmt.Sprintf("%s: %s go past %s (%s)", ErrLimit, e.What, max, e.Limit)
}

func (e *LimitError) Is(target error) bool { return target == ErrLimit }

// authHint is appended to ErrAuth errors: it says where credentials come
// from.
const authHint = "log in with `%s` (credentials are read from $DOCKER_CONFIG/config.json, by default ~/.docker/config.json)"

// Config is the part of an image's configuration a VM needs to run it.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	// User is the image's user as written in its config ("", "name",
	// "uid", "name:group", "uid:gid"); UID and GID are what it resolved
	// to against the image's own /etc/passwd and /etc/group.
	User       string   `json:"user,omitempty"`
	UID        uint32   `json:"uid"`
	GID        uint32   `json:"gid"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Image is one stored image: a read-only ext4 root filesystem and what
// was learnt about it on the way in.
type Image struct {
	// ID is the hex of the image config's sha256 digest; it names the
	// image's directory in the store.
	ID string `json:"id"`
	// Refs are the normalized names pointing at the image, sorted
	// (e.g. index.docker.io/library/debian:12).
	Refs []string `json:"refs,omitempty"`
	// Digest is the manifest's digest ("sha256:..."), or "" for an image
	// imported from a docker save archive (which carries no manifest).
	Digest string `json:"digest,omitempty"`
	// Rootfs is the absolute path of the ext4 file (mode 0444).
	Rootfs string `json:"rootfs"`
	// Size is the ext4 file's apparent size in bytes; ContentBytes is the
	// total size of the regular files in it.
	Size         int64     `json:"size"`
	ContentBytes int64     `json:"contentBytes"`
	Created      time.Time `json:"created"`  // when stored
	Platform     string    `json:"platform"` // e.g. linux/amd64
	Config       Config    `json:"config"`
	// Skipped counts tar entries not created: device nodes, FIFOs,
	// unknown entry types, and hard links whose target an upper layer
	// deleted.
	Skipped int `json:"skipped,omitempty"`
	// MetaSkipped counts files whose owner, mode or xattrs could not be
	// set because debugfs cannot parse their path (it holds a newline or a
	// carriage return) or an xattr name.
	MetaSkipped int `json:"metaSkipped,omitempty"`
}

// ShortID is the first 12 hex digits of the ID, as ls shows it.
func (im *Image) ShortID() string {
	if len(im.ID) > 12 {
		return im.ID[:12]
	}
	return im.ID
}

// Progress phases.
const (
	PhaseDownload = "download" // Pull: layer bytes received (compressed)
	PhaseRead     = "read"     // Import: layer bytes read from the archive
	PhaseConvert  = "convert"  // building the ext4: Done of Total steps
)

// Progress reports how far a Pull or Import is. Total is 0 when unknown.
type Progress struct {
	Phase       string
	Done, Total int64
}

// DefaultPlatform is the platform picked from a multi-platform index when
// Options.Platform is empty.
const DefaultPlatform = "linux/amd64"

// Options tune Pull and Import. The zero value is ready to use.
type Options struct {
	// Platform selects from a multi-platform index: "os/arch[/variant]";
	// DefaultPlatform when empty.
	Platform string
	// Progress, when set, is called as the work advances, from one
	// goroutine at a time, never after Pull or Import returns.
	Progress func(Progress)
	// Keychain gives registry credentials; authn.DefaultKeychain
	// (docker's config.json and credential helpers) when nil.
	Keychain authn.Keychain
	// Logf, when set, receives warnings (entries skipped, metadata that
	// could not be applied).
	Logf func(format string, args ...any)

	// MaxBytes, MaxEntries and MaxMetaBytes bound what an image may
	// unpack to (DefaultMaxBytes and the others say what each counts);
	// 0 takes the default, a negative value removes the limit. An image
	// past one is refused with a *LimitError and nothing of it is kept.
	MaxBytes     int64
	MaxEntries   int64
	MaxMetaBytes int64
}

// limits are o's limits with the defaults filled in; math.MaxInt64 for
// none.
func (o *Options) limits() (maxBytes, maxEntries, maxMeta int64) {
	pick := func(v, def int64) int64 {
		switch {
		case v == 0:
			return def
		case v < 0:
			return math.MaxInt64
		}
		return v
	}
	return pick(o.MaxBytes, DefaultMaxBytes), pick(o.MaxEntries, DefaultMaxEntries), pick(o.MaxMetaBytes, DefaultMaxMetaBytes)
}

func (o *Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

func (o *Options) keychain() authn.Keychain {
	if o.Keychain != nil {
		return o.Keychain
	}
	return authn.DefaultKeychain
}
