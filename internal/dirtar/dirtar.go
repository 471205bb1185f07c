// Package dirtar moves a directory tree as a tar archive: Write packs one
// on the side it is read from, Extract unpacks it on the other, through an
// os.Root so that no entry lands outside the target whatever its name or
// a link in the tree says. `microvm cp` uses both ends: the host CLI and
// the guest agent (PutTree, GetTree).
//
// Data flow: Write walks the tree (lstat, never following a symlink) and
// writes a header per entry, names relative to the root, and each regular
// file's bytes; Extract reads headers in order, makes each entry, and
// applies directory modes and times last, deepest first, so that a
// read-only directory can still be filled.
package dirtar

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// ErrUnsafe reports an entry whose name or link target would leave the
// directory being extracted into.
var ErrUnsafe = errors.New("entry would leave the target directory")

// Write writes the tree at root as a tar archive to w: a directory's
// entries named relative to it (the directory itself is "./"), or a single
// file named by its base name. Symlinks are stored as links; device nodes,
// FIFOs and sockets are stored as their headers and skipped by Extract.
// It returns the number of entries written.
func Write(w io.Writer, root string) (int, error) {
	tw := tar.NewWriter(w)
	n := 0
	fi, err := os.Lstat(root)
	if err != nil {
		return 0, err
	}
	if !fi.IsDir() {
		if err := writeEntry(tw, root, filepath.Base(root), fi); err != nil {
			return 0, err
		}
		return 1, tw.Close()
	}
	links := map[[2]uint64]string{} // (dev, ino) of files with several links -> first name
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		name := filepath.ToSlash(rel)
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && sys.Nlink > 1 {
			key := [2]uint64{uint64(sys.Dev), sys.Ino}
			if first, seen := links[key]; seen {
				hdr, err := tar.FileInfoHeader(fi, "")
				if err != nil {
					return err
				}
				hdr.Name, hdr.Typeflag, hdr.Linkname, hdr.Size = name, tar.TypeLink, first, 0
				hdr.Uname, hdr.Gname, hdr.Format = "", "", tar.FormatPAX
				n++
				return tw.WriteHeader(hdr)
			}
			links[key] = name
		}
		if err := writeEntry(tw, p, name, fi); err != nil {
			return err
		}
		n++
		return nil
	})
	if err != nil {
		return n, err
	}
	return n, tw.Close()
}

func writeEntry(tw *tar.Writer, p, name string, fi fs.FileInfo) error {
	link := ""
	if fi.Mode()&fs.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	hdr.Name = name
	if fi.IsDir() && !strings.HasSuffix(name, "/") {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", "" // numeric owners only: the other side's names may differ
	hdr.Format = tar.FormatPAX
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("%s: %w (did it change while being read?)", p, err)
	}
	return nil
}

// Stats counts what Extract made.
type Stats struct {
	Entries, Bytes, Skipped int64
}

// Options say how much of an archive's metadata Extract keeps.
type Options struct {
	// Chown keeps the archive's numeric owners (the extracting process
	// must be allowed to); without it entries belong to the extracting
	// user.
	Chown bool
	// KeepSpecial keeps the setuid, setgid and sticky bits (07000).
	// Without it they are cleared: an archive from a less trusted side
	// (a guest, for the host) must not plant a set-id program owned by
	// whoever extracts it.
	KeepSpecial bool
}

// ErrSparse reports a sparse entry: Write never makes one, and its holes
// would let a few bytes of archive write gigabytes of zeros.
var ErrSparse = errors.New("sparse entries are not accepted")

