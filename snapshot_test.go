package microvm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRestoreConfig: a restore keeps the snapshot's machine and takes the
// host's resources (console, log, vsock CID and socket, disk paths), and
// refuses a host configuration that does not fit the machine, and disks
// that changed since the snapshot, with ErrConfig and a line naming why.
func TestRestoreConfig(t *testing.T) {
	dir := t.TempDir()
	disk := filepath.Join(dir, "d.img")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(disk)
	if err != nil {
		t.Fatal(err)
	}
	saved := savedConfig{
		Config: Config{Kernel: "/gone/vmlinux", CPUs: 2, MemoryBytes: 128 << 20, Cmdline: "console=ttyS0",
			Vsock: &VsockConfig{CID: 3, UDSPath: "/old/v.sock", ConnBuffer: 65536},
			Disks: []DiskConfig{{Path: "/old/d.img", Serial: "data"}}},
		Disks: []diskIdentity{{Size: st.Size(), ModTime: st.ModTime()}},
	}
	host := Config{Vsock: &VsockConfig{CID: 9, UDSPath: "/new/v.sock"}, Disks: []DiskConfig{{Path: disk}}, MetricsSocket: "/new/m.sock"}
	c, err := saved.restoreConfig(host)
	if err != nil {
		t.Fatalf("restoreConfig: %v", err)
	}
	if c.CPUs != 2 || c.MemoryBytes != 128<<20 || c.Cmdline != "console=ttyS0" || c.MetricsSocket != "/new/m.sock" {
		t.Errorf("machine: %+v", c)
	}
	if v := c.Vsock; v.CID != 9 || v.UDSPath != "/new/v.sock" || v.ConnBuffer != 65536 {
		t.Errorf("vsock: %+v; want the host's CID and socket with the snapshot's buffer", *v)
	}
	if d := c.Disks[0]; d.Path != disk || d.Serial != "data" {
		t.Errorf("disk: %+v; want the host's path with the snapshot's serial", d)
	}
	if saved.Config.Disks[0].Path != "/old/d.img" || saved.Config.Vsock.CID != 3 {
		t.Error("restoreConfig changed the saved config")
	}

	for _, tc := range []struct {
		name   string
		host   Config
		change func()
		want   string
	}{
		{"more disks than saved", Config{Disks: []DiskConfig{{Path: disk}, {Path: disk}}}, nil, "2 disks given; the snapshot's machine has 1"},
		{"vsock on a machine without", Config{Vsock: &VsockConfig{CID: 4}}, func() { saved.Config.Vsock = nil }, "the snapshot's machine has none"},
		{"disk written since", Config{Disks: []DiskConfig{{Path: disk}}}, func() {
			if err := os.Chtimes(disk, time.Now(), st.ModTime().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}, "changed since the snapshot"},
		{"disk gone", Config{Disks: []DiskConfig{{Path: disk + ".x"}}}, nil, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.change != nil {
				tc.change()
			}
			_, err := saved.restoreConfig(tc.host)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v; want ErrConfig saying %q", err, tc.want)
			}
		})
	}
}
