package initramfs

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strings"
)

// Magic is the newc format's magic number, the first six bytes of every header.
const Magic = "070701"

// HeaderSize is the size of a newc header before the path name.
const HeaderSize = 110

// Trailer is the path name of the entry that ends every archive.
const Trailer = "TRAILER!!!"

// File type bits of Header.Mode, as in the kernel's <linux/stat.h>.
const (
	TypeMask    = 0o170000
	TypeDir     = 0o040000
	TypeRegular = 0o100000
	TypeSymlink = 0o120000
	TypeChar    = 0o020000
	TypeBlock   = 0o060000
	TypeFIFO    = 0o010000
	TypeSocket  = 0o140000
)

// Header is one newc header. Field names follow the c_* fields of the format;
// every field is written as eight hexadecimal digits and must fit in 32 bits.
type Header struct {
	Ino       uint32
	Mode      uint32 // file type bits | permission bits
	UID       uint32
	GID       uint32
	NLink     uint32
	MTime     uint32 // seconds since the epoch
	FileSize  uint32 // length of the data that follows the name
	DevMajor  uint32 // device holding the file (unused by the kernel)
	DevMinor  uint32
	RDevMajor uint32 // for device nodes: the device they name
	RDevMinor uint32
	NameSize  uint32 // length of the name including its NUL
	Check     uint32 // checksum; always 0 in "070701" archives
}

// Encode returns the 110-byte header.
func (h *Header) Encode() []byte {
	b := make([]byte, 0, HeaderSize)
	b = append(b, Magic...)
	for _, v := range [...]uint32{
		h.Ino, h.Mode, h.UID, h.GID, h.NLink, h.MTime, h.FileSize,
		h.DevMajor, h.DevMinor, h.RDevMajor, h.RDevMinor, h.NameSize, h.Check,
	} {
		b = fmt.Appendf(b, "%08x", v)
	}
	return b
}

// pad4 returns how many zero bytes bring n up to a multiple of 4.
func pad4(n int64) int64 { return (4 - n%4) % 4 }

// Writer writes a newc archive to an underlying io.Writer.
type Writer struct {
	w      io.Writer
	closer io.Closer         // the gzip stream, when compressing
	off    int64             // bytes written to w so far, for padding
	ino    uint32            // last inode number handed out
	seen   map[string]uint32 // path -> mode of every entry written
	err    error             // sticky: the first write error
	closed bool
}

// NewWriter returns a Writer producing an uncompressed archive on w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w, seen: map[string]uint32{}}
}

// NewGzipWriter returns a Writer producing a gzip-compressed archive on w, as
// the kernel accepts with CONFIG_RD_GZIP. Close flushes the gzip stream; it
// does not close w.
func NewGzipWriter(w io.Writer) *Writer {
	zw, _ := gzip.NewWriterLevel(w, gzip.BestCompression) // the level is valid
	iw := NewWriter(zw)
	iw.closer = zw
	return iw
}

// Entry is an archive member: a path, its mode (file type bits and
// permissions), its data (file contents, or a symlink's target) and, for
// device nodes, the device numbers.
type Entry struct {
	Path      string
	Mode      uint32
	UID, GID  uint32
	Data      []byte
	RDevMajor uint32
	RDevMinor uint32
}

// Dir adds a directory.
func (w *Writer) Dir(name string, perm uint32) error {
	return w.WriteEntry(Entry{Path: name, Mode: TypeDir | perm&0o7777})
}

// File adds a regular file holding data.
func (w *Writer) File(name string, perm uint32, data []byte) error {
	return w.WriteEntry(Entry{Path: name, Mode: TypeRegular | perm&0o7777, Data: data})
}

// Symlink adds a symbolic link at name pointing to target.
func (w *Writer) Symlink(name, target string) error {
	return w.WriteEntry(Entry{Path: name, Mode: TypeSymlink | 0o777, Data: []byte(target)})
}

// CharDev adds a character device node, such as /dev/console (5, 1).
func (w *Writer) CharDev(name string, perm, major, minor uint32) error {
	return w.WriteEntry(Entry{Path: name, Mode: TypeChar | perm&0o7777, RDevMajor: major, RDevMinor: minor})
}

// BlockDev adds a block device node.
func (w *Writer) BlockDev(name string, perm, major, minor uint32) error {
	return w.WriteEntry(Entry{Path: name, Mode: TypeBlock | perm&0o7777, RDevMajor: major, RDevMinor: minor})
}