// Extract unpacks the tar archive r into dir, creating dir (and its
// parents, mode 0755) when missing; existing files of the same names are
// replaced, existing directories merged. Modes (less 07000 unless
// o.KeepSpecial) and modification times are kept; owners too with
// o.Chown. The archive's "." entry sets dir's mode and time only when
// Extract made dir: an existing destination keeps its own. A directory
// entry whose name is a symlink in the tree does not change the mode of
// what the link points to. Device nodes, FIFOs and sockets are skipped and
// counted. A name or hard-link target that is absolute or climbs out with
// ".." is ErrUnsafe; a symlink in the tree cannot redirect a later entry
// outside dir either (os.Root). Sparse entries are ErrSparse, so the bytes
// written are at most the bytes read.
func Extract(r io.Reader, dir string, o Options) (Stats, error) {
	var st Stats
	fi, err := os.Stat(dir)
	existed := err == nil && fi.IsDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return st, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return st, err
	}
	defer root.Close()
	type dirMeta struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	var dirs []dirMeta
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, err
		}
		name, err := localName(hdr.Name)
		if err != nil {
			return st, err
		}
		if isSparse(hdr) {
			return st, fmt.Errorf("%s: %w", name, ErrSparse)
		}
		mode := fs.FileMode(hdr.Mode).Perm()
		if o.KeepSpecial {
			mode |= specialBits(hdr.Mode)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := root.MkdirAll(name, 0o755); err != nil {
					return st, err
				}
			}
			if name != "." || !existed {
				dirs = append(dirs, dirMeta{name, mode, hdr.ModTime})
			}
		case tar.TypeReg:
			if err := makeParent(root, name); err != nil {
				return st, err
			}
			if err := replace(root, name); err != nil {
				return st, err
			}
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return st, err
			}
			n, err := io.Copy(f, tr)
			st.Bytes += n
			if err == nil && o.Chown {
				err = f.Chown(hdr.Uid, hdr.Gid) // before the mode: chown clears setuid
			}
			if err == nil {
				err = f.Chmod(mode)
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return st, fmt.Errorf("%s: %w", name, err)
			}
			if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
				return st, err
			}
			st.Entries++
			continue
		case tar.TypeSymlink:
			if err := makeParent(root, name); err != nil {
				return st, err
			}
			if err := replace(root, name); err != nil {
				return st, err
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return st, err
			}
		case tar.TypeLink:
			target, err := localName(hdr.Linkname)
			if err != nil {
				return st, err
			}
			if err := makeParent(root, name); err != nil {
				return st, err
			}
			if err := replace(root, name); err != nil {
				return st, err
			}
			if err := root.Link(target, name); err != nil {
				return st, err
			}
		default:
			st.Skipped++
			continue
		}
		if o.Chown {
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return st, err
			}
		}
		st.Entries++
	}
	// Deepest first: a directory's time is set after its entries are made.
	slices.SortStableFunc(dirs, func(a, b dirMeta) int { return strings.Count(b.name, "/") - strings.Count(a.name, "/") })
	for _, d := range dirs {
		// Chmod and Chtimes follow a last-component symlink (within the
		// root); a later entry may have made one of a directory's name
		// point at another directory, the destination itself included.
		if fi, err := root.Lstat(d.name); err != nil {
			return st, err
		} else if !fi.IsDir() {
			continue
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return st, err
		}
		if err := root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return st, err
		}
	}
	return st, nil
}

// localName cleans a tar name and refuses one that leaves the directory.
func localName(n string) (string, error) {
	c := path.Clean(strings.TrimSuffix(n, "/"))
	if c == "." || c == "" {
		return ".", nil
	}
	if !filepath.IsLocal(c) {
		return "", fmt.Errorf("%q: %w", n, ErrUnsafe)
	}
	return c, nil
}

// isSparse says whether hdr is a sparse entry, in the old GNU form or in
// one of the PAX forms (which archive/tar reports as regular files).
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// specialBits maps a tar mode's setuid, setgid and sticky bits to fs's.
func specialBits(m int64) fs.FileMode {
	var b fs.FileMode
	if m&0o4000 != 0 {
		b |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		b |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		b |= fs.ModeSticky
	}
	return b
}

func makeParent(root *os.Root, name string) error {
	if d := path.Dir(name); d != "." {
		return root.MkdirAll(d, 0o755)
	}
	return nil
}

// replace removes a file or link already at name (never a directory with
// entries), so that the new entry is made, not written through a link.
func replace(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s: a directory is in the way", name)
	}
	return root.Remove(name)
}
