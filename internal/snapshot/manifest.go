package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The format's identity.
const (
	// FormatName is the manifest's "format": what marks a directory as a
	// microvm snapshot.
	FormatName = "microvm-snapshot"
	// Version is the newest format version this package writes and reads.
	// Open refuses a greater one (ErrNewerVersion).
	Version = 1
	// ManifestFile is the manifest's name inside the snapshot directory.
	ManifestFile = "manifest.json"
	// PageSize is the granule of memory parts: a page is a hole or data,
	// dirty or clean, as a whole. Memory sizes are multiples of it.
	PageSize = 4096
)

// Bounds on what Open accepts, so that a snapshot from an untrusted place
// cannot make it allocate or read without limit. Writer enforces the same.
const (
	// MaxManifestSize is the largest manifest.json read.
	MaxManifestSize = 1 << 20
	// MaxParts is the most parts a snapshot holds.
	MaxParts = 256
	// MaxStateSize is the largest state part; Open reads every state part
	// into memory (at most maxStateTotal bytes in all).
	MaxStateSize = 64 << 20
	// MaxMemorySize is the largest memory part (and memory diff's guest
	// size), and the largest blob; package guestmem's bound on a region.
	MaxMemorySize = 1 << 46

	maxStateTotal = 256 << 20
	maxNameLen    = 64 // part names
	maxFileLen    = 80 // part file names: a name and an extension
	maxMetadata   = 256
	maxMetaKey    = 128
	maxMetaValue  = 4096
)

// Kind says how a part is encoded and when its checksum is checked.
type Kind string

// The kinds of part.
const (
	// KindState is one JSON document (Writer.AddState, Snapshot.State);
	// Open checks its SHA-256.
	KindState Kind = "state"
	// KindBlob is opaque bytes (Writer.AddFile, Snapshot.File), checked
	// as Snapshot.File's reader reaches the end.
	KindBlob Kind = "blob"
	// KindMemory is guest memory as a sparse file of the guest's size
	// (Writer.AddMemory, Snapshot.MapMemory), checked by Verify alone.
	KindMemory Kind = "memory"
	// KindMemoryDiff is the pages of guest memory dirtied since a base
	// snapshot (Writer.AddMemoryDiff, Snapshot.ApplyDiff), checked as
	// ApplyDiff reads it.
	KindMemoryDiff Kind = "memory-diff"
)

// Manifest is manifest.json: what the snapshot holds. Fields that change
// how a part is read come with a new Version; a reader ignores fields it
// does not know, so a newer writer may add informational ones without one.
type Manifest struct {
	Format  string    `json:"format"`  // FormatName
	Version int       `json:"version"` // Version when written
	Created time.Time `json:"created"`
	// Metadata is the caller's: microvm version, guest memory size, CPU
	// vendor, the machine's configuration. Not interpreted here.
	Metadata map[string]string `json:"metadata,omitempty"`
	Parts    []Part            `json:"parts"`
}

// Part is one entry of the manifest: a file in the snapshot directory.
type Part struct {
	Name string `json:"name"` // unique in the snapshot; [A-Za-z0-9._-], no ".."
	File string `json:"file"` // its file in the directory: a plain name, unique
	Kind Kind   `json:"kind"`
	Size int64  `json:"size"` // of the file, in bytes
	// SHA256 is the hex SHA-256 of the file's bytes, except for
	// KindMemory: the digest of the memory's content, see memDigest.
	SHA256 string `json:"sha256"`

	// MemorySize is the guest memory's size (KindMemory: equal to Size;
	// KindMemoryDiff: the size of the memory it applies to).
	MemorySize int64 `json:"memory_size,omitempty"`
	// DataBytes is, for KindMemory, how many bytes of non-zero pages were
	// written; the rest of the file is holes.
	DataBytes int64 `json:"data_bytes,omitempty"`
	// Pages is, for KindMemoryDiff, how many pages it holds.
	Pages int64 `json:"pages,omitempty"`
	// Base is, for KindMemoryDiff, the digest (Snapshot.Digest) of the
	// snapshot it was taken against.
	Base string `json:"base,omitempty"`
}

// bitmapBytes is the size of the dirty bitmap of a memory of size bytes:
// one bit a page, in whole 64-bit words as KVM_GET_DIRTY_LOG fills it.
func bitmapBytes(size int64) int64 {
	return (size/PageSize + 63) / 64 * 8
}

