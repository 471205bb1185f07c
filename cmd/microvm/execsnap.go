//go:build !microvm_lean

package main

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

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
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
// DIR's label labelExecKey is a digest of what shapes the machine (the
// kernel file, CPUs, memory, devices, the agent image's sources): an exec
// whose flags give another digest is refused rather than handed a machine
// it did not ask for.

// labelExecKey is the snapshot label holding an exec snapshot's key.
const labelExecKey = "microvm.exec-key"

// warmStart is exec --snapshot's choice for this run.
type warmStart struct {
	dir string
	key string
	// snap is DIR's snapshot when it holds one; nil when this exec makes it.
	snap *microvm.SnapshotInfo
}

// checkWarmStart refuses what --snapshot cannot do yet, computes the key
// and looks at DIR.
func (o *execOpts) checkWarmStart(dir string) (*warmStart, error) {
	for _, d := range o.devices.Disks {
		if !d.ReadOnly && !d.CopyOnWrite {
			return nil, usagef("--snapshot: disk %s takes writes, which would reach the image every clone starts from: give it readonly or cow", d.Path)
		}
	}
	switch d := o.devices; {
	case len(d.Shares) > 0:
		return nil, usagef("--snapshot: not with shared directories (--share) yet: a restored guest's open files there are lost")
	case o.root != "":
		return nil, usagef("--snapshot: not with --chroot")
	}
	key, err := o.machineKey()
	if err != nil {
		return nil, err
	}
	w := &warmStart{dir: dir, key: key}
	if ents, err := os.ReadDir(dir); errors.Is(err, fs.ErrNotExist) || err == nil && len(ents) == 0 {
		return w, nil // this exec makes it
	}
	info, err := microvm.ReadSnapshot(dir)
	switch {
	case err != nil:
		return nil, fmt.Errorf("exec --snapshot %s: %w", dir, err)
	case info.Labels[labelExecKey] == "":
		return nil, fmt.Errorf("exec --snapshot %s: not a snapshot exec made (no %s label)", dir, labelExecKey)
	case info.Labels[labelExecKey] != key:
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
func (o *execOpts) machineKey() (string, error) {
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
	cfg := o.machineConfig("", nil)
	cfg.Log = nil
	srcs := []string{o.kernel}
	for _, d := range cfg.Disks {
		srcs = append(srcs, d.Path)
	}
	if o.image.Agent != "" {
		srcs = append(srcs, o.image.Agent)
	}
	if o.image.Busybox != "" {
		srcs = append(srcs, o.image.Busybox)
	}
	for _, f := range o.image.Files {
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
	}{cfg, stamps, o.image})
	if err != nil {
		return "", fmt.Errorf("exec --snapshot: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// restore is the clone of DIR this exec runs in, with network devices of
// its own MACs (runExecIn has the agent take them: agentvm.AdoptMACs). The
// host resources are this exec's flags', never DIR's: its key label
// digests what anyone may read, so a DIR someone else wrote could carry
// a matching key beside a machine of their own.
func (w *warmStart) restore(o *execOpts, console io.Writer) (*microvm.Machine, error) {
	own := o.machineConfig("", console)
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
	return microvm.Restore(w.dir, microvm.Config{Console: console, Log: o.log, Vsock: own.Vsock,
		Disks: own.Disks, Nets: nets, Shares: own.Shares})
}

// save snapshots the freshly booted m, whose agent answered on cc, into
// DIR, and returns a new connection to the agent (a snapshot ends vsock
// connections). DIR made meanwhile by another exec is left as it is.
func (w *warmStart) save(ctx context.Context, o *execOpts, m *microvm.Machine, cc *agentapi.Conn, vmDone <-chan struct{}) (*agentapi.Conn, error) {
	cc.Close()
	err := m.Snapshot(ctx, w.dir, microvm.SnapshotOptions{Labels: map[string]string{labelExecKey: w.key}})
	switch {
	case errors.Is(err, microvm.ErrSnapshotExists):
		o.log.WithField("dir", w.dir).Info("exec --snapshot: another exec made the snapshot first; this one is not kept")
	case err != nil:
		return nil, fmt.Errorf("exec --snapshot %s: %w", w.dir, err)
	default:
		o.log.WithField("dir", w.dir).Info("exec --snapshot: snapshot of the booted VM written")
	}
	return agentvm.Wait(ctx, m, o.bootTimeout, vmDone)
}
