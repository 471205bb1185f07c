package virtio9p

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/hugelgupf/p9/fsimpl/templatefs"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// dirFS is the host directory one device shares: the 9P2000.L files the
// server (hugelgupf/p9) hands the guest are dirFiles below its root.
//
// Confinement: every dirFile holds an O_PATH descriptor reached from the
// root's one name at a time with openat(O_NOFOLLOW), so a symlink the
// guest (or anybody) made in the tree is never followed on the host, and
// ".." and names with "/" are refused: nothing outside the tree is ever
// named. The guest's own kernel resolves symlinks and ".." inside its
// mount. For I/O a regular file or directory is reopened through
// /proc/self/fd/N of its O_PATH descriptor (the same inode, whatever
// happened to the path since); symlinks, devices, FIFOs and sockets are
// never opened, and the guest cannot make devices, FIFOs or sockets.
type dirFS struct {
	rootFD   int // O_PATH|O_DIRECTORY, opened by openDirFS, closed by close
	readOnly bool
}

// openDirFS opens root: the share is that directory from then on,
// whatever later happens to its path.
func openDirFS(root string, readOnly bool) (*dirFS, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, err)
	}
	return &dirFS{rootFD: fd, readOnly: readOnly}, nil
}

func (fs *dirFS) close() { unix.Close(fs.rootFD) }

// Attach implements p9.Attacher: the root directory.
func (fs *dirFS) Attach() (p9.File, error) {
	fd, err := unix.Dup(fs.rootFD)
	if err != nil {
		return nil, err
	}
	return &dirFile{fs: fs, fd: fd}, nil
}

// dirFile is one file of a dirFS: a fid's file on the server. The server
// serialises the calls on one file that change it (p9's fidRef locks).
type dirFile struct {
	p9.DefaultWalkGetAttr
	templatefs.NoopRenamed
	templatefs.XattrUnimplemented // xattrs: refused (ENOSYS)

	fs   *dirFS
	fd   int      // O_PATH|O_NOFOLLOW; owned, closed by Close
	open *os.File // after Open or Create: the file for I/O (nil before)

	dirents []p9.Dirent // the listing Readdir serves, taken at offset 0
}

var _ p9.File = (*dirFile)(nil)

// validName refuses what is not one directory entry's name.
func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") {
		return unix.EINVAL
	}
	return nil
}

// procPath names fd through /proc/self/fd, for the calls that have no
// descriptor-relative form for O_PATH descriptors.
func procPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

func (f *dirFile) stat() (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstat(f.fd, &st)
	return st, err
}

// qidOf is the QID of a file with st: its inode is its path.
func qidOf(st *unix.Stat_t) p9.QID {
	return p9.QID{Type: p9.FileMode(st.Mode).QIDType(), Path: st.Ino}
}

func (f *dirFile) writable() error {
	if f.fs.readOnly {
		return unix.EROFS
	}
	return nil
}

// Walk implements p9.File.
func (f *dirFile) Walk(names []string) ([]p9.QID, p9.File, error) {
	cur, err := unix.Dup(f.fd)
	if err != nil {
		return nil, nil, err
	}
	var qids []p9.QID
	for _, name := range names {
		if err := validName(name); err != nil {
			unix.Close(cur)
			return nil, nil, err
		}
		next, err := unix.Openat(cur, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			return nil, nil, err
		}
		cur = next
		var st unix.Stat_t
		if err := unix.Fstat(cur, &st); err != nil {
			unix.Close(cur)
			return nil, nil, err
		}
		qids = append(qids, qidOf(&st))
	}
	return qids, &dirFile{fs: f.fs, fd: cur}, nil
}

// StatFS implements p9.File.
func (f *dirFile) StatFS() (p9.FSStat, error) {
	var s unix.Statfs_t
	if err := unix.Fstatfs(f.fd, &s); err != nil {
		return p9.FSStat{}, err
	}
	return p9.FSStat{Type: uint32(s.Type), BlockSize: uint32(s.Bsize), Blocks: s.Blocks,
		BlocksFree: s.Bfree, BlocksAvailable: s.Bavail, Files: s.Files, FilesFree: s.Ffree,
		NameLength: uint32(s.Namelen)}, nil
}