// parseManifest decodes and bounds-checks a manifest. The format name and
// version are read first, alone, so that a newer format with a different
// shape is refused as newer, not as malformed.
func parseManifest(data []byte) (*Manifest, error) {
	if len(data) > MaxManifestSize {
		return nil, fmt.Errorf("%w: manifest of %d bytes, more than %d", ErrFormat, len(data), MaxManifestSize)
	}
	var head struct {
		Format  string      `json:"format"`
		Version json.Number `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrFormat, err)
	}
	if head.Format != FormatName {
		return nil, fmt.Errorf("%w: manifest format %.64q, want %q", ErrFormat, head.Format, FormatName)
	}
	if err := checkVersion(head.Version); err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrFormat, err)
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// checkVersion accepts versions 1 to Version. A larger integer, however
// large, is ErrNewerVersion; anything else ErrFormat.
func checkVersion(n json.Number) error {
	s := n.String()
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return fmt.Errorf("%w: manifest version %.32q is not a positive integer", ErrFormat, s)
	}
	v, err := n.Int64()
	switch {
	case err != nil || v > Version: // err: more digits than an int64 holds
		return fmt.Errorf("%w: version %.32s, this microvm reads versions up to %d", ErrNewerVersion, s, Version)
	case v < 1:
		return fmt.Errorf("%w: manifest version %d", ErrFormat, v)
	}
	return nil
}

// validate checks every field against the format's rules and bounds.
func (m *Manifest) validate() error {
	if len(m.Metadata) > maxMetadata {
		return fmt.Errorf("%w: %d metadata entries, more than %d", ErrFormat, len(m.Metadata), maxMetadata)
	}
	for k, v := range m.Metadata {
		if err := checkMeta(k, v); err != nil {
			return err
		}
	}
	if len(m.Parts) > MaxParts {
		return fmt.Errorf("%w: %d parts, more than %d", ErrFormat, len(m.Parts), MaxParts)
	}
	names := make(map[string]bool, len(m.Parts))
	files := make(map[string]bool, len(m.Parts))
	var stateTotal int64
	for i := range m.Parts {
		p := &m.Parts[i]
		if err := p.validate(); err != nil {
			return fmt.Errorf("%w: part %.64q (%.80q): %v", ErrFormat, p.Name, p.File, err)
		}
		if names[p.Name] {
			return fmt.Errorf("%w: part name %q twice", ErrFormat, p.Name)
		}
		if files[p.File] {
			return fmt.Errorf("%w: file %q in two parts", ErrFormat, p.File)
		}
		names[p.Name], files[p.File] = true, true
		if p.Kind == KindState {
			if stateTotal += p.Size; stateTotal > maxStateTotal {
				return fmt.Errorf("%w: state parts of more than %d bytes in all", ErrFormat, maxStateTotal)
			}
		}
	}
	return nil
}

// checkMeta bounds one metadata entry.
func checkMeta(k, v string) error {
	if k == "" || len(k) > maxMetaKey || len(v) > maxMetaValue {
		return fmt.Errorf("%w: metadata %.32q: keys are 1 to %d bytes, values at most %d", ErrFormat, k, maxMetaKey, maxMetaValue)
	}
	return nil
}

// validate checks one part's fields (the caller adds ErrFormat and the
// part's name); the sizes must be consistent with
// its kind, so that a file of Size bytes is all a reader ever reads.
func (p *Part) validate() error {
	if err := checkName(p.Name, maxNameLen); err != nil {
		return fmt.Errorf("name %v", err)
	}
	if err := checkName(p.File, maxFileLen); err != nil {
		return fmt.Errorf("file %v", err)
	}
	if strings.EqualFold(p.File, ManifestFile) {
		return errors.New("file is the manifest")
	}
	if !isDigest(p.SHA256) {
		return fmt.Errorf("sha256 %.80q is not 64 lower-case hex digits", p.SHA256)
	}
	if p.Size < 0 {
		return fmt.Errorf("size %d", p.Size)
	}
	switch p.Kind {
	case KindState:
		if p.Size > MaxStateSize {
			return fmt.Errorf("state of %d bytes, more than %d", p.Size, MaxStateSize)
		}
	case KindBlob:
		if p.Size > MaxMemorySize {
			return fmt.Errorf("blob of %d bytes, more than %d", p.Size, MaxMemorySize)
		}
	case KindMemory:
		if err := checkMemorySize(p.Size); err != nil {
			return err
		}
		if p.MemorySize != p.Size {
			return fmt.Errorf("memory_size %d, size %d", p.MemorySize, p.Size)
		}
		if p.DataBytes < 0 || p.DataBytes > p.Size || p.DataBytes%PageSize != 0 {
			return fmt.Errorf("data_bytes %d of %d", p.DataBytes, p.Size)
		}
	case KindMemoryDiff:
		if err := checkMemorySize(p.MemorySize); err != nil {
			return err
		}
		if p.Pages < 0 || p.Pages > p.MemorySize/PageSize {
			return fmt.Errorf("%d pages of a memory of %d", p.Pages, p.MemorySize)
		}
		if want := bitmapBytes(p.MemorySize) + p.Pages*PageSize; p.Size != want {
			return fmt.Errorf("size %d, want %d for %d pages", p.Size, want, p.Pages)
		}
		if !isDigest(p.Base) {
			return fmt.Errorf("base %.80q is not a snapshot digest", p.Base)
		}
	default:
		return fmt.Errorf("unknown kind %.32q", p.Kind)
	}
	return nil
}

// checkName accepts 1 to max bytes of [A-Za-z0-9._-] starting with a
// letter or digit and holding no "..": a plain file name that cannot be
// ".", "..", hidden or a path.
func checkName(s string, max int) error {
	if s == "" || len(s) > max {
		return fmt.Errorf("%.80q: want 1 to %d bytes", s, max)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("%.80q: want letters, digits, '.', '_' and '-', starting with a letter or digit", s)
		}
	}
	if strings.Contains(s, "..") {
		return fmt.Errorf("%q holds \"..\"", s)
	}
	return nil
}

// checkMemorySize accepts a guest memory size: whole pages, at least one,
// at most MaxMemorySize.
func checkMemorySize(n int64) error {
	if n <= 0 || n > MaxMemorySize || n%PageSize != 0 {
		return fmt.Errorf("memory of %d bytes: want a multiple of %d from %d to %d", n, PageSize, PageSize, int64(MaxMemorySize))
	}
	return nil
}

// isDigest reports whether s is a hex SHA-256 as this package writes one.
func isDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