// CleanPath turns an absolute or relative slash-separated path into the form
// stored in the archive: relative, cleaned, without a leading "/". It rejects
// empty paths, the root itself, paths escaping the root and NUL bytes.
func CleanPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("initramfs: path %q contains NUL", p)
	}
	if p == "" {
		return "", errors.New("initramfs: empty path")
	}
	c := path.Clean("/" + p)
	if c == "/" {
		return "", fmt.Errorf("initramfs: path %q names the root", p)
	}
	// Clean("/"+p) cannot escape "/", but a ".." in the input almost certainly
	// means a caller bug, so refuse it rather than silently rewrite it.
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("initramfs: path %q contains ..", p)
		}
	}
	return c[1:], nil
}

// Has reports whether name (as CleanPath cleans it) is already in the
// archive.
func (w *Writer) Has(name string) bool {
	c, err := CleanPath(name)
	if err != nil {
		return false
	}
	_, ok := w.seen[c]
	return ok
}

// WriteEntry adds e to the archive. The entry's parent directory must already
// be in the archive (top-level entries have the root as parent).
func (w *Writer) WriteEntry(e Entry) error {
	if w.closed {
		return errors.New("initramfs: write after Close")
	}
	if w.err != nil {
		return w.err
	}
	name, err := CleanPath(e.Path)
	if err != nil {
		return err
	}
	if name == Trailer {
		return fmt.Errorf("initramfs: %q is reserved for the archive trailer", name)
	}
	if _, dup := w.seen[name]; dup {
		return fmt.Errorf("initramfs: duplicate path %q", name)
	}
	if dir := path.Dir(name); dir != "." {
		if m, ok := w.seen[dir]; !ok {
			return fmt.Errorf("initramfs: %q: parent directory %q not in the archive yet", name, dir)
		} else if m&TypeMask != TypeDir {
			return fmt.Errorf("initramfs: %q: parent %q is not a directory", name, dir)
		}
	}
	nlink := uint32(1)
	switch e.Mode & TypeMask {
	case TypeDir:
		nlink = 2
		fallthrough
	case TypeChar, TypeBlock, TypeFIFO, TypeSocket:
		if len(e.Data) != 0 {
			return fmt.Errorf("initramfs: %q: only regular files and symlinks carry data", name)
		}
	case TypeSymlink:
		if len(e.Data) == 0 {
			return fmt.Errorf("initramfs: %q: symlink with empty target", name)
		}
	case TypeRegular:
	default:
		return fmt.Errorf("initramfs: %q: unknown file type in mode %#o", name, e.Mode)
	}
	if e.Mode&TypeMask != TypeChar && e.Mode&TypeMask != TypeBlock && (e.RDevMajor != 0 || e.RDevMinor != 0) {
		return fmt.Errorf("initramfs: %q: device numbers on a non-device entry", name)
	}
	if int64(len(e.Data)) > math.MaxUint32 {
		return fmt.Errorf("initramfs: %q: %d bytes do not fit a newc entry (4 GiB - 1 at most)", name, len(e.Data))
	}
	w.ino++
	h := Header{
		Ino: w.ino, Mode: e.Mode, UID: e.UID, GID: e.GID, NLink: nlink,
		FileSize: uint32(len(e.Data)), RDevMajor: e.RDevMajor, RDevMinor: e.RDevMinor,
		NameSize: uint32(len(name) + 1),
	}
	if err := w.writeRecord(&h, name, e.Data); err != nil {
		return err
	}
	w.seen[name] = e.Mode
	return nil
}

// writeRecord writes header, name, NUL, padding, data, padding.
func (w *Writer) writeRecord(h *Header, name string, data []byte) error {
	rec := h.Encode()
	rec = append(rec, name...)
	rec = append(rec, 0)
	rec = append(rec, make([]byte, pad4(w.off+int64(len(rec))))...)
	w.write(rec)
	w.write(data)
	w.write(make([]byte, pad4(w.off)))
	return w.err
}

func (w *Writer) write(b []byte) {
	if w.err != nil || len(b) == 0 {
		return
	}
	n, err := w.w.Write(b)
	w.off += int64(n)
	if err != nil {
		w.err = fmt.Errorf("initramfs: write: %w", err)
	}
}

// Close writes the trailer entry and, for a gzip Writer, finishes the
// compressed stream. It does not close the underlying writer. Closing twice
// is an error.
func (w *Writer) Close() error {
	if w.closed {
		return errors.New("initramfs: Close called twice")
	}
	w.closed = true
	if w.err != nil {
		return w.err
	}
	h := Header{NLink: 1, NameSize: uint32(len(Trailer) + 1)}
	if err := w.writeRecord(&h, Trailer, nil); err != nil {
		return err
	}
	if w.closer != nil {
		if err := w.closer.Close(); err != nil {
			return fmt.Errorf("initramfs: finish gzip stream: %w", err)
		}
	}
	return nil
}
