package cachedisk

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A version's files: vNNNNNNNN.ext4 and vNNNNNNNN.json in its name's
// directory.
const (
	versionPrefix = "v"
	imageSuffix   = ".ext4"
	manifestExt   = ".json"
	versionDigits = 8
)

// imageName and manifestName are version n's file names.
func imageName(n int) string {
	return fmt.Sprintf("%s%0*d%s", versionPrefix, versionDigits, n, imageSuffix)
}
func manifestName(n int) string {
	return fmt.Sprintf("%s%0*d%s", versionPrefix, versionDigits, n, manifestExt)
}

// parseVersion reads the version number and kind (imageSuffix or
// manifestExt) of a version's file name; ok is false for any other name.
func parseVersion(file string) (n int, ext string, ok bool) {
	for _, e := range []string{imageSuffix, manifestExt} {
		s, found := strings.CutSuffix(file, e)
		if !found {
			continue
		}
		d, found := strings.CutPrefix(s, versionPrefix)
		if !found || len(d) != versionDigits {
			return 0, "", false
		}
		n, err := strconv.Atoi(d)
		if err != nil || n < 1 || d[0] == '+' || d[0] == '-' {
			return 0, "", false
		}
		return n, e, true
	}
	return 0, "", false
}

// manifest describes a committed version; it is written after the image,
// and its presence is what makes the version exist.
type manifest struct {
	Version int `json:"version"`
	// Size is the image's length in bytes (its file is sparse).
	Size int64 `json:"size"`
	// Allocated is what the image takes on the host's disk.
	Allocated int64 `json:"allocated"`
	// HeadSHA256 is the SHA-256 of the image's first headLen bytes: the
	// ext4 superblock and group descriptors, which a torn or foreign file
	// does not keep.
	HeadSHA256 string    `json:"head_sha256"`
	Created    time.Time `json:"created"`
	// Base is the version the job cloned; 0 for a fresh disk.
	Base int `json:"base"`
}

// maxManifest bounds a manifest file's size.
const maxManifest = 4096

// headLen is how much of an image the manifest's checksum covers.
const headLen = 64 << 10

// ext4's superblock starts at byte 1024; its magic is the little-endian
// 16-bit word 56 bytes in.
const (
	ext4MagicOff = 1024 + 56
	ext4Magic    = 0xEF53
)

// errCorrupt marks a version or clone that is not a whole ext4 image.
var errCorrupt = errors.New("corrupt")

// describe reads what a manifest holds about the image at path: its size,
// allocated bytes and head checksum, after checking it is ext4.
func describe(path string) (manifest, error) {
	var m manifest
	f, err := os.Open(path)
	if err != nil {
		return m, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return m, err
	}
	m.Size = fi.Size()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		m.Allocated = st.Blocks * 512
	}
	if m.Size < headLen {
		return m, fmt.Errorf("%w: %d bytes, too short for ext4", errCorrupt, m.Size)
	}
	head := make([]byte, headLen)
	if _, err := io.ReadFull(f, head); err != nil {
		return m, fmt.Errorf("%w: reading its head: %v", errCorrupt, err)
	}
	if magic := binary.LittleEndian.Uint16(head[ext4MagicOff:]); magic != ext4Magic {
		return m, fmt.Errorf("%w: no ext4 superblock (magic %#04x)", errCorrupt, magic)
	}
	sum := sha256.Sum256(head)
	m.HeadSHA256 = hex.EncodeToString(sum[:])
	return m, nil
}

// readManifest reads version n's manifest in dir.
func readManifest(dir string, n int) (manifest, error) {
	var m manifest
	f, err := os.Open(filepath.Join(dir, manifestName(n)))
	if err != nil {
		return m, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxManifest+1))
	if err != nil {
		return m, err
	}
	if len(b) > maxManifest {
		return m, fmt.Errorf("%w: manifest over %d bytes", errCorrupt, maxManifest)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: manifest: %v", errCorrupt, err)
	}
	if m.Version != n {
		return m, fmt.Errorf("%w: manifest names version %d", errCorrupt, m.Version)
	}
	return m, nil
}

// verify checks version n in dir against its manifest: the image is there,
// is ext4, has the manifest's size and the same head. It returns the
// manifest; an error wrapping errCorrupt is a version to remove.
func verify(dir string, n int) (manifest, error) {
	m, err := readManifest(dir, n)
	if err != nil {
		return m, err
	}
	got, err := describe(filepath.Join(dir, imageName(n)))
	if errors.Is(err, os.ErrNotExist) {
		return m, fmt.Errorf("%w: its image is missing", errCorrupt)
	}
	if err != nil {
		return m, err
	}
	if got.Size != m.Size {
		return m, fmt.Errorf("%w: %d bytes, its manifest says %d", errCorrupt, got.Size, m.Size)
	}
	if got.HeadSHA256 != m.HeadSHA256 {
		return m, fmt.Errorf("%w: its ext4 head does not match its manifest", errCorrupt)
	}
	m.Allocated = got.Allocated
	return m, nil
}
