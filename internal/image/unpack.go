package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// entryMeta is what the tar says about one staged inode and the staging
// directory does not keep: its owner (files are never chowned while
// staged), its exact mode bits (they are staged with owner access
// added), and its xattrs. ext4.go applies it with debugfs.
type entryMeta struct {
	uid, gid uint32
	perm     uint32 // permission bits with setuid, setgid, sticky (07777)
	xattrs   []xattr
}

type xattr struct {
	name  string
	value []byte
}

// staged is the result of unpacking a flattened image into a directory.
type staged struct {
	dir     string
	byIno   map[uint64]*entryMeta // staged inode number -> tar metadata
	skipped int                   // entries not created
	ops     int                   // file system calls of the last phase (unpacker.ops)
}

// Owner bits added to every staged file and directory, so that the
// staging tree can be written, read by mke2fs and removed whatever the
// image's modes say, by root without CAP_DAC_OVERRIDE or
// CAP_DAC_READ_SEARCH (as in some containers) as well as by a user who is
// not root; debugfs puts the image's own modes back.
const (
	userFileBits = 0o600
	userDirBits  = 0o700
)

// pendingDir is a directory whose mode and times are applied once
// everything under it is in place.
type pendingDir struct {
	name         string
	perm         uint32
	atime, mtime time.Time
}

// hardLink is a hard link made once all files are in place: mutate.Extract
// emits the top layer first, so a link can come before its target.
type hardLink struct {
	name, target string
}

const xattrPAXPrefix = "SCHILY.xattr."

// unpack writes the flattened tar stream r into dir through an os.Root, so
// that whatever names, links and symlinks the tar holds nothing is created
// outside dir. Regular files, directories, symlinks and hard links are
// made with their mode bits and times; device nodes, FIFOs and other types
// are counted in skipped. Ownership and xattrs are only recorded.
//
// The work is bounded by o's limits (bytes read and written, entries,
// metadata held) and stops when ctx is done: each entry costs a constant
// number of file system calls, hard links included.
func unpack(ctx context.Context, r io.Reader, dir string, o *Options) (*staged, error) {
	return unpackWith(ctx, r, dir, o, nil)
}

// unpackWith is unpack with onOp, when not nil, called at each file system
// call of its last phase (hard links, then directory modes), for tests.
func unpackWith(ctx context.Context, r io.Reader, dir string, o *Options, onOp func()) (*staged, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open staging directory: %w", err)
	}
	defer root.Close()

	maxBytes, maxEntries, maxMeta := o.limits()
	u := &unpacker{
		ctx:     ctx,
		root:    root,
		o:       o,
		onOp:    onOp,
		st:      &staged{dir: dir, byIno: map[uint64]*entryMeta{}},
		written: budget{limit: LimitBytes, max: maxBytes, what: "the files unpacked from the layers"},
		held:    budget{limit: LimitMetaBytes, max: maxMeta, what: "the names and xattrs held while unpacking"},
		entries: budget{limit: LimitEntries, max: maxEntries, what: "the layers' tar entries"},
	}
	cr := &ctxReader{ctx: ctx, r: r, budget: budget{limit: LimitBytes, max: maxBytes, what: "the layers' uncompressed tar stream"}}
	tr := tar.NewReader(cr)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			// mutate.Extract ends its tar before it reports an error
			// (a layer failing verification, an unsafe path): the
			// error comes after the end-of-archive blocks.
			if _, err := io.Copy(io.Discard, cr); err != nil {
				return nil, fmt.Errorf("read image layers: %w", err)
			}
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read image layers: %w", err)
		}
		if err := u.entries.add(1); err != nil {
			return nil, err
		}
		if err := u.entry(hdr, tr); err != nil {
			return nil, err
		}
	}
	err = u.finish()
	u.st.ops = u.ops
	if err != nil {
		return u.st, err
	}
	return u.st, nil
}

