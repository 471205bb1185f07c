package microvm

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/devices/virtionet"
)

// TestRestoreConfig: a restore keeps the snapshot's machine and takes the
// host's resources (console, log, vsock CID and socket, disk paths), and
// refuses a host configuration that does not fit the machine, and disks
// that changed since the snapshot, with ErrConfig and a line naming why.
func TestRestoreConfig(t *testing.T) {
	dir := t.TempDir()
	disk, st := snapshotTestDisk(t, dir)
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
		change func(*savedConfig)
		want   string
	}{
		{"more disks than saved", Config{Vsock: host.Vsock, Disks: []DiskConfig{{Path: disk}, {Path: disk}}}, nil, "2 disks given; the snapshot's machine has 1"},
		{"vsock on a machine without", Config{Vsock: &VsockConfig{CID: 4}, Disks: host.Disks}, func(s *savedConfig) { s.Config.Vsock = nil }, "the snapshot's machine has none"},
		{"disk written since", host, func(*savedConfig) {
			if err := os.Chtimes(disk, time.Now(), st.ModTime().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
		}, "changed since the snapshot"},
		{"disk gone", Config{Vsock: host.Vsock, Disks: []DiskConfig{{Path: disk + ".x"}}}, nil, "no such file"},
		{"share tag not the saved one", Config{Vsock: host.Vsock, Disks: host.Disks, Shares: []ShareConfig{{Tag: "other", Path: dir}}},
			func(s *savedConfig) { s.Config.Shares = []ShareConfig{{Tag: "data", Path: "/"}} }, `tag "other" given; the snapshot's guest knows it as "data"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := saved
			s.Config.Vsock = &VsockConfig{CID: 3, UDSPath: "/old/v.sock"}
			if tc.change != nil {
				tc.change(&s)
			}
			_, err := s.restoreConfig(tc.host)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v; want ErrConfig saying %q", err, tc.want)
			}
		})
	}
}

// TestRestoreConfigHostResources: a snapshot is its writer's word, so a
// restore takes no host resource from it. A crafted snapshot whose machine
// shares the host's / read-write, sits on a TAP in another network
// namespace, has a vsock socket, publishes a port on every address or has
// a disk is refused, with ErrSnapshotHostResource and a line naming what
// and the flag that gives it, unless the restore gives each again; then
// the restore's are used, and the snapshot's only narrow them (a share it
// saved read-only stays so). Its user-mode network device and loopback
// ports need no word of the caller.
func TestRestoreConfigHostResources(t *testing.T) {
	dir := t.TempDir()
	disk, st := snapshotTestDisk(t, dir)
	loopback := []virtionet.Publish{{Proto: "tcp", HostIP: "127.0.0.1", HostPort: 8080, GuestPort: 80}}
	crafted := func() savedConfig {
		return savedConfig{Config: Config{Kernel: "/gone/vmlinux", MemoryBytes: 128 << 20,
			Vsock:  &VsockConfig{CID: 3, UDSPath: "/run/victim.sock"},
			Disks:  []DiskConfig{{Path: "/etc/shadow-like.img"}},
			Nets:   []NetConfig{{TAP: "tap-host", NetNS: "/proc/1/ns/net"}, {User: true, Publish: loopback}},
			Shares: []ShareConfig{{Tag: "root", Path: "/"}}},
			Disks: []diskIdentity{{Size: st.Size(), ModTime: st.ModTime()}}}
	}
	vsock := &VsockConfig{UDSPath: filepath.Join(dir, "v.sock")}
	disks := []DiskConfig{{Path: disk}}
	nets := []NetConfig{{TAP: "tap-mine"}, {User: true}}
	shares := []ShareConfig{{Tag: "root", Path: dir}}
	for _, tc := range []struct {
		name   string
		change func(*savedConfig)
		host   Config
		want   string
	}{
		{"share of /", nil, Config{Vsock: vsock, Disks: disks, Nets: nets}, `tag "root" was "/"): give each (--share tag=T,path=DIR`},
		{"tap", nil, Config{Vsock: vsock, Disks: disks, Shares: shares}, `on TAP "tap-host" in namespace "/proc/1/ns/net": give each device (--net`},
		{"netns", func(s *savedConfig) { s.Config.Nets[0].TAP = "" }, Config{Vsock: vsock, Disks: disks, Shares: shares}, `namespace "/proc/1/ns/net"`},
		{"tap, a MAC only given", nil, Config{Vsock: vsock, Disks: disks, Shares: shares,
			Nets: []NetConfig{{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}, {MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}}}, `TAP "tap-host"`},
		{"vsock socket", nil, Config{Disks: disks, Nets: nets, Shares: shares}, `host socket "/run/victim.sock": give one (--vsock-uds PATH)`},
		{"vsock socket, a CID only given", nil, Config{Vsock: &VsockConfig{CID: 7}, Disks: disks, Nets: nets, Shares: shares}, `(--vsock-uds PATH)`},
		{"publish on every address", func(s *savedConfig) {
			s.Config.Nets[1].Publish = []virtionet.Publish{{Proto: "tcp", HostIP: "0.0.0.0", HostPort: 22, GuestPort: 22}}
		}, Config{Vsock: vsock, Disks: disks, Shares: shares, Nets: []NetConfig{{TAP: "tap-mine"}, {MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}}}},
			`published port 22 on host address "0.0.0.0": give each device (--net user, in order, with --publish)`},
		{"publish on no address", func(s *savedConfig) {
			s.Config.Nets = s.Config.Nets[1:]
			s.Config.Nets[0].Publish = []virtionet.Publish{{Proto: "udp", HostPort: 53, GuestPort: 53}}
		}, Config{Vsock: vsock, Disks: disks, Shares: shares}, `published port 53 on host address ""`},
		{"disk", nil, Config{Vsock: vsock, Nets: nets, Shares: shares}, `had 1 disks (the first "/etc/shadow-like.img"): give each image (--disk PATH`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := crafted()
			if tc.change != nil {
				tc.change(&s)
			}
			c, err := s.restoreConfig(tc.host)
			if !errors.Is(err, ErrSnapshotHostResource) || !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v (config %+v); want ErrSnapshotHostResource saying %q", err, c, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("the refusal is more than one line: %q", err)
			}
		})
	}

	// Given again, the restore's own are used.
	s := crafted()
	s.Config.Shares[0].ReadOnly = true
	c, err := s.restoreConfig(Config{Vsock: vsock, Disks: disks, Nets: nets, Shares: []ShareConfig{{Path: dir}}})
	if err != nil {
		t.Fatalf("restoreConfig with every host resource given: %v", err)
	}
	if c.Vsock.UDSPath != vsock.UDSPath || c.Vsock.CID != 3 || c.Disks[0].Path != disk ||
		c.Nets[0].TAP != "tap-mine" || c.Nets[0].NetNS != "" || c.Nets[1].Publish != nil ||
		c.Shares[0] != (ShareConfig{Tag: "root", Path: dir, ReadOnly: true}) {
		t.Errorf("restored with %+v, vsock %+v; want the restore's resources only, the share read-only as saved", c, *c.Vsock)
	}

	// A user-mode network with loopback ports is kept, as it is or with a
	// new MAC, rebuilt from what names no host resource.
	s = crafted()
	s.Config.Nets = s.Config.Nets[1:]
	s.Config.Nets[0].MAC = net.HardwareAddr{2, 0, 0, 0, 0, 9}
	for _, h := range [][]NetConfig{nil, {{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 3}}}} {
		c, err := s.restoreConfig(Config{Vsock: vsock, Disks: disks, Nets: h, Shares: shares})
		if err != nil {
			t.Fatalf("restoreConfig of a user-mode network, given %v: %v", h, err)
		}
		want := NetConfig{User: true, Publish: loopback, MAC: s.Config.Nets[0].MAC}
		if h != nil {
			want.MAC = h[0].MAC
		}
		if len(c.Nets) != 1 || !reflect.DeepEqual(c.Nets[0], want) {
			t.Errorf("given %v: nets %+v; want %+v", h, c.Nets, want)
		}
	}
}

// snapshotTestDisk writes a 4 KiB disk image in dir for a saved Config to
// name, and returns its path and what the snapshot would have seen of it.
func snapshotTestDisk(t *testing.T, dir string) (string, os.FileInfo) {
	t.Helper()
	disk := filepath.Join(dir, "d.img")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(disk)
	if err != nil {
		t.Fatal(err)
	}
	return disk, st
}
