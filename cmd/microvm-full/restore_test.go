package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/devices/virtionet"
	"github.com/microvm/microvm/internal/snapshot"
)

// craftSnapshot writes a snapshot directory holding only a "config" part
// with cfg, as someone other than microvm could: enough for restore to
// read it, and refuse it, before it builds a machine. Each disk's size
// and modification time are read from the file named.
func craftSnapshot(t *testing.T, cfg microvm.Config) string {
	t.Helper()
	type identity struct {
		Size    int64
		ModTime time.Time
	}
	saved := struct {
		Config microvm.Config
		Disks  []identity
	}{Config: cfg}
	for _, d := range cfg.Disks {
		st, err := os.Stat(d.Path)
		if err != nil {
			t.Fatal(err)
		}
		saved.Disks = append(saved.Disks, identity{st.Size(), st.ModTime()})
	}
	dir := filepath.Join(t.TempDir(), "snap")
	w, err := snapshot.Create(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddState("config", saved); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRestoreRefusesSnapshotHostResources: restore takes no host resource
// from a snapshot, whoever wrote it. A crafted one that shares the host's
// / read-write, sits on a TAP in another namespace, has a vsock socket,
// publishes a port on every address or names a disk (whose size and
// modification time anyone may read) is refused with exit status 2 and
// one line naming the flag that gives it, in the foreground and as a named
// VM (with --detach too), before anything exists: no VM record, no
// socket. (A named VM's vsock socket is its state directory's, never the
// snapshot's: only the foreground restore needs --vsock-uds.)
func TestRestoreRefusesSnapshotHostResources(t *testing.T) {
	state := t.TempDir()
	t.Setenv("MICROVM_STATE_DIR", state)
	disk := filepath.Join(t.TempDir(), "victim.img")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	base := microvm.Config{Kernel: "/gone/vmlinux", MemoryBytes: 64 << 20}
	uds := filepath.Join(t.TempDir(), "victim.sock")
	for _, tc := range []struct {
		name string
		cfg  func(*microvm.Config)
		args []string // restore's flags before DIR
		want string
		// foreground: refused only without --name
		foreground bool
	}{
		{"share of /", func(c *microvm.Config) { c.Shares = []microvm.ShareConfig{{Tag: "root", Path: "/"}} }, nil,
			`tag "root" was "/"): give each (--share tag=T,path=DIR, in order)`, false},
		{"tap", func(c *microvm.Config) { c.Nets = []microvm.NetConfig{{TAP: "tap-host"}} }, nil, `TAP "tap-host"`, false},
		{"netns", func(c *microvm.Config) { c.Nets = []microvm.NetConfig{{TAP: "t0", NetNS: "/proc/1/ns/net"}} }, nil, `namespace "/proc/1/ns/net"`, false},
		{"publish on every address", func(c *microvm.Config) {
			c.Nets = []microvm.NetConfig{{User: true, Publish: []virtionet.Publish{{Proto: "tcp", HostIP: "0.0.0.0", HostPort: 2222, GuestPort: 22}}}}
		}, nil, `published port 2222 on host address "0.0.0.0"`, false},
		{name: "vsock socket", cfg: func(c *microvm.Config) { c.Vsock = &microvm.VsockConfig{CID: 3, UDSPath: uds} },
			want: "(--vsock-uds PATH)", foreground: true},
		{"disk", func(c *microvm.Config) { c.Disks = []microvm.DiskConfig{{Path: disk}} }, nil, "(--disk PATH, in order)", false},
		{"a share, the others given", func(c *microvm.Config) {
			c.Shares = []microvm.ShareConfig{{Tag: "root", Path: "/"}}
			c.Disks = []microvm.DiskConfig{{Path: disk}}
		}, []string{"--disk", disk}, "(--share tag=T,path=DIR, in order)", false},
	} {
		cfg := base
		tc.cfg(&cfg)
		dir := craftSnapshot(t, cfg)
		for _, how := range [][]string{{"restore"}, {"restore", "--name", "t1"}, {"restore", "--name", "t1", "--detach"}} {
			if tc.foreground && len(how) > 1 {
				continue
			}
			args := append(append(how, tc.args...), dir)
			t.Run(tc.name+"/"+filepath.Base(how[len(how)-1]), func(t *testing.T) {
				wantError(t, microvm.StatusUsage, args, tc.want)
				if ents, _ := os.ReadDir(state); len(ents) > 0 {
					t.Errorf("the refused restore left %s in the state directory", ents[0].Name())
				}
				if _, err := os.Lstat(uds); err == nil {
					t.Errorf("the refused restore made the snapshot's socket %s", uds)
				}
			})
		}
	}
}