// GetAttr implements p9.File.
func (f *dirFile) GetAttr(p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	st, err := f.stat()
	if err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, err
	}
	a := p9.Attr{
		Mode: p9.FileMode(st.Mode), UID: p9.UID(st.Uid), GID: p9.GID(st.Gid),
		NLink: p9.NLink(st.Nlink), RDev: p9.Dev(st.Rdev), Size: uint64(st.Size),
		BlockSize: uint64(st.Blksize), Blocks: uint64(st.Blocks),
		ATimeSeconds: uint64(st.Atim.Sec), ATimeNanoSeconds: uint64(st.Atim.Nsec),
		MTimeSeconds: uint64(st.Mtim.Sec), MTimeNanoSeconds: uint64(st.Mtim.Nsec),
		CTimeSeconds: uint64(st.Ctim.Sec), CTimeNanoSeconds: uint64(st.Ctim.Nsec),
	}
	m := p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, RDev: true, ATime: true,
		MTime: true, CTime: true, INo: true, Size: true, Blocks: true}
	return qidOf(&st), m, a, nil
}

// SetAttr implements p9.File. Permissions, size and times change only
// regular files and directories (through /proc/self/fd, which a symlink's
// O_PATH descriptor must not go through); owners change any file.
func (f *dirFile) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	if err := f.writable(); err != nil {
		return err
	}
	st, err := f.stat()
	if err != nil {
		return err
	}
	plain := st.Mode&unix.S_IFMT == unix.S_IFREG || st.Mode&unix.S_IFMT == unix.S_IFDIR
	if !plain && (valid.Permissions || valid.Size || valid.ATime || valid.MTime) {
		return unix.EPERM
	}
	if valid.Permissions {
		if err := unix.Fchmodat(unix.AT_FDCWD, procPath(f.fd), uint32(attr.Permissions.Permissions()), 0); err != nil {
			return err
		}
	}
	if valid.UID || valid.GID {
		uid, gid := -1, -1
		if valid.UID {
			uid = int(attr.UID)
		}
		if valid.GID {
			gid = int(attr.GID)
		}
		if err := unix.Fchownat(f.fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if valid.Size {
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return unix.EISDIR
		}
		if err := unix.Truncate(procPath(f.fd), int64(attr.Size)); err != nil {
			return err
		}
	}
	if valid.ATime || valid.MTime {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		set := func(i int, on, given bool, sec, nsec uint64) {
			switch {
			case on && given:
				ts[i] = unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
			case on:
				ts[i] = unix.Timespec{Nsec: unix.UTIME_NOW}
			}
		}
		set(0, valid.ATime, valid.ATimeNotSystemTime, attr.ATimeSeconds, attr.ATimeNanoSeconds)
		set(1, valid.MTime, valid.MTimeNotSystemTime, attr.MTimeSeconds, attr.MTimeNanoSeconds)
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, procPath(f.fd), ts, 0); err != nil {
			return err
		}
	}
	return nil
}

// Close implements p9.File.
func (f *dirFile) Close() error {
	var err error
	if f.open != nil {
		err = f.open.Close()
		f.open = nil
	}
	if f.fd >= 0 {
		if e := unix.Close(f.fd); err == nil {
			err = e
		}
		f.fd = -1
	}
	return err
}

// openFlags are the open(2) flags a Topen or Tlcreate mode asks for: the
// access mode, and truncation.
func (f *dirFile) openFlags(mode p9.OpenFlags) (int, error) {
	flags := mode.OSFlags() & unix.O_ACCMODE
	if uint32(mode)&unix.O_TRUNC != 0 {
		flags |= unix.O_TRUNC
	}
	if flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0 {
		if err := f.writable(); err != nil {
			return 0, err
		}
	}
	return flags | unix.O_CLOEXEC, nil
}

// Open implements p9.File: regular files and directories only.
func (f *dirFile) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	st, err := f.stat()
	if err != nil {
		return p9.QID{}, 0, err
	}
	flags, err := f.openFlags(mode)
	if err != nil {
		return p9.QID{}, 0, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC
	default:
		return p9.QID{}, 0, unix.EPERM
	}
	fd, err := unix.Open(procPath(f.fd), flags, 0)
	if err != nil {
		return p9.QID{}, 0, err
	}
	f.open = os.NewFile(uintptr(fd), "share")
	return qidOf(&st), 0, nil
}