type unpacker struct {
	ctx   context.Context
	root  *os.Root
	o     *Options
	st    *staged
	dirs  []pendingDir
	links []hardLink

	written budget // bytes of files, symlink targets and xattrs
	held    budget // bytes of names and xattrs held until finish
	entries budget
	// ops counts the file system calls finish makes, so that a test can
	// tell linear work from quadratic without timing it; onOp, when set
	// (by tests), is called at each.
	ops  int
	onOp func()
}

// op accounts for one file system call of finish and says whether to go
// on: finish's work is not tied to reading, so it checks ctx itself.
func (u *unpacker) op() error {
	u.ops++
	if u.onOp != nil {
		u.onOp()
	}
	return u.ctx.Err()
}

// budget counts something an image may have only so much of.
type budget struct {
	limit string // the Options field that sets max
	max   int64
	what  string
	used  int64
}

func (b *budget) add(n int64) error {
	if n < 0 || n > b.max-b.used {
		return &LimitError{Limit: b.limit, Max: b.max, What: b.what}
	}
	b.used += n
	return nil
}

// ctxReader fails reads once ctx is done, so that unpacking a local
// archive stops when asked, and once more than its budget was read, so
// that a decompression bomb stops before it is all read.
type ctxReader struct {
	ctx    context.Context
	r      io.Reader
	budget budget
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	if berr := c.budget.add(int64(n)); berr != nil {
		return n, berr
	}
	return n, err
}

// sourceReader remembers a read error, to tell a failing download or
// archive from a failing write.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// entryName turns a (cleaned) tar name into a name relative to the root:
// no leading slash, "." for the root itself.
func entryName(n string) (string, error) {
	n = path.Clean(strings.TrimLeft(n, "/"))
	if n == ".." || strings.HasPrefix(n, "../") {
		return "", fmt.Errorf("unsafe tar path %q", n)
	}
	return n, nil
}

// pathMax is Linux's PATH_MAX: no system call takes a longer name, so no
// longer name or link target can be made; it also bounds what one entry
// holds in memory.
const pathMax = 4096

func (u *unpacker) entry(hdr *tar.Header, data io.Reader) error {
	if len(hdr.Name) > pathMax || len(hdr.Linkname) > pathMax {
		return fmt.Errorf("tar entry %.64q...: a name or link target longer than %d bytes (PATH_MAX) cannot be made", hdr.Name, pathMax)
	}
	name, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dir(name, hdr)
	case tar.TypeReg, tar.TypeGNUSparse:
		return u.file(name, hdr, data)
	case tar.TypeSymlink:
		if err := u.written.add(int64(len(hdr.Linkname))); err != nil {
			return err
		}
		return u.symlink(name, hdr)
	case tar.TypeLink:
		target, err := entryName(hdr.Linkname)
		if err != nil {
			return err
		}
		if err := u.held.add(int64(len(name) + len(target))); err != nil {
			return err
		}
		u.links = append(u.links, hardLink{name: name, target: target})
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		u.st.skipped++
		return nil
	default:
		u.st.skipped++
		u.o.logf("image: %s: tar entry type %q not supported; skipped", name, hdr.Typeflag)
		return nil
	}
}

// meta records hdr's owner, mode and xattrs for the inode now at name.
func (u *unpacker) meta(name string, hdr *tar.Header) error {
	fi, err := u.root.Lstat(name)
	if err != nil {
		return fmt.Errorf("stage %s: %w", name, err)
	}
	m := &entryMeta{perm: uint32(hdr.Mode) & 0o7777}
	m.uid = u.id(name, "uid", hdr.Uid)
	m.gid = u.id(name, "gid", hdr.Gid)
	var keys []string
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, xattrPAXPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var n int64
	for _, k := range keys {
		n += int64(len(k) + len(hdr.PAXRecords[k]))
	}
	// xattrs are written to the ext4 and held until then.
	if err := u.written.add(n); err != nil {
		return err
	}
	if err := u.held.add(n); err != nil {
		return err
	}
	for _, k := range keys {
		m.xattrs = append(m.xattrs, xattr{name: k[len(xattrPAXPrefix):], value: []byte(hdr.PAXRecords[k])})
	}
	u.st.byIno[inode(fi)] = m
	return nil
}

