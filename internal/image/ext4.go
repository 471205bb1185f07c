package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// findTool looks a program up in PATH, then in /sbin and /usr/sbin (which
// a normal user's PATH often lacks).
func findTool(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		for _, d := range []string{"/usr/sbin", "/sbin"} {
			p := filepath.Join(d, n)
			if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s not found in PATH, /usr/sbin or /sbin (install e2fsprogs)", names[0])
}

const (
	blockSize = 4096
	inodeSize = 256
	// extentBlocks: a file's extents fit in its inode up to 4 extents
	// of at most 32768 blocks; count one extent tree block per this many
	// data blocks, in case allocation fragments a big file.
	extentBlocks = 8192
	// fastSymlinkMax: a symlink target shorter than this lives in the
	// inode, a longer one takes a block.
	fastSymlinkMax = 60
)

// fsPlan is what scanning the staged tree found: how big an ext4 it needs,
// and the debugfs commands that give each inode the tar's owner, mode and
// xattrs.
type fsPlan struct {
	inodes       int64 // inodes the tree needs
	blocks       int64 // 4 KiB blocks the tree's data needs
	contentBytes int64 // bytes of regular files
	metaSkipped  int

	script    *bufio.Writer
	xattrDir  string
	xattrFile int
}

// planFS walks the staged tree. Each inode is counted once (hard links
// share one). Its debugfs commands set whatever differs between the staged
// inode and the tar: uid and gid (as root, only files the tar does not
// give to root; as a user, every file), mode (owner bits added for
// staging, bits the umask took), xattrs. The root directory's owner and mode are always
// set. Directories the tar did not list get root:root 0755.
func planFS(st *staged, w *workDir, o *Options) (*fsPlan, error) {
	f, err := os.Create(w.join("debugfs.cmd"))
	if err != nil {
		return nil, fmt.Errorf("debugfs script: %w", err)
	}
	defer f.Close()
	p := &fsPlan{script: bufio.NewWriter(f), xattrDir: w.join("xattr")}
	if strings.ContainsAny(p.xattrDir, "\"\n\r") {
		return nil, fmt.Errorf("store path %q: debugfs cannot take it", w.path)
	}

	seen := map[uint64]bool{}
	dirBytes := map[string]int64{} // directory -> bytes of its entries
	err = filepath.WalkDir(st.dir, func(abs string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(st.dir, abs)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		sys, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat data", abs)
		}
		if rel != "." {
			// A directory entry: 8 bytes and the name padded to 4.
			dirBytes[filepath.Dir(rel)] += 8 + int64(len(d.Name())+3)&^3
		}
		if fi.IsDir() {
			if _, ok := dirBytes[rel]; !ok {
				dirBytes[rel] = 0
			}
		}
		if seen[sys.Ino] {
			return nil
		}
		seen[sys.Ino] = true
		p.inodes++
		switch {
		case fi.Mode().IsRegular():
			n := (fi.Size() + blockSize - 1) / blockSize
			p.blocks += n + n/extentBlocks
			p.contentBytes += fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			if fi.Size() >= fastSymlinkMax {
				p.blocks++
			}
		}
		return p.commandsFor(rel, fi, sys, st.byIno[sys.Ino], o)
	})
	if err != nil {
		return nil, fmt.Errorf("scan staged tree: %w", err)
	}
	for _, b := range dirBytes {
		// "." and "..", and room for the hash tree and slack.
		n := (b + 24 + b/3 + blockSize - 1) / blockSize
		if n > 1 {
			n++
		}
		p.blocks += n
	}
	if err := p.script.Flush(); err != nil {
		return nil, fmt.Errorf("debugfs script: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("debugfs script: %w", err)
	}
	return p, nil
}

// debugfsQuote quotes a string for debugfs's command parser: inside
// double quotes a doubled quote stands for one. A newline or carriage
// return ends the command line whatever the quoting, so such names cannot
// be given.
func debugfsQuote(s string) (string, bool) {
	if strings.ContainsAny(s, "\n\r") {
		return "", false
	}
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`, true
}

func (p *fsPlan) commandsFor(rel string, fi fs.FileInfo, sys *syscall.Stat_t, m *entryMeta, o *Options) error {
	isRoot := rel == "."
	isDir := fi.IsDir()
	isLink := fi.Mode()&fs.ModeSymlink != 0
	stagedPerm := sys.Mode & 0o7777

	var uid, gid, perm uint32
	var xattrs []xattr
	switch {
	case m != nil:
		uid, gid, perm, xattrs = m.uid, m.gid, m.perm, m.xattrs
	case isDir:
		perm = 0o755 // made as a parent; the tar has no entry for it
	default:
		perm = stagedPerm
	}

	var cmds []string
	if isRoot || sys.Uid != uid {
		cmds = append(cmds, "uid "+strconv.FormatUint(uint64(uid), 10))
	}
	if isRoot || sys.Gid != gid {
		cmds = append(cmds, "gid "+strconv.FormatUint(uint64(gid), 10))
	}
	if !isLink && (isRoot || stagedPerm != perm) {
		typ := sys.Mode & syscall.S_IFMT
		cmds = append(cmds, "mode 0"+strconv.FormatUint(uint64(typ|perm), 8))
	}
	if len(cmds) == 0 && len(xattrs) == 0 {
		return nil
	}

	dpath := "/" + rel
	if isRoot {
		dpath = "/"
	}
	q, ok := debugfsQuote(dpath)
	if !ok {
		p.metaSkipped++
		o.logf("image: %q: debugfs cannot take this name; its owner, mode and xattrs are not set", dpath)
		return nil
	}
	for _, c := range cmds {
		p.line("sif " + q + " " + c)
	}
	for _, x := range xattrs {
		xq, ok := debugfsQuote(x.name)
		if !ok || x.name == "" || strings.ContainsAny(x.name, " \t\"") {
			p.metaSkipped++
			o.logf("image: %q: xattr name %q cannot be given to debugfs; not set", dpath, x.name)
			continue
		}
		vf, err := p.valueFile(x.value)
		if err != nil {
			return err
		}
		vq, _ := debugfsQuote(vf)
		p.line("ea_set -f " + vq + " " + q + " " + xq)
	}
	return nil
}

func (p *fsPlan) line(s string) {
	p.script.WriteString(s)
	p.script.WriteByte('\n')
}

// valueFile writes an xattr value to a file for `ea_set -f`.
func (p *fsPlan) valueFile(v []byte) (string, error) {
	if p.xattrFile == 0 {
		if err := os.Mkdir(p.xattrDir, 0o700); err != nil {
			return "", fmt.Errorf("xattr values: %w", err)
		}
	}
	p.xattrFile++
	f := filepath.Join(p.xattrDir, strconv.Itoa(p.xattrFile))
	if err := os.WriteFile(f, v, 0o600); err != nil {
		return "", fmt.Errorf("xattr values: %w", err)
	}
	p.blocks++ // an xattr block, when the inode has no room
	return f, nil
}

// size is the ext4 size, in blocks, and inode count for the plan: what the
// tree needs, the inode tables, and a margin for allocation slack and
// filesystem metadata (superblock copies, group descriptors, bitmaps,
// lost+found).
func (p *fsPlan) size() (blocks, inodes int64) {
	inodes = p.inodes + p.inodes/8 + 256
	used := p.blocks + (inodes*inodeSize+blockSize-1)/blockSize
	blocks = used + used/10 + (16<<20)/blockSize
	const mib = (1 << 20) / blockSize
	blocks = (blocks + mib - 1) / mib * mib
	return blocks, inodes
}

// mkfs makes out, an ext4 of the plan's size holding the staged tree.
// mke2fs -d copies contents, modes, times and hard links; the owner on
// the root directory comes from root_owner. Should the estimate fall short
// mkfs tries again, twice, with double the room.
func mkfs(ctx context.Context, p *fsPlan, stagingDir, out string, o *Options) error {
	tool, err := findTool("mke2fs", "mkfs.ext4")
	if err != nil {
		return err
	}
	blocks, inodes := p.size()
	for attempt := 0; ; attempt++ {
		os.Remove(out)
		f, err := os.OpenFile(out, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("create %s: %w", out, err)
		}
		err = f.Truncate(blocks * blockSize)
		f.Close()
		if err != nil {
			return fmt.Errorf("size %s: %w", out, err)
		}
		cmd := exec.CommandContext(ctx, tool,
			"-q", "-F", "-t", "ext4", "-b", strconv.Itoa(blockSize), "-I", strconv.Itoa(inodeSize),
			"-m", "0", "-O", "^has_journal", "-N", strconv.FormatInt(inodes, 10),
			"-E", "root_owner=0:0", "-L", "microvm-image",
			"-d", stagingDir, out, strconv.FormatInt(blocks, 10))
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		cmd.WaitDelay = 5 * time.Second
		output, err := cmd.CombinedOutput()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		msg := strings.TrimSpace(string(output))
		if attempt < 2 && outOfRoom(msg) {
			o.logf("image: ext4 of %d blocks and %d inodes too small; trying twice the size", blocks, inodes)
			blocks, inodes = blocks*2, inodes*2
			continue
		}
		return fmt.Errorf("%s: %w: %s", filepath.Base(tool), err, msg)
	}
}

func outOfRoom(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "could not allocate") || strings.Contains(m, "no space left") ||
		strings.Contains(m, "no free space")
}

// debugfsBanner is the version line debugfs prints to stderr when it
// starts.
var debugfsBanner = regexp.MustCompile(`^debugfs [0-9][^ ]* \(.*\)$`)

// applyMeta runs the plan's debugfs script on the ext4 in one debugfs -w
// run. debugfs exits 0 even when a command fails, so its output is
// scanned: stdout should hold only the echo of each command ("debugfs:
// ..."), stderr only the banner; anything else is an error.
func applyMeta(ctx context.Context, w *workDir, image string) error {
	tool, err := findTool("debugfs")
	if err != nil {
		return err
	}
	var stdout, stderr bytes.Buffer
	outF := &lineFilter{keep: func(l string) bool { return !strings.HasPrefix(l, "debugfs: ") }, w: &stdout}
	errF := &lineFilter{keep: func(l string) bool { return !debugfsBanner.MatchString(l) }, w: &stderr}
	cmd := exec.CommandContext(ctx, tool, "-w", "-f", w.join("debugfs.cmd"), image)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Stdout, cmd.Stderr = outF, errF
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	outF.Write([]byte("\n")) // the last line, if unterminated
	errF.Write([]byte("\n"))
	if ctx.Err() != nil {
		return ctx.Err()
	}
	msg := strings.TrimSpace(stderr.String() + stdout.String())
	if err != nil {
		return fmt.Errorf("debugfs: %w: %s", err, msg)
	}
	if msg != "" {
		return fmt.Errorf("debugfs: setting owners, modes and xattrs failed: %s", msg)
	}
	return nil
}

// lineFilter passes on the lines keep accepts, up to 64 KiB of them.
type lineFilter struct {
	keep    func(string) bool
	w       *bytes.Buffer
	partial []byte
}

func (f *lineFilter) Write(b []byte) (int, error) {
	n := len(b)
	f.partial = append(f.partial, b...)
	for {
		i := bytes.IndexByte(f.partial, '\n')
		if i < 0 {
			break
		}
		line := strings.TrimRight(string(f.partial[:i]), "\r")
		f.partial = f.partial[i+1:]
		if strings.TrimSpace(line) != "" && f.keep(line) && f.w.Len() < 64<<10 {
			f.w.WriteString(line)
			f.w.WriteByte('\n')
		}
	}
	if len(f.partial) > 64<<10 {
		f.partial = f.partial[:0]
	}
	return n, nil
}
