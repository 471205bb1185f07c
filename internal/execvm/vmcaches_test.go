package execvm

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/microvm/microvm"
)

// TestVMCachesCommitDecision: run --cache's caches are committed only
// when the guest unmounted them after the main process ended 0 and the VM
// then ended without error; every other end discards the clone and keeps
// the store as it was.
func TestVMCachesCommitDecision(t *testing.T) {
	for _, tc := range []struct {
		name          string
		writeBack     bool // the main process ended 0: AfterMain ran
		unmountStatus int
		vmOK          bool // the VM's process ended with status 0
		want          bool
	}{
		{"main process exited 0", true, 0, true, true},
		{"main process exited 1", false, 0, false, false},
		{"stopped or killed before the main process ended", false, 0, true, false},
		{"guest could not unmount", true, 32, true, false},
		{"VM failed after the unmount", true, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			var cfg microvm.Config
			v, err := AttachCaches(context.Background(), &cfg, s, []Cache{{Name: "go", GuestPath: "/root/go", Size: 8 << 20}})
			if err != nil {
				t.Fatal(err)
			}
			r := &stepRunner{unmountStatus: tc.unmountStatus}
			if err := v.SetUp(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			if tc.writeBack {
				err := v.WriteBack(context.Background(), r)
				if (err != nil) != (tc.unmountStatus != 0) {
					t.Errorf("WriteBack: %v", err)
				}
				// Its errors name run, not exec.
				if err != nil && !strings.HasPrefix(err.Error(), "run: cache go not kept: unmounting /root/go failed") {
					t.Errorf("WriteBack: %v, want run's words", err)
				}
			}
			committed, err := v.Finish(tc.vmOK)
			if err != nil || committed != tc.want {
				t.Errorf("Finish(%v) = %v, %v; want %v, nil (steps %q)", tc.vmOK, committed, err, tc.want, r.steps)
			}
			wantVersion := 0
			if tc.want {
				wantVersion = 1
			}
			if got := newest(t, s, "go"); got != wantVersion {
				t.Errorf("newest version %d, want %d", got, wantVersion)
			}
			if _, err := os.Stat(cfg.Disks[0].Path); !os.IsNotExist(err) {
				t.Errorf("the clone %s is left behind (%v)", cfg.Disks[0].Path, err)
			}
		})
	}
}
