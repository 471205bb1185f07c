package execvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/guest/agentimage"
	"github.com/microvm/microvm/internal/agentvm"
)

// exec --snapshot DIR (docs/snapshot.md, "Warm start"): the first exec
// with DIR boots the VM, waits for its agent, snapshots it into DIR and
// runs the command; every later one restores a clone of DIR instead of
// booting, runs the command in it and throws the clone away. Guest memory
// is mapped copy-on-write from DIR, so the clones' writes (to the
// initramfs, or an --image's tmpfs overlay) never reach it; disks must be
// readonly or cow (an --image's root is readonly). What the boot wrote to
// a cow disk before the agent answered (a file system's mount, say) is in
// DIR's snapshot, and each clone starts from it in an overlay of its own.
//
// DIR's label LabelExecKey is a digest of what shapes the machine (the
// kernel file, CPUs, memory, devices, the agent image's sources): an exec
// whose flags give another digest is refused rather than handed a machine
// it did not ask for.

// LabelExecKey is the snapshot label holding an exec snapshot's key.
const LabelExecKey = "microvm.exec-key"

// WarmStart is exec --snapshot's choice for one run.
type WarmStart struct {
	dir string
	key string
	// snap is DIR's snapshot when it holds one; nil when this exec makes it.
	snap *microvm.SnapshotInfo
}

// CheckWarmStart computes the key of the machine cfg (no initrd, no
// console) booted with the agent image img and looks at dir: an empty or
// missing dir is made by this run, a snapshot with the same key is
// restored, anything else is refused. What a warm start cannot do with
// cfg's devices is the caller's to refuse first.
func CheckWarmStart(dir string, cfg microvm.Config, img agentimage.Options) (*WarmStart, error) {
	key, err := machineKey(cfg, img)
	if err != nil {
		return nil, err
	}
	w := &WarmStart{dir: dir, key: key}
	if ents, err := os.ReadDir(dir); errors.Is(err, fs.ErrNotExist) || err == nil && len(ents) == 0 {
		return w, nil // this exec makes it
	}
	info, err := microvm.ReadSnapshot(dir)
	switch {
	case err != nil:
		return nil, fmt.Errorf("exec --snapshot %s: %w", dir, err)
	case info.Labels[LabelExecKey] == "":
		return nil, fmt.Errorf("exec --snapshot %s: not a snapshot exec made (no %s label)", dir, LabelExecKey)
	case info.Labels[LabelExecKey] != key:
		return nil, fmt.Errorf("exec --snapshot %s: made for another kernel, machine or agent image than these flags give; "+
			"remove it (it is made again) or give another directory", dir)
	}
	w.snap = &info
	return w, nil
}

// machineKey digests what shapes exec's machine: its Config (no host
// streams), the kernel's, the disks' (an --image's root among them) and
// the agent image sources' sizes and modification times (a directory's
// walked).
func machineKey(cfg microvm.Config, img agentimage.Options) (string, error) {
	type stamp struct {
		Path    string
		Size    int64
		ModTime time.Time
	}
	var stamps []stamp
	add := func(p string) error {
		return filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			stamps = append(stamps, stamp{path, fi.Size(), fi.ModTime()})
			return nil
		})
	}
	cfg.Log = nil
	srcs := []string{cfg.Kernel}
	for _, d := range cfg.Disks {
		srcs = append(srcs, d.Path)
	}
	if img.Agent != "" {
		srcs = append(srcs, img.Agent)
	}
	if img.Busybox != "" {
		srcs = append(srcs, img.Busybox)
	}
	for _, f := range img.Files {
		srcs = append(srcs, f.Src)
	}
	for _, p := range srcs {
		if err := add(p); err != nil {
			return "", fmt.Errorf("exec --snapshot: %w", err)
		}
	}
	h := sha256.New()
	err := json.NewEncoder(h).Encode(struct {
		Config microvm.Config
		Files  []stamp
		Image  any
	}{cfg, stamps, img})
	if err != nil {
		return "", fmt.Errorf("exec --snapshot: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// restore is the clone of DIR this exec runs in, with network devices of
// its own MACs (runIn has the agent take them: agentapi.AdoptMACs). The
// host resources are own's (this exec's flags'), never DIR's: its key
// label digests what anyone may read, so a DIR someone else wrote could
// carry a matching key beside a machine of their own.
func (w *WarmStart) restore(own microvm.Config, console io.Writer) (*microvm.Machine, error) {
	// Non-nil: exactly exec's devices, none when it gives none.
	given := make([]microvm.NetConfig, len(own.Nets))
	for i, n := range own.Nets {
		n.MAC = nil // the snapshot's guest has it: each clone draws its own
		given[i] = n
	}
	nets, err := agentvm.CloneNets(given, nil)
	if err != nil {
		return nil, err
	}
	if nets == nil {
		nets = []microvm.NetConfig{}
	}
	return microvm.Restore(w.dir, microvm.Config{Console: console, Log: own.Log, Vsock: own.Vsock,
		Disks: own.Disks, Nets: nets, Shares: own.Shares})
}

// save snapshots the freshly booted m, whose agent answered on cc, into
// DIR, and returns a new connection to the agent (a snapshot ends vsock
// connections). DIR made meanwhile by another exec is left as it is.
func (w *WarmStart) save(ctx context.Context, o Options, m *microvm.Machine, cc *agentapi.Conn, vmDone <-chan struct{}) (*agentapi.Conn, error) {
	cc.Close()
	log := o.Config.Log
	if log == nil {
		log = logrus.StandardLogger() // as New takes a nil Log
	}
	err := m.Snapshot(ctx, w.dir, microvm.SnapshotOptions{Labels: map[string]string{LabelExecKey: w.key}})
	switch {
	case errors.Is(err, microvm.ErrSnapshotExists):
		log.WithField("dir", w.dir).Info("exec --snapshot: another exec made the snapshot first; this one is not kept")
	case err != nil:
		return nil, fmt.Errorf("exec --snapshot %s: %w", w.dir, err)
	default:
		log.WithField("dir", w.dir).Info("exec --snapshot: snapshot of the booted VM written")
	}
	return agentvm.Wait(ctx, m, o.BootTimeout, vmDone)
}