func (u *unpacker) id(name, what string, v int) uint32 {
	if v < 0 || int64(v) > math.MaxUint32 {
		u.o.logf("image: %s: %s %d out of range; using 0", name, what, v)
		return 0
	}
	return uint32(v)
}

func inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// modeBits turns permission bits with setuid, setgid and sticky into an
// os.FileMode for Chmod.
func modeBits(perm uint32) os.FileMode {
	m := os.FileMode(perm & 0o777)
	if perm&unix.S_ISUID != 0 {
		m |= os.ModeSetuid
	}
	if perm&unix.S_ISGID != 0 {
		m |= os.ModeSetgid
	}
	if perm&unix.S_ISVTX != 0 {
		m |= os.ModeSticky
	}
	return m
}

func (u *unpacker) parent(name string) error {
	if d := path.Dir(name); d != "." {
		if err := u.root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
	}
	return nil
}

// clear makes room for a non-directory at name. Nothing is normally
// there (mutate.Extract emits each name once), but a directory made as
// the parent of an upper layer's entries may be: the directory wins, as
// it would have in the layer that holds those entries.
func (u *unpacker) clear(name string) (ok bool, err error) {
	if name == "." {
		u.o.logf("image: tar entry for the root is not a directory; skipped")
		return false, nil
	}
	fi, err := u.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("stage %s: %w", name, err)
	}
	if fi.IsDir() {
		u.o.logf("image: %s: a directory from an upper layer is in its place; entry skipped", name)
		return false, nil
	}
	if err := u.root.Remove(name); err != nil {
		return false, fmt.Errorf("stage %s: %w", name, err)
	}
	return true, nil
}

func (u *unpacker) dir(name string, hdr *tar.Header) error {
	if name != "." {
		fi, err := u.root.Lstat(name)
		switch {
		case err == nil && !fi.IsDir():
			u.o.logf("image: %s: a non-directory from an upper layer is in its place; directory skipped", name)
			return nil
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("stage %s: %w", name, err)
		}
		if err := u.root.MkdirAll(name, 0o755); err != nil {
			return fmt.Errorf("stage %s: %w", name, err)
		}
	}
	if err := u.meta(name, hdr); err != nil {
		return err
	}
	if err := u.held.add(int64(len(name))); err != nil {
		return err
	}
	u.dirs = append(u.dirs, pendingDir{
		name:  name,
		perm:  uint32(hdr.Mode) & 0o7777,
		atime: accessTime(hdr),
		mtime: hdr.ModTime,
	})
	return nil
}

func accessTime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

func (u *unpacker) file(name string, hdr *tar.Header, data io.Reader) error {
	// Counted at its full size before anything is written: a sparse
	// entry's holes are written out as zeros, and its size is whatever
	// its header claims.
	if err := u.written.add(hdr.Size); err != nil {
		return err
	}
	if err := u.parent(name); err != nil {
		return err
	}
	if ok, err := u.clear(name); !ok {
		return err
	}
	f, err := u.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("stage %s: %w", name, err)
	}
	perm := uint32(hdr.Mode)&0o7777 | userFileBits
	src := &sourceReader{r: data}
	_, err = io.Copy(f, src)
	if err == nil {
		err = f.Chmod(modeBits(perm))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if src.err != nil {
		return fmt.Errorf("read image layers: %s: %w", name, src.err)
	}
	if err != nil {
		return fmt.Errorf("stage %s: %w", name, err)
	}
	if err := u.root.Chtimes(name, accessTime(hdr), hdr.ModTime); err != nil {
		return fmt.Errorf("stage %s: %w", name, err)
	}
	return u.meta(name, hdr)
}

