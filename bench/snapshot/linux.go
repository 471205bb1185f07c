package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/bench/internal/agentguest"
)

// linuxConfig is what the linux subcommand's flags set.
type linuxConfig struct {
	kernel, agent, busybox string
	n                      int // cold boots, and restores
	cpus                   int
	memory                 uint64
	dirty                  []uint64 // bytes to touch, ascending
	dirtyMemory            uint64   // the guest memory of the dirty runs
	prefault               bool     // restore with PrefaultMemory too
	dropCache              bool     // restore with the page cache dropped too
	timeout                time.Duration
	jsonOut                string
}

// runLinux fills rep: cold boots against restores, both to the agent
// answering, then snapshot sizes against memory touched. dir holds the
// image, the snapshots and the sockets.
func runLinux(ctx context.Context, cfg *linuxConfig, rep *linuxReport, dir string) {
	defer rep.summarise()
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := agentguest.WriteImage(initrd, cfg.agent, cfg.busybox); err != nil {
		rep.Failures = append(rep.Failures, err.Error())
		return
	}
	mc := microvm.Config{Kernel: cfg.kernel, Initrd: initrd, Cmdline: agentguest.Cmdline, CPUs: cfg.cpus, MemoryBytes: cfg.memory}
	snap := filepath.Join(dir, "snap")
	if measureCold(ctx, cfg, rep, mc, dir, snap) {
		if cfg.dropCache && !canDropCache(snap) {
			rep.Notes = append(rep.Notes, "no restores with the page cache dropped: the snapshot is on a tmpfs, whose pages are the file")
			rep.Restores = slices.DeleteFunc(rep.Restores, func(w *restoreWay) bool { return w.DropCache })
		}
		// Each round restores once each way, so that drift in the
		// host's load reaches every way alike.
		cid := uint64(firstRestoreCID)
	rounds:
		for i := range cfg.n {
			for j, w := range rep.Restores {
				if ctx.Err() != nil {
					w.Answered.Failures = append(w.Answered.Failures, ctx.Err().Error())
					break rounds
				}
				if w.DropCache {
					if err := dropCache(snap); err != nil {
						w.Call.Failures = append(w.Call.Failures, err.Error())
						continue
					}
				}
				restoreAgent(ctx, cfg, w, snap, sockPath(dir, fmt.Sprintf("w%d-%d", i, j)), cid)
				cid++
			}
		}
		os.RemoveAll(snap)
	}
	if len(cfg.dirty) > 0 && ctx.Err() == nil {
		mc.MemoryBytes = cfg.dirtyMemory
		measureDirty(ctx, cfg, rep, mc, dir)
	}
}

// bootAgent boots mc and waits for its agent to answer; it returns the
// machine, the connection and the time from just before microvm.New.
func bootAgent(ctx context.Context, timeout time.Duration, mc microvm.Config, uds string) (*vm, *agentConn, time.Duration, error) {
	start := time.Now()
	v, err := boot(mc, uds, bootCID)
	if err != nil {
		return nil, nil, 0, err
	}
	bctx, cancel := context.WithTimeout(ctx, timeout)
	a, err := connectAgent(bctx, v.m)
	cancel()
	took := time.Since(start)
	if err != nil {
		err = v.describe(err)
		v.shutdown()
		return nil, nil, took, err
	}
	return v, a, took, nil
}

// measureCold boots cfg.n fresh machines, each timed to its agent
// answering; the last one is snapshotted with Stop into snap. It reports
// whether snap was written.
func measureCold(ctx context.Context, cfg *linuxConfig, rep *linuxReport, mc microvm.Config, dir, snap string) bool {
	var keep *vm
	for i := range cfg.n {
		if ctx.Err() != nil {
			rep.Cold.Failures = append(rep.Cold.Failures, ctx.Err().Error())
			break
		}
		v, a, took, err := bootAgent(ctx, cfg.timeout, mc, sockPath(dir, fmt.Sprintf("c%d", i)))
		if err != nil {
			rep.Cold.Failures = append(rep.Cold.Failures, fmt.Sprintf("boot %d: %v", i+1, err))
			fmt.Fprintf(os.Stderr, "%s: cold boot %d failed: %v\n", prog, i+1, firstLine(err.Error()))
			continue
		}
		a.close()
		rep.Cold.Samples = append(rep.Cold.Samples, ms(took))
		fmt.Fprintf(os.Stderr, "%s: cold boot %d: agent answered after %.0f ms\n", prog, i+1, ms(took))
		if keep != nil {
			keep.shutdown()
		}
		keep = v
	}
	if keep == nil {
		return false
	}
	sctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	took, err := snapshotStop(sctx, keep, snap, cfg.timeout)
	cancel()
	keep.shutdown()
	if err != nil {
		rep.SnapshotStop.Failures = append(rep.SnapshotStop.Failures, err.Error())
		return false
	}
	rep.SnapshotStop.Samples = append(rep.SnapshotStop.Samples, ms(took))
	if u, err := measureDisk(snap); err != nil {
		rep.SnapshotStop.Failures = append(rep.SnapshotStop.Failures, err.Error())
	} else {
		rep.SnapshotDisk = &u
	}
	return true
}

