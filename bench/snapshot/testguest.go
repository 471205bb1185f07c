package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/microvm/microvm"
)

// guestConfig is what the testguest subcommand's flags set.
type guestConfig struct {
	microvm, guest string
	sizes          []uint64 // guest memory sizes, ascending
	restores       int      // timed restores per size
	snaps          int      // timed live snapshots per size, each way
	clones         int      // restore processes of one snapshot
	cloneSize      uint64   // the guest memory of the snapshot they clone
	timeout        time.Duration
	jsonOut        string
}

// guestCmdline runs the echo guest until it is killed (no conns limit),
// so that a restored copy serves any number of connections.
var guestCmdline = fmt.Sprintf("testguest.mode=echo testguest.port=%d", echoPort)

// CIDs: the booted guests have bootCID; restore i of a series gets
// firstRestoreCID+i, so that no two machines alive at once share one.
const (
	bootCID         = 3
	firstRestoreCID = 100
)

// runGuest measures each memory size in turn and then the clones, filling
// rep. dir holds the snapshots and sockets.
func runGuest(ctx context.Context, cfg *guestConfig, rep *guestReport, dir string) {
	snaps := map[uint64]string{}
	for i, size := range cfg.sizes {
		if ctx.Err() != nil {
			rep.Failures = append(rep.Failures, ctx.Err().Error())
			return
		}
		res := rep.addSize(size)
		if snap := measureSize(ctx, cfg, res, dir, i); snap != "" {
			snaps[size] = snap
		}
		rep.summarise()
	}
	if cfg.clones > 0 {
		snap, ok := snaps[cfg.cloneSize]
		if !ok {
			rep.Clones.Failures = append(rep.Clones.Failures, fmt.Sprintf("no snapshot of the %s guest to clone", microvm.FormatSize(cfg.cloneSize)))
		} else {
			measureClones(ctx, cfg, rep.Clones, dir, snap)
		}
	}
	rep.summarise()
}

// measureSize boots the echo guest with size bytes of memory, times live
// snapshots of it (one Snapshot call; and Pause, Snapshot, Resume), then
// a snapshot with Stop, and restores that one cfg.restores times, each
// until the guest answers an echo. It returns the stopped snapshot's
// directory ("" if there is none).
func measureSize(ctx context.Context, cfg *guestConfig, res *sizeResult, dir string, i int) string {
	fail := func(err error) { res.Failures = append(res.Failures, err.Error()) }
	fmt.Fprintf(os.Stderr, "%s: %s guest: boot, 1+%d+%d live snapshots, a stopped one, %d restores\n",
		prog, microvm.FormatSize(res.MemoryBytes), cfg.snaps, cfg.snaps, cfg.restores)
	start := time.Now()
	v, err := boot(microvm.Config{Kernel: cfg.guest, Cmdline: guestCmdline, CPUs: 1, MemoryBytes: res.MemoryBytes},
		sockPath(dir, fmt.Sprintf("b%d", i)), bootCID)
	if err != nil {
		fail(err)
		return ""
	}
	res.New.Samples = append(res.New.Samples, ms(time.Since(start)))
	// The boot, for reference: the echo is refused until the guest
	// listens, and echoOnce dials again.
	ectx, cancel := context.WithTimeout(ctx, cfg.timeout)
	err = echoOnce(ectx, v.uds)
	cancel()
	if err != nil {
		fail(v.describe(fmt.Errorf("boot: %w", err)))
		v.shutdown()
		return ""
	}
	res.BootAnswered.Samples = append(res.BootAnswered.Samples, ms(time.Since(start)))

	// The first snapshot of a machine reads guest pages it never read
	// before (untouched memory faults in the zero page), so it is timed
	// apart from the ones after it.
	live := filepath.Join(dir, fmt.Sprintf("live-%d", i))
	sctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	took, err := snapshotLive(sctx, v.m, live)
	cancel()
	if err != nil {
		fail(v.describe(fmt.Errorf("first snapshot: %w", err)))
		v.shutdown()
		return ""
	}
	res.FirstCall.Samples = append(res.FirstCall.Samples, ms(took))
	for range cfg.snaps {
		sctx, cancel := context.WithTimeout(ctx, cfg.timeout)
		took, err := snapshotLive(sctx, v.m, live)
		if err == nil {
			res.SnapshotCall.Samples = append(res.SnapshotCall.Samples, ms(took))
			var p pausedTimes
			p, err = snapshotPaused(sctx, v.m, live)
			if err == nil {
				res.Pause.Samples = append(res.Pause.Samples, ms(p.pause))
				res.Write.Samples = append(res.Write.Samples, ms(p.write))
				res.Resume.Samples = append(res.Resume.Samples, ms(p.resume))
				res.Paused.Samples = append(res.Paused.Samples, ms(p.window()))
			}
		}
		cancel()
		if err != nil {
			fail(v.describe(fmt.Errorf("live snapshot: %w", err)))
			v.shutdown()
			return ""
		}
	}
	if u, err := measureDisk(live); err != nil {
		fail(err)
	} else {
		res.LiveDisk = &u
	}
	os.RemoveAll(live)

	snap := filepath.Join(dir, fmt.Sprintf("snap-%d", i))
	sctx, cancel = context.WithTimeout(ctx, cfg.timeout)
	took, err = snapshotStop(sctx, v, snap, cfg.timeout)
	cancel()
	v.shutdown()
	if err != nil {
		fail(err)
		return ""
	}
	res.StopCall.Samples = append(res.StopCall.Samples, ms(took))
	if u, err := measureDisk(snap); err != nil {
		fail(err)
	} else {
		res.Disk = u
	}

	for j := range cfg.restores {
		if ctx.Err() != nil {
			fail(ctx.Err())
			break
		}
		restoreOnce(ctx, cfg.timeout, res, snap, sockPath(dir, fmt.Sprintf("r%d-%d", i, j)), firstRestoreCID+uint64(j))
	}
	return snap
}

// restoreOnce restores snap with its own socket and CID, times Restore
// and the guest's first echo (both from just before Restore), and shuts
// the machine down.
func restoreOnce(ctx context.Context, timeout time.Duration, res *sizeResult, snap, uds string, cid uint64) {
	start := time.Now()
	v, took, err := restore(snap, uds, cid, false)
	if err != nil {
		res.Restore.Failures = append(res.Restore.Failures, err.Error())
		return
	}
	res.Restore.Samples = append(res.Restore.Samples, ms(took))
	v.start()
	ectx, cancel := context.WithTimeout(ctx, timeout)
	err = echoOnce(ectx, uds)
	answered := time.Since(start)
	cancel()
	if err != nil {
		res.Answered.Failures = append(res.Answered.Failures, v.describe(err).Error())
	} else {
		res.Answered.Samples = append(res.Answered.Samples, ms(answered))
	}
	v.shutdown()
}