// ReadAt implements p9.File.
func (f *dirFile) ReadAt(p []byte, offset int64) (int, error) {
	if f.open == nil {
		return 0, unix.EBADF
	}
	n, err := f.open.ReadAt(p, offset)
	if errors.Is(err, io.EOF) {
		err = nil // a short read is how 9P says end of file
	}
	return n, err
}

// WriteAt implements p9.File.
func (f *dirFile) WriteAt(p []byte, offset int64) (int, error) {
	if f.open == nil {
		return 0, unix.EBADF
	}
	if err := f.writable(); err != nil {
		return 0, err
	}
	return f.open.WriteAt(p, offset)
}

// FSync implements p9.File.
func (f *dirFile) FSync() error {
	if f.open == nil {
		return nil
	}
	return f.open.Sync()
}

// chown gives a new entry the guest caller's owner (the server runs as
// the host user that owns the share; the guest's IDs are its own).
func (f *dirFile) chown(name string, uid p9.UID, gid p9.GID) error {
	u, g := -1, -1
	if uid.Ok() {
		u = int(uid)
	}
	if gid.Ok() {
		g = int(gid)
	}
	if u == -1 && g == -1 {
		return nil
	}
	err := unix.Fchownat(f.fd, name, u, g, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.EPERM) && unix.Geteuid() != 0 {
		return nil // an unprivileged host user keeps its own files
	}
	return err
}

// child opens the entry name of this directory as a dirFile.
func (f *dirFile) child(name string) (*dirFile, p9.QID, error) {
	fd, err := unix.Openat(f.fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, p9.QID{}, err
	}
	c := &dirFile{fs: f.fs, fd: fd}
	st, err := c.stat()
	if err != nil {
		c.Close()
		return nil, p9.QID{}, err
	}
	return c, qidOf(&st), nil
}

// Create implements p9.File: a new regular file, opened.
func (f *dirFile) Create(name string, mode p9.OpenFlags, perm p9.FileMode, uid p9.UID, gid p9.GID) (p9.File, p9.QID, uint32, error) {
	if err := f.writable(); err != nil {
		return nil, p9.QID{}, 0, err
	}
	if err := validName(name); err != nil {
		return nil, p9.QID{}, 0, err
	}
	flags, err := f.openFlags(mode)
	if err != nil {
		return nil, p9.QID{}, 0, err
	}
	fd, err := unix.Openat(f.fd, name, flags|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, uint32(perm.Permissions()))
	if err != nil {
		return nil, p9.QID{}, 0, err
	}
	file := os.NewFile(uintptr(fd), "share")
	if err := f.chown(name, uid, gid); err != nil {
		file.Close()
		return nil, p9.QID{}, 0, err
	}
	c, qid, err := f.child(name)
	if err != nil {
		file.Close()
		return nil, p9.QID{}, 0, err
	}
	c.open = file
	return c, qid, 0, nil
}

// Mkdir implements p9.File.
func (f *dirFile) Mkdir(name string, perm p9.FileMode, uid p9.UID, gid p9.GID) (p9.QID, error) {
	if err := f.writable(); err != nil {
		return p9.QID{}, err
	}
	if err := validName(name); err != nil {
		return p9.QID{}, err
	}
	if err := unix.Mkdirat(f.fd, name, uint32(perm.Permissions())); err != nil {
		return p9.QID{}, err
	}
	return f.entryQID(name, uid, gid)
}

