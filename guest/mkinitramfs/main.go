// Command mkinitramfs writes the initramfs for the Linux test guest: a newc
// cpio archive (gzip-compressed when the output name ends in ".gz") holding
// the static /init built from guest/init, plus /dev (with /dev/console and
// /dev/null), /proc, /sys and /tmp.
//
//	CGO_ENABLED=0 go build -o build/guest-init ./guest/init
//	go run ./guest/mkinitramfs -o build/initramfs.cpio.gz -init build/guest-init
//
// Extra files can be added with -file GUESTPATH=HOSTPATH (repeatable); their
// parent directories are created as needed. See docs/guest-linux.md.
//
// For a distribution kernel whose drivers are modules, -kmods DIR (its
// /lib/modules/VERSION) and -kmod NAME (repeatable) add the named modules
// and, from each one's .modinfo depends=, everything they need, as
// /lib/modules/NAME.ko, and list them in load order in
// /lib/modules/load.order, which the Go /init and the agent load at start
// (pid1.LoadModules):
//
//	go run ./guest/mkinitramfs -o OUT -init INIT -kmods ROOT/lib/modules/6.1.0-57-cloud-amd64 \
//		-kmod virtio_mmio -kmod vmw_vsock_virtio_transport
package main

import (
	"flag"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/microvm/microvm/guest/initramfs"
)

type fileFlags []string

func (f *fileFlags) String() string     { return strings.Join(*f, ",") }
func (f *fileFlags) Set(v string) error { *f = append(*f, v); return nil }

func main() {
	out := flag.String("o", "", "output archive (gzip-compressed when it ends in .gz)")
	initPath := flag.String("init", "", "static binary to install as /init")
	var extra, kmods fileFlags
	flag.Var(&extra, "file", "add GUESTPATH=HOSTPATH (repeatable)")
	kmodDir := flag.String("kmods", "", "a kernel's /lib/modules/VERSION directory, for -kmod")
	flag.Var(&kmods, "kmod", "add kernel module NAME and its dependencies, loaded at boot in order (repeatable; needs -kmods)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: mkinitramfs -o OUT -init BINARY [-file GUEST=HOST]...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || *initPath == "" || flag.NArg() != 0 || (len(kmods) > 0) != (*kmodDir != "") {
		flag.Usage()
		os.Exit(2)
	}
	cleanup := func() {}
	if len(kmods) > 0 {
		more, c, err := moduleFiles(*kmodDir, kmods)
		if err != nil {
			fmt.Fprintf(os.Stderr, "mkinitramfs: %v\n", err)
			os.Exit(1)
		}
		extra, cleanup = append(extra, more...), c
	}
	err := run(*out, *initPath, extra)
	cleanup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkinitramfs: %v\n", err)
		os.Exit(1)
	}
}

// moduleFiles resolves the named modules under dir and returns -file specs
// for them and for the load order list (written to a temporary file, which
// cleanup removes).
func moduleFiles(dir string, names []string) (specs []string, cleanup func(), err error) {
	idx, err := indexModules(dir)
	if err != nil {
		return nil, nil, err
	}
	order, err := idx.loadOrder(names)
	if err != nil {
		return nil, nil, err
	}
	var list strings.Builder
	for _, p := range order {
		g := "/lib/modules/" + modName(filepath.Base(p)) + ".ko"
		specs = append(specs, g+"="+p)
		list.WriteString(g + "\n")
	}
	f, err := os.CreateTemp("", "load.order-*")
	if err != nil {
		return nil, nil, err
	}
	cleanup = func() { os.Remove(f.Name()) }
	_, err = f.WriteString(list.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return append(specs, "/lib/modules/load.order="+f.Name()), cleanup, nil
}

func run(out, initPath string, extra []string) error {
	initData, err := os.ReadFile(initPath)
	if err != nil {
		return err
	}
	if err := initramfs.CheckStaticELF(initPath); err != nil {
		return err
	}

	dir := filepath.Dir(out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".mkinitramfs-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename this is a no-op error

	w := initramfs.NewWriter(tmp)
	if strings.HasSuffix(out, ".gz") {
		w = initramfs.NewGzipWriter(tmp)
	}
	if err := writeEntries(w, initData, extra); err != nil {
		tmp.Close()
		return err
	}
	if err := w.Close(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

func writeEntries(w *initramfs.Writer, initData []byte, extra []string) error {
	steps := []func() error{
		func() error { return w.Dir("dev", 0o755) },
		// The kernel opens /dev/console for init's stdin/stdout/stderr before
		// /init runs, so it must exist in the archive; /init then mounts
		// devtmpfs over /dev.
		func() error { return w.CharDev("dev/console", 0o600, 5, 1) },
		func() error { return w.CharDev("dev/null", 0o666, 1, 3) },
		func() error { return w.Dir("proc", 0o555) },
		func() error { return w.Dir("sys", 0o555) },
		func() error { return w.Dir("tmp", 0o1777) },
		func() error { return w.File("init", 0o755, initData) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	dirs := map[string]bool{"dev": true, "proc": true, "sys": true, "tmp": true}
	for _, spec := range extra {
		guest, host, ok := strings.Cut(spec, "=")
		if !ok || guest == "" || host == "" {
			return fmt.Errorf("-file %q: want GUESTPATH=HOSTPATH", spec)
		}
		name, err := initramfs.CleanPath(guest)
		if err != nil {
			return err
		}
		fi, err := os.Stat(host)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("-file %q: %s is not a regular file", spec, host)
		}
		data, err := os.ReadFile(host)
		if err != nil {
			return err
		}
		if err := mkdirAll(w, dirs, path.Dir(name)); err != nil {
			return err
		}
		if err := w.File(name, uint32(fi.Mode().Perm()), data); err != nil {
			return err
		}
	}
	return nil
}

// mkdirAll adds dir and its missing ancestors to the archive.
func mkdirAll(w *initramfs.Writer, dirs map[string]bool, dir string) error {
	if dir == "." || dirs[dir] {
		return nil
	}
	if err := mkdirAll(w, dirs, path.Dir(dir)); err != nil {
		return err
	}
	dirs[dir] = true
	return w.Dir(dir, 0o755)
}
