package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// The urandom scenario shows what a host sees of the guest kernel's RNG:
// each connection gets size bytes read from /dev/urandom. The snapshot
// clone test (TestSnapshotLinuxClonesReseed) connects to two clones of one
// snapshot and compares: with the VM generation ID's reseed they differ,
// without it they are the same bytes.
//
// Two things could make the clones' bytes differ without any reseed by
// the VM generation ID, hiding its absence, and the scenario rules both
// out: the kernel keeps a ChaCha key per CPU, so a read on another CPU
// draws another stream (reads are made on CPU cpu, 0 by default, -1 for
// any); and the kernel reseeds by itself, from an input pool into which
// each clone has mixed its own interrupt timings by then, at the first
// read after its key is older than the reseed interval (Linux 6.1,
// crng_reseed_interval: half the uptime, a minute from two minutes of
// uptime on). So the scenario waits until the kernel has been up for
// uptime (0 by default; the clone test asks for 2m, the full minute's
// interval) and, with reseed=1 (the default), asks for a reseed
// (RNDRESEEDCRNG) just before it listens: a snapshot taken at the
// listening line then has a whole interval before the kernel's own
// reseed.

// defaultRandomSize is what a urandom connection gets unless size says.
const defaultRandomSize = 32

func runURandom(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	port := p.Uint32("port", defaultPort)
	conns := p.Int("conns", 1, 0, 1<<30)
	size := p.Size("size", defaultRandomSize)
	cpu := p.Int("cpu", 0, -1, 1<<16)
	reseed := p.Int("reseed", 1, 0, 1)
	uptime := p.Duration("uptime", 0)
	if err := p.Err(); err != nil {
		return "", err
	}
	if size < 1 || size > 1<<20 {
		return "", fmt.Errorf("bad parameter size=%d: want 1 to 1M", size)
	}
	if err := waitUptime(ctx, uptime); err != nil {
		return "", err
	}
	if reseed == 1 {
		if err := reseedCRNG(); err != nil {
			return "", err
		}
	}
	ln, err := env.Net.Listen(port)
	if err != nil {
		return "", err
	}
	stopLn := context.AfterFunc(ctx, func() { ln.Close() })
	defer func() { stopLn(); ln.Close() }()
	env.Progress("listening port=%d", port)
	served := 0
	for conns == 0 || served < conns {
		c, err := ln.Accept()
		if err != nil {
			return "", fmt.Errorf("accept after %d connections served: %w", served, err)
		}
		release := bindConn(ctx, c)
		b, err := readURandom(size, cpu)
		if err == nil {
			_, err = c.Write(b)
		}
		release()
		if err != nil {
			return "", fmt.Errorf("connection %d: %w", served, err)
		}
		served++
	}
	return fmt.Sprintf("conns=%d bytes=%d reseeded=%v", served, int64(served)*size, reseed == 1), nil
}

// waitUptime waits until the kernel has been up (CLOCK_MONOTONIC, the
// clock of the kernel's reseed interval) for d, or ctx ends.
func waitUptime(ctx context.Context, d time.Duration) error {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("clock_gettime: %w", err)
	}
	if up := time.Duration(ts.Nano()); up < d {
		select {
		case <-time.After(d - up):
		case <-ctx.Done():
			return fmt.Errorf("waiting for %v of uptime: %w", d, ctx.Err())
		}
	}
	return nil
}

// readURandom reads n bytes from /dev/urandom on CPU cpu (any when -1),
// on an OS thread of its own so that the pinning ends with it.
func readURandom(n int64, cpu int) ([]byte, error) {
	type result struct {
		b   []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread is not unlocked: it exits with this goroutine, and
		// its CPU affinity with it.
		runtime.LockOSThread()
		if cpu >= 0 {
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				done <- result{err: fmt.Errorf("pin to CPU %d: %w", cpu, err)}
				return
			}
		}
		f, err := os.Open("/dev/urandom")
		if err != nil {
			done <- result{err: err}
			return
		}
		defer f.Close()
		b := make([]byte, n)
		if _, err := io.ReadFull(f, b); err != nil {
			done <- result{err: fmt.Errorf("read /dev/urandom: %w", err)}
			return
		}
		done <- result{b: b}
	}()
	r := <-done
	return r.b, r.err
}

// reseedCRNG has the kernel reseed its RNG from the input pool now
// (ioctl RNDRESEEDCRNG on /dev/urandom; needs CAP_SYS_ADMIN, which PID 1
// has), once the RNG is ready (a blocking getrandom waits for that).
func reseedCRNG() error {
	if _, err := unix.Getrandom(make([]byte, 1), 0); err != nil {
		return fmt.Errorf("getrandom: %w", err)
	}
	f, err := os.Open("/dev/urandom")
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.RNDRESEEDCRNG, 0); err != nil {
		if errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("RNDRESEEDCRNG: the kernel's RNG is not ready yet: %w", err)
		}
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	return nil
}
