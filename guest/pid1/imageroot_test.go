//go:build linux

package pid1

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParseImageRoot(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    ImageRoot
		ok      bool
	}{
		{"console=ttyS0 quiet", ImageRoot{}, false},
		{"console=ttyS0 microvm.root=/dev/vda quiet", ImageRoot{Device: "/dev/vda"}, true},
		{"microvm.rootsize=512m microvm.root=/dev/vdb\n", ImageRoot{Device: "/dev/vdb", TmpfsSize: "512m"}, true},
		{"microvm.root= microvm.rootsize=1g", ImageRoot{TmpfsSize: "1g"}, false},
		{"microvm.root=tmpfs microvm.rootsize=64m", ImageRoot{Device: RootTmpfs, TmpfsSize: "64m"}, true},
	} {
		got, ok := ParseImageRoot(tc.cmdline)
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParseImageRoot(%q) = %+v, %v; want %+v, %v", tc.cmdline, got, ok, tc.want, tc.ok)
		}
	}
}

func TestWriteNetworkFiles(t *testing.T) {
	dir := t.TempDir()
	pnp := filepath.Join(dir, "pnp")
	etc := filepath.Join(dir, "etc")
	logf := func(format string, args ...any) { t.Errorf(format, args...) }

	// No DHCP: no resolv.conf is made, an image's own is kept; hosts is
	// written when missing.
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../run/systemd/resolve/stub-resolv.conf", filepath.Join(etc, "resolv.conf")); err != nil {
		t.Fatal(err)
	}
	writeNetworkFiles(pnp, etc, logf)
	if l, err := os.Readlink(filepath.Join(etc, "resolv.conf")); err != nil || l != "../run/systemd/resolve/stub-resolv.conf" {
		t.Errorf("without DHCP the image's resolv.conf changed: %q, %v", l, err)
	}
	if b, err := os.ReadFile(filepath.Join(etc, "hosts")); err != nil || len(b) == 0 {
		t.Errorf("hosts not written: %q, %v", b, err)
	}

	// DHCP named a server: the link is replaced by a file; an existing
	// hosts is kept.
	const lease = "#PROTO: DHCP\nnameserver 192.168.127.1\n"
	if err := os.WriteFile(pnp, []byte(lease), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeNetworkFiles(pnp, etc, logf)
	if b, err := os.ReadFile(filepath.Join(etc, "resolv.conf")); err != nil || string(b) != lease {
		t.Errorf("resolv.conf = %q, %v; want %q", b, err, lease)
	}
	if fi, err := os.Lstat(filepath.Join(etc, "resolv.conf")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("resolv.conf is not a plain file: %v, %v", fi, err)
	}
	if b, _ := os.ReadFile(filepath.Join(etc, "hosts")); string(b) != "mine\n" {
		t.Errorf("an existing hosts was replaced: %q", b)
	}
}