func (u *unpacker) symlink(name string, hdr *tar.Header) error {
	if err := u.parent(name); err != nil {
		return err
	}
	if ok, err := u.clear(name); !ok {
		return err
	}
	if err := u.root.Symlink(hdr.Linkname, name); err != nil {
		return fmt.Errorf("stage %s: %w", name, err)
	}
	if err := u.lutimes(name, accessTime(hdr), hdr.ModTime); err != nil {
		return fmt.Errorf("stage %s: %w", name, err)
	}
	return u.meta(name, hdr)
}

// lutimes sets a symlink's own times (os.Root.Chtimes follows it).
func (u *unpacker) lutimes(name string, atime, mtime time.Time) error {
	d, err := u.root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer d.Close()
	ts := []unix.Timespec{
		{Sec: atime.Unix(), Nsec: int64(atime.Nanosecond())},
		{Sec: mtime.Unix(), Nsec: int64(mtime.Nanosecond())},
	}
	return unix.UtimesNanoAt(int(d.Fd()), path.Base(name), ts, unix.AT_SYMLINK_NOFOLLOW)
}

// finish makes the hard links, then applies directory modes and times,
// deepest first: making entries in a directory changes its mtime, and a
// directory's final mode may forbid making them (to a user who is not
// root) or reaching its subdirectories.
func (u *unpacker) finish() error {
	if err := u.link(); err != nil {
		return err
	}

	sort.SliceStable(u.dirs, func(i, j int) bool {
		return depth(u.dirs[i].name) > depth(u.dirs[j].name)
	})
	for _, d := range u.dirs {
		if err := u.op(); err != nil {
			return err
		}
		perm := d.perm | userDirBits
		if err := u.root.Chmod(d.name, modeBits(perm)); err != nil {
			return fmt.Errorf("stage %s: %w", d.name, err)
		}
		if err := u.root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return fmt.Errorf("stage %s: %w", d.name, err)
		}
	}
	return nil
}

// link makes the hard links. A link's target may be another link made
// later (mutate.Extract emits the top layer first, and a layer may list a
// link before the name it points at): links whose target is missing wait
// under that name, and making a name wakes its waiters, so each link is
// tried once, plus once per time its target is made. Retrying every
// waiting link until none can be made, as a fixed point, costs the square
// of their number for a reversed chain of links. A target reached only
// through a symlink that a later link makes is not waited for (no tar
// writer names a target so); such a link is skipped as one whose target
// is missing.
func (u *unpacker) link() error {
	waiting := map[string][]hardLink{} // missing target -> links to it
	queue := u.links
	u.links = nil
	for len(queue) > 0 {
		l := queue[0]
		queue = queue[1:]
		if err := u.op(); err != nil {
			return err
		}
		if _, err := u.root.Lstat(l.target); err != nil {
			// Perhaps another link, made later; or not there at all,
			// or out of reach (behind an absolute symlink).
			waiting[l.target] = append(waiting[l.target], l)
			continue
		}
		if err := u.parent(l.name); err != nil {
			return err
		}
		if ok, err := u.clear(l.name); !ok {
			if err != nil {
				return err
			}
			continue
		}
		if err := u.root.Link(l.target, l.name); err != nil {
			return fmt.Errorf("stage hard link %s to %s: %w", l.name, l.target, err)
		}
		if w, ok := waiting[l.name]; ok {
			delete(waiting, l.name)
			queue = append(queue, w...)
		}
	}
	// Targets deleted by an upper layer: mutate.Extract dropped their
	// content, so these names cannot be made. Sorted, for the log.
	var left []hardLink
	for _, w := range waiting {
		left = append(left, w...)
	}
	sort.Slice(left, func(i, j int) bool { return left[i].name < left[j].name })
	for _, l := range left {
		u.st.skipped++
		u.o.logf("image: hard link %s: its target %s is not in the image; skipped", l.name, l.target)
	}
	return nil
}

func depth(name string) int {
	if name == "." {
		return 0
	}
	return strings.Count(name, "/") + 1
}
