// Package agentimage writes the initramfs that `microvm exec` boots: the
// guest agent (guest/agent/cmd/microvm-agent) as /init, Debian's static
// busybox with a link per applet in /bin (so sh and the core utilities
// exist), and files the user adds. The archive is a newc cpio written with
// package initramfs; nothing is read from the guest.
//
// Data flow: Build reads the agent, busybox and each added file from the
// host and streams them into the archive in order; `busybox --list` (run on
// the host: the binary is static) names the applet links.
package agentimage

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strings"

	"github.com/microvm/microvm/guest/initramfs"
)

// File is one host file to add at a guest path.
type File struct {
	Src string // host path
	Dst string // absolute guest path
}

// ParseAdd reads a --add value, SRC:DST with DST absolute. SRC may itself
// contain colons; DST is what follows the last one.
func ParseAdd(s string) (File, error) {
	i := strings.LastIndexByte(s, ':')
	if i <= 0 || i == len(s)-1 {
		return File{}, fmt.Errorf("--add %q: want SRC:DST", s)
	}
	f := File{Src: s[:i], Dst: s[i+1:]}
	if !path.IsAbs(f.Dst) {
		return File{}, fmt.Errorf("--add %q: the guest path %q must be absolute", s, f.Dst)
	}
	return f, nil
}

// Options says what goes into the image.
type Options struct {
	Agent   string // the static agent binary, installed as /init
	Busybox string // a static busybox, installed as /bin/busybox ("" leaves it out)
	Files   []File
}

// ErrNotStatic is returned for an agent or busybox that needs a dynamic
// loader: the guest has none.
var ErrNotStatic = initramfs.ErrNotStatic

// Build writes the archive to w (uncompressed: the kernel takes it as is,
// and compressing the agent costs more time than it saves here).
func Build(w io.Writer, o Options) error {
	bw := bufio.NewWriter(w)
	cw := initramfs.NewWriter(bw)
	err := build(cw, o)
	if cerr := cw.Close(); err == nil {
		err = cerr
	}
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	return err
}

// WriteFile writes the image to path.tmp and renames it to path once
// it is complete; on failure path.tmp is removed and path is left alone.
func WriteFile(path string, o Options) (err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	err = Build(f, o)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func build(cw *initramfs.Writer, o Options) error {
	for _, d := range []string{"dev", "proc", "sys", "tmp", "run", "root", "bin", "sbin", "usr", "usr/bin", "usr/sbin", "etc"} {
		if err := cw.Dir(d, 0o755); err != nil {
			return err
		}
	}
	if err := cw.CharDev("dev/console", 0o600, 5, 1); err != nil {
		return err
	}
	if err := cw.CharDev("dev/null", 0o666, 1, 3); err != nil {
		return err
	}
	agent, err := readStatic("agent", o.Agent)
	if errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("%w (the guest agent: make builds bin/microvm-agent; or give --agent)", err)
	}
	if err != nil {
		return err
	}
	if err := cw.File("init", 0o755, agent); err != nil {
		return err
	}
	// The user's files first: a busybox applet link never replaces one.
	for _, f := range o.Files {
		if err := addFile(cw, f); err != nil {
			return err
		}
	}
	if o.Busybox != "" {
		if err := addBusybox(cw, o.Busybox); err != nil {
			return err
		}
	}
	return nil
}

// readStatic checks that p is a static x86-64 ELF executable and reads it.
func readStatic(what, p string) ([]byte, error) {
	if err := initramfs.CheckStaticELF(p); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return b, nil
}

func addBusybox(cw *initramfs.Writer, p string) error {
	bb, err := readStatic("busybox", p)
	if err != nil {
		return fmt.Errorf("%w (install Debian's busybox-static, or give another static busybox)", err)
	}
	out, err := exec.Command(p, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox %s --list-full: %w", p, err)
	}
	if !cw.Has("bin/busybox") {
		if err := cw.File("bin/busybox", 0o755, bb); err != nil {
			return err
		}
	}
	for _, l := range strings.Fields(string(out)) {
		// "bin/sh", "usr/bin/awk", ...: link each applet where busybox
		// would install it, unless the layout already has that name.
		l = strings.TrimPrefix(l, "/")
		if l == "bin/busybox" || strings.Contains(l, "..") || !strings.Contains(l, "/") {
			continue
		}
		if !knownDir(path.Dir(l)) || cw.Has(l) {
			continue
		}
		if err := cw.Symlink(l, "/bin/busybox"); err != nil {
			return fmt.Errorf("busybox applet %s: %w", l, err)
		}
	}
	return nil
}

func knownDir(d string) bool {
	switch d {
	case "bin", "sbin", "usr/bin", "usr/sbin":
		return true
	}
	return false
}

// addFile adds a host file (or a directory, recursively) at f.Dst, creating
// the parent directories.
func addFile(cw *initramfs.Writer, f File) error {
	st, err := os.Stat(f.Src)
	if err != nil {
		return fmt.Errorf("--add %s: %w", f.Src, err)
	}
	dst := strings.TrimPrefix(path.Clean(f.Dst), "/")
	if dst == "" || dst == "." {
		return fmt.Errorf("--add %s: cannot replace the guest's root", f.Src)
	}
	if err := parents(cw, dst); err != nil {
		return err
	}
	return addTree(cw, f.Src, dst, st)
}

func addTree(cw *initramfs.Writer, src, dst string, st os.FileInfo) error {
	switch {
	case st.Mode().IsRegular():
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("--add %s: %w", src, err)
		}
		return cw.File(dst, uint32(st.Mode().Perm()), b)
	case st.IsDir():
		if err := cw.Dir(dst, uint32(st.Mode().Perm())); err != nil {
			return err
		}
		ents, err := os.ReadDir(src)
		if err != nil {
			return fmt.Errorf("--add %s: %w", src, err)
		}
		for _, e := range ents {
			est, err := os.Lstat(src + "/" + e.Name())
			if err != nil {
				return fmt.Errorf("--add %s: %w", src, err)
			}
			if est.Mode()&os.ModeSymlink != 0 {
				t, err := os.Readlink(src + "/" + e.Name())
				if err != nil {
					return err
				}
				if err := cw.Symlink(dst+"/"+e.Name(), t); err != nil {
					return err
				}
				continue
			}
			if err := addTree(cw, src+"/"+e.Name(), dst+"/"+e.Name(), est); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("--add %s: not a regular file or directory", src)
}

// parents writes the directories above dst that the base layout lacks.
func parents(cw *initramfs.Writer, dst string) error {
	var dirs []string
	for d := path.Dir(dst); d != "." && d != "/"; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if cw.Has(d) {
			continue
		}
		if err := cw.Dir(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}