// entryQID gives a new entry its owner and returns its QID.
func (f *dirFile) entryQID(name string, uid p9.UID, gid p9.GID) (p9.QID, error) {
	if err := f.chown(name, uid, gid); err != nil {
		return p9.QID{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(f.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return p9.QID{}, err
	}
	return qidOf(&st), nil
}

// Symlink implements p9.File. The target is only stored: the host never
// follows it.
func (f *dirFile) Symlink(target, name string, uid p9.UID, gid p9.GID) (p9.QID, error) {
	if err := f.writable(); err != nil {
		return p9.QID{}, err
	}
	if err := validName(name); err != nil {
		return p9.QID{}, err
	}
	if err := unix.Symlinkat(target, f.fd, name); err != nil {
		return p9.QID{}, err
	}
	return f.entryQID(name, uid, gid)
}

// Link implements p9.File: a hard link to a regular file of the share.
func (f *dirFile) Link(target p9.File, name string) error {
	if err := f.writable(); err != nil {
		return err
	}
	if err := validName(name); err != nil {
		return err
	}
	t, ok := target.(*dirFile)
	if !ok {
		return unix.EXDEV
	}
	st, err := t.stat()
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return unix.EPERM
	}
	return unix.Linkat(unix.AT_FDCWD, procPath(t.fd), f.fd, name, unix.AT_SYMLINK_FOLLOW)
}

// Lock implements p9.File: POSIX locks are granted without being held on
// the host, as QEMU's 9p server does; they only order the guest's own
// processes through its kernel.
func (f *dirFile) Lock(int, p9.LockType, p9.LockFlags, uint64, uint64, string) (p9.LockStatus, error) {
	return p9.LockStatusOK, nil
}

// Mknod implements p9.File: devices, FIFOs and sockets are not made in a
// share.
func (f *dirFile) Mknod(string, p9.FileMode, uint32, uint32, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, unix.EPERM
}

// Rename implements p9.File: the guest's kernel uses Trenameat
// (RenameAt); the old form would need a file's parent.
func (f *dirFile) Rename(p9.File, string) error { return unix.EOPNOTSUPP }

// RenameAt implements p9.File.
func (f *dirFile) RenameAt(oldName string, newDir p9.File, newName string) error {
	if err := f.writable(); err != nil {
		return err
	}
	if err := validName(oldName); err != nil {
		return err
	}
	if err := validName(newName); err != nil {
		return err
	}
	d, ok := newDir.(*dirFile)
	if !ok {
		return unix.EXDEV
	}
	return unix.Renameat(f.fd, oldName, d.fd, newName)
}

// UnlinkAt implements p9.File.
func (f *dirFile) UnlinkAt(name string, flags uint32) error {
	if err := f.writable(); err != nil {
		return err
	}
	if err := validName(name); err != nil {
		return err
	}
	return unix.Unlinkat(f.fd, name, int(flags)&unix.AT_REMOVEDIR)
}

// Readdir implements p9.File. The listing is taken when the guest reads
// from offset 0 and served from it by offset (an entry's Offset is the
// next one's index), so entries made or removed meanwhile show at the next
// rewind, as with getdents.
func (f *dirFile) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	if f.open == nil {
		return nil, unix.EBADF
	}
	if offset == 0 || f.dirents == nil {
		if err := f.list(); err != nil {
			return nil, err
		}
	}
	if offset >= uint64(len(f.dirents)) {
		return nil, nil
	}
	// The server sends what fits in count; each entry takes at least 24
	// bytes plus its name.
	end := min(uint64(len(f.dirents)), offset+uint64(count)/24+1)
	return f.dirents[offset:end], nil
}

// list reads the open directory's entries, with their QIDs.
func (f *dirFile) list() error {
	if _, err := f.open.Seek(0, io.SeekStart); err != nil {
		return err
	}
	names, err := f.open.Readdirnames(-1)
	if err != nil {
		return err
	}
	// "." and ".." first, as getdents gives them (tools such as ls -a
	// expect them); both carry the directory's own QID, so nothing of
	// the root's parent is looked at.
	st, err := f.stat()
	if err != nil {
		return err
	}
	self := qidOf(&st)
	f.dirents = make([]p9.Dirent, 0, len(names)+2)
	for _, name := range []string{".", ".."} {
		f.dirents = append(f.dirents, p9.Dirent{QID: self, Type: self.Type, Name: name, Offset: uint64(len(f.dirents) + 1)})
	}
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(f.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		q := qidOf(&st)
		f.dirents = append(f.dirents, p9.Dirent{QID: q, Type: q.Type, Name: name, Offset: uint64(len(f.dirents) + 1)})
	}
	return nil
}

// Readlink implements p9.File.
func (f *dirFile) Readlink() (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(f.fd, "", buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
