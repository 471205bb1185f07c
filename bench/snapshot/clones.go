package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// clone is one `microvm restore` process of the snapshot.
type clone struct {
	cmd  *exec.Cmd
	uds  string
	out  *testenv.SyncBuffer // its stdout (the console) and stderr
	done chan struct{}       // closed when the process has been waited for
	err  error               // Wait's; read after done is closed
}

// startClone starts `microvm restore` of snap with its own socket and CID.
func startClone(microvmBin, snap, uds string, cid uint64) (*clone, error) {
	c := &clone{uds: uds, out: &testenv.SyncBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(microvmBin, "restore", "--vsock-uds", uds, "--vsock-cid", strconv.FormatUint(cid, 10), snap)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s restore: %w", microvmBin, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// answer waits for the clone's guest to answer one echo.
func (c *clone) answer(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-c.done:
			cancel(fmt.Errorf("the restore process ended: %v", c.err))
		case <-ctx.Done():
		}
	}()
	if err := echoOnce(ctx, c.uds); err != nil {
		return fmt.Errorf("clone pid %d: %w%s", c.cmd.Process.Pid, err, tail("output", c.out.String()))
	}
	return nil
}

// stop ends the process: SIGTERM (microvm stops the VM and exits), then
// SIGKILL after d.
func (c *clone) stop(d time.Duration) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(d):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// measureClones starts cfg.clones restore processes of snap one after the
// other, each until its guest answered one echo. The first one's memory
// is read before the second starts (one clone alone), every one's once
// all answered.
func measureClones(ctx context.Context, cfg *guestConfig, res *cloneResult, dir, snap string) {
	fmt.Fprintf(os.Stderr, "%s: %d `microvm restore` processes of the %s snapshot\n", prog, cfg.clones, res.guestSize())
	var running []*clone
	defer func() {
		for _, c := range running {
			c.stop(10 * time.Second)
		}
	}()
	fail := func(err error) { res.Failures = append(res.Failures, err.Error()) }
	for i := range cfg.clones {
		start := time.Now()
		c, err := startClone(cfg.microvm, snap, sockPath(dir, fmt.Sprintf("c%d", i)), firstRestoreCID+uint64(i))
		if err != nil {
			fail(err)
			return
		}
		running = append(running, c)
		actx, cancel := context.WithTimeout(ctx, cfg.timeout)
		err = c.answer(actx)
		cancel()
		if err != nil {
			fail(err)
			return
		}
		res.Answered.Samples = append(res.Answered.Samples, ms(time.Since(start)))
		if i == 0 {
			u, err := readMemUse(c.cmd.Process.Pid)
			if err != nil {
				fail(err)
				return
			}
			res.Alone = u
		}
	}
	for _, c := range running {
		u, err := readMemUse(c.cmd.Process.Pid)
		if err != nil {
			fail(err)
			return
		}
		res.Each = append(res.Each, u)
	}
	for _, c := range running {
		select {
		case <-c.done:
			fail(fmt.Errorf("clone pid %d ended early: %v%s", c.cmd.Process.Pid, c.err, tail("output", c.out.String())))
		default:
		}
	}
}