// restoreAgent restores snap the way w says with its own socket and CID,
// times Restore and the agent's first answer (both from just before
// Restore), and shuts the machine down.
func restoreAgent(ctx context.Context, cfg *linuxConfig, w *restoreWay, snap, uds string, cid uint64) {
	start := time.Now()
	v, took, err := restore(snap, uds, cid, w.Prefault)
	if err != nil {
		w.Call.Failures = append(w.Call.Failures, err.Error())
		return
	}
	w.Call.Samples = append(w.Call.Samples, ms(took))
	v.start()
	actx, cancel := context.WithTimeout(ctx, cfg.timeout)
	a, err := connectAgent(actx, v.m)
	answered := time.Since(start)
	cancel()
	if err != nil {
		w.Answered.Failures = append(w.Answered.Failures, v.describe(err).Error())
		fmt.Fprintf(os.Stderr, "%s: %s failed: %v\n", prog, w.Name, firstLine(err.Error()))
	} else {
		a.close()
		w.Answered.Samples = append(w.Answered.Samples, ms(answered))
		fmt.Fprintf(os.Stderr, "%s: %s: agent answered after %.1f ms\n", prog, w.Name, ms(answered))
	}
	v.shutdown()
}

// measureDirty boots one machine of cfg.dirtyMemory and, for each level
// of cfg.dirty in turn, writes files to its /tmp until that many bytes
// are written in all, then snapshots it (live) and measures the snapshot.
func measureDirty(ctx context.Context, cfg *linuxConfig, rep *linuxReport, mc microvm.Config, dir string) {
	fmt.Fprintf(os.Stderr, "%s: a %s guest, snapshots after touching %d sizes of memory\n", prog, microvm.FormatSize(mc.MemoryBytes), len(cfg.dirty))
	v, a, _, err := bootAgent(ctx, cfg.timeout, mc, sockPath(dir, "d"))
	if err != nil {
		rep.Failures = append(rep.Failures, fmt.Sprintf("dirty runs: boot: %v", err))
		return
	}
	defer v.shutdown()
	snap := filepath.Join(dir, "dirty")
	defer os.RemoveAll(snap)
	var written int64
	for i, level := range cfg.dirty {
		d := &dirtyResult{TouchedBytes: int64(level), GuestUsedBytes: -1, SnapshotMS: nan, FillMS: nan}
		rep.Dirty = append(rep.Dirty, d)
		err := dirtyStep(ctx, cfg, v, &a, d, snap, fmt.Sprintf("fill-%d", i), int64(level)-written)
		if err != nil {
			d.Failure = err.Error()
			fmt.Fprintf(os.Stderr, "%s: touched %s: %v\n", prog, microvm.FormatSize(level), firstLine(err.Error()))
			break
		}
		written = int64(level)
	}
	if a != nil {
		a.close()
	}
}

// dirtyStep writes more bytes to a new file on the guest's /tmp through
// *a, reads the guest's used memory, closes *a (a snapshot resets vsock
// connections), snapshots the machine live into snap, measures it, and
// connects *a again for the next step.
func dirtyStep(ctx context.Context, cfg *linuxConfig, v *vm, a **agentConn, d *dirtyResult, snap, name string, more int64) error {
	sctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	if more > 0 {
		start := time.Now()
		if err := (*a).fillTmp(sctx, name, more); err != nil {
			return v.describe(err)
		}
		d.FillMS = num(ms(time.Since(start)))
	}
	used, err := (*a).usedMemory(sctx)
	if err != nil {
		return v.describe(err)
	}
	d.GuestUsedBytes = used
	(*a).close()
	*a = nil
	took, err := snapshotLive(sctx, v.m, snap)
	if err != nil {
		return v.describe(fmt.Errorf("snapshot: %w", err))
	}
	d.SnapshotMS = num(ms(took))
	u, err := measureDisk(snap)
	if err != nil {
		return err
	}
	d.Disk = u
	*a, err = connectAgentAgain(sctx, v.m, &d.Retries)
	if err != nil {
		return v.describe(fmt.Errorf("after the snapshot: %w", err))
	}
	return nil
}
