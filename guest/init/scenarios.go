package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults shared by the scenarios. Every one can be overridden on the kernel
// command line (microvm.KEY or microvm.NAME.KEY).
const (
	defaultPort = 1024
	bufSize     = 64 << 10
)

// scenarios is the table of everything /init can run. Names are stable: the
// host-side conformance test refers to them.
var scenarios = NewRegistry(
	&Scenario{
		Name:  "echo",
		Doc:   "listen on port; echo each connection until EOF, then close it; stop after conns connections (0: until the timeout)",
		Vsock: true,
		Run:   runEcho,
	},
	&Scenario{
		Name:  "connect",
		Doc:   "dial cid:port; send size seeded bytes while reading the echo back; compare",
		Vsock: true,
		Run:   runConnect,
	},
	&Scenario{
		Name:  "send",
		Doc:   "dial cid:port; send size seeded bytes, shut down writing, wait for EOF; report sha256 for the host to compare",
		Vsock: true,
		Run:   sendScenario(1 << 20),
	},
	&Scenario{
		Name:  "recv",
		Doc:   "dial cid:port; read until EOF; report bytes and sha256 (checked here too when size or sha256 is set)",
		Vsock: true,
		Run:   runRecv,
	},
	&Scenario{
		Name:  "halfclose-guest",
		Doc:   "dial cid:port; send size bytes, shut down writing, then read the reply until EOF (expect=echo: must equal what was sent)",
		Vsock: true,
		Run:   runHalfCloseGuest,
	},
	&Scenario{
		Name:  "halfclose-host",
		Doc:   "listen on port; read one connection until the host shuts down writing, then send back what was read and close",
		Vsock: true,
		Run:   runHalfCloseHost,
	},
	&Scenario{
		Name:  "slowreader",
		Doc:   "dial cid:port; send size (8M) bytes as fast as credit allows to a slow host reader; no loss, no reset",
		Vsock: true,
		Run:   sendScenario(8 << 20),
	},
	&Scenario{
		Name:  "concurrent",
		Doc:   "dial cid:port conns (32) times at once; each sends size bytes (seed+i) and checks the echo",
		Vsock: true,
		Run:   runConcurrent,
	},
	&Scenario{
		Name: "loopback",
		Doc:  "self-test inside the guest over vsock_loopback (cid 1): echo size bytes through our own listener with a half-close, then expect a refused dial",
		Run:  runLoopback,
	},
	&Scenario{
		Name:  "seqpacket",
		Doc:   "dial cid:port with SOCK_SEQPACKET; send count (64) messages of seed's payload, sizes 1..max (64K), MSG_EOR on each, each after the echo of the last: each echo one message of the same bytes",
		Vsock: true,
		Run:   runSeqpacket,
	},
	&Scenario{
		Name:  "seqpacket-echo",
		Doc:   "listen on port with SOCK_SEQPACKET; echo each message of conns (1) connections as one message (MSG_EOR as received) until EOF",
		Vsock: true,
		Run:   runSeqpacketEcho,
	},
	&Scenario{
		Name:  "urandom",
		Doc:   "wait for uptime (0) since boot, reseed the kernel's RNG (reseed=1), listen on port; answer each connection with size (32) bytes of /dev/urandom read on CPU cpu (0; -1: any), then close; stop after conns (1) connections (0: until the timeout)",
		Vsock: true,
		Run:   runURandom,
	},
	&Scenario{
		Name:  "refused",
		Doc:   "dial cid:port where nobody listens; expect ECONNRESET or ECONNREFUSED within `within` (1s)",
		Vsock: true,
		Run:   runRefused,
	},
)

// dialTarget is the peer a dialing scenario connects to.
type dialTarget struct {
	cid, port uint32
	retry     time.Duration // keep retrying a refused dial this long
}

func readDialTarget(p *ScenarioParams) dialTarget {
	return dialTarget{
		cid:   p.Uint32("cid", hostCID),
		port:  p.Uint32("port", defaultPort),
		retry: p.Duration("dial-retry", 0),
	}
}

func isRefusal(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED)
}

// dial connects to t, retrying refusals for t.retry (for a host listener that
// comes up after the guest boots), and ties the connection to ctx: its
// deadline becomes the connection's, and ctx's end closes it.
func dial(ctx context.Context, env *Env, t dialTarget) (Conn, func(), error) {
	give := time.Now().Add(t.retry)
	for {
		c, err := env.Net.Dial(ctx, t.cid, t.port)
		if err == nil {
			return c, bindConn(ctx, c), nil
		}
		if t.retry == 0 || !isRefusal(err) || time.Now().After(give) {
			return nil, nil, fmt.Errorf("dial %d:%d: %w", t.cid, t.port, err)
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("dial %d:%d: %w (retried until %v)", t.cid, t.port, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// bindConn applies ctx's deadline to c and closes c when ctx ends. The
// returned func undoes the binding and closes c, waiting up to lingerSecs
// for the host to have taken what c sent: a scenario's result is reported
// only after that close, so the host never finds fewer bytes than the
// guest reported.
func bindConn(ctx context.Context, c io.Closer) func() {
	if d, ok := ctx.Deadline(); ok {
		if dc, ok := c.(interface{ SetDeadline(time.Time) error }); ok {
			_ = dc.SetDeadline(d)
		}
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	return func() {
		stop()
		if l, ok := c.(interface{ SetLinger(int) error }); ok {
			_ = l.SetLinger(lingerSecs)
		}
		c.Close()
	}
}

// lingerSecs bounds a closing connection's wait for the device's answer to
// the guest's SHUTDOWN, which comes once the host socket has taken every
// byte sent (vsocknet.Conn.SetLinger). /init powers the guest off as soon
// as the last scenario reports, and the reset drops whatever is still in
// the guest's send queue or the TX ring: without the wait, an echo could
// report every byte while the host got a clean EOF short of them.
const lingerSecs = 10

// sendPayload writes n bytes of seed's payload to w, hashing what it writes.
func sendPayload(w io.Writer, seed uint64, n int64) (*digest, error) {
	d := newDigest()
	buf := make([]byte, bufSize)
	src := io.LimitReader(newPayload(seed), n)
	for {
		m, rerr := src.Read(buf)
		if m > 0 {
			k, err := w.Write(buf[:m])
			d.Write(buf[:k])
			if err != nil {
				return d, fmt.Errorf("write after %d of %d bytes: %w", d.Len(), n, err)
			}
		}
		if rerr == io.EOF {
			return d, nil
		}
	}
}

// readAll reads r until EOF into d (and into keep, when not nil), adding the
// count to total as it goes so another goroutine can watch progress.
func readAll(r io.Reader, d *digest, keep *bytes.Buffer, total *atomic.Int64) error {
	buf := make([]byte, bufSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			d.Write(buf[:n])
			if keep != nil {
				keep.Write(buf[:n])
			}
			if total != nil {
				total.Add(int64(n))
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read after %d bytes: %w", d.Len(), err)
		}
	}
}

// exchangeResult describes one send-and-read-back exchange.
type exchangeResult struct {
	sent, recv    *digest
	afterShutdown int64 // bytes received after our shutdown(SHUT_WR) returned
}

// exchange sends n bytes of seed's payload on c while reading c until EOF in
// parallel (so a streaming echo cannot deadlock on flow control), shutting
// down the sending side once everything is written.
func exchange(c Conn, seed uint64, n int64) (exchangeResult, error) {
	res := exchangeResult{recv: newDigest()}
	var total atomic.Int64
	readDone := make(chan error, 1)
	go func() { readDone <- readAll(c, res.recv, nil, &total) }()

	sent, werr := sendPayload(c, seed, n)
	res.sent = sent
	atShutdown := total.Load()
	if werr == nil {
		if err := c.CloseWrite(); err != nil {
			werr = fmt.Errorf("shutdown(SHUT_WR): %w", err)
		}
	}
	if werr != nil {
		c.Close() // unblock the reader
		<-readDone
		return res, werr
	}
	if err := <-readDone; err != nil {
		return res, err
	}
	res.afterShutdown = res.recv.Len() - atShutdown
	return res, nil
}

func runEcho(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	port := p.Uint32("port", defaultPort)
	conns := p.Int("conns", 1, 0, 1<<30)
	if err := p.Err(); err != nil {
		return "", err
	}
	ln, err := env.Net.Listen(port)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopLn := context.AfterFunc(ctx, func() { ln.Close() })
	defer func() { stopLn(); ln.Close() }()
	env.Progress("listening port=%d", port)

	type served struct {
		id  int
		n   int64
		err error
	}
	results := make(chan served)
	acceptErr := make(chan error, 1)
	go func() {
		for id := 0; conns == 0 || id < conns; id++ {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			go func() {
				release := bindConn(ctx, c)
				n, err := io.CopyBuffer(c, c, make([]byte, bufSize))
				release() // before the result: see bindConn
				select {
				case results <- served{id, n, err}:
				case <-ctx.Done():
				}
			}()
		}
	}()

	count, total := 0, int64(0)
	for conns == 0 || count < conns {
		select {
		case r := <-results:
			if r.err != nil {
				return "", fmt.Errorf("connection %d: echoed %d bytes: %w", r.id, r.n, r.err)
			}
			count++
			total += r.n
		case err := <-acceptErr:
			return "", fmt.Errorf("accept after %d connections served: %w", count, err)
		}
	}
	return fmt.Sprintf("conns=%d bytes=%d", count, total), nil
}

func runConnect(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	t := readDialTarget(p)
	size := p.Size("size", 1<<20)
	seed := p.Uint64("seed", 1)
	if err := p.Err(); err != nil {
		return "", err
	}
	c, release, err := dial(ctx, env, t)
	if err != nil {
		return "", err
	}
	defer release()
	res, err := exchange(c, seed, size)
	if err != nil {
		return "", err
	}
	if res.recv.Len() != res.sent.Len() || res.recv.Sum() != res.sent.Sum() {
		return "", fmt.Errorf("echo mismatch: sent %d bytes sha256=%s, got back %d bytes sha256=%s",
			res.sent.Len(), res.sent.Sum(), res.recv.Len(), res.recv.Sum())
	}
	return fmt.Sprintf("bytes=%d sha256=%s", res.sent.Len(), res.sent.Sum()), nil
}

// sendScenario sends size bytes (default def), shuts down writing and waits
// for the host to close, so that success means the host read everything.
func sendScenario(def int64) func(context.Context, *Env, *ScenarioParams) (string, error) {
	return func(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
		t := readDialTarget(p)
		size := p.Size("size", def)
		seed := p.Uint64("seed", 1)
		if err := p.Err(); err != nil {
			return "", err
		}
		c, release, err := dial(ctx, env, t)
		if err != nil {
			return "", err
		}
		defer release()
		start := time.Now()
		sent, err := sendPayload(c, seed, size)
		if err != nil {
			return "", err
		}
		if err := c.CloseWrite(); err != nil {
			return "", fmt.Errorf("shutdown(SHUT_WR) after %d bytes: %w", size, err)
		}
		reply := newDigest()
		if err := readAll(c, reply, nil, nil); err != nil {
			return "", fmt.Errorf("all %d bytes written, then waiting for the host to close: %w", size, err)
		}
		elapsed := time.Since(start)
		rate := float64(size) / (1 << 20) / max(elapsed.Seconds(), 1e-9)
		return fmt.Sprintf("bytes=%d sha256=%s elapsed=%s rate=%.1fMiB/s",
			sent.Len(), sent.Sum(), elapsed.Round(time.Millisecond), rate), nil
	}
}

func runRecv(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	t := readDialTarget(p)
	want := p.Size("size", -1)
	wantSum := p.String("sha256", "")
	if err := p.Err(); err != nil {
		return "", err
	}
	c, release, err := dial(ctx, env, t)
	if err != nil {
		return "", err
	}
	defer release()
	d := newDigest()
	if err := readAll(c, d, nil, nil); err != nil {
		return "", err
	}
	got := fmt.Sprintf("bytes=%d sha256=%s", d.Len(), d.Sum())
	if (want >= 0 && d.Len() != want) || (wantSum != "" && d.Sum() != wantSum) {
		return "", fmt.Errorf("received %s, want size=%d sha256=%s", got, want, wantSum)
	}
	return got, nil
}

func runHalfCloseGuest(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	t := readDialTarget(p)
	size := p.Size("size", 64<<10)
	seed := p.Uint64("seed", 1)
	expect := p.String("expect", "echo")
	if err := p.Err(); err != nil {
		return "", err
	}
	if expect != "echo" && expect != "any" {
		return "", fmt.Errorf("bad parameter expect=%q: want echo or any", expect)
	}
	c, release, err := dial(ctx, env, t)
	if err != nil {
		return "", err
	}
	defer release()
	res, err := exchange(c, seed, size)
	if err != nil {
		return "", err
	}
	details := fmt.Sprintf("bytes=%d sha256=%s reply_bytes=%d reply_sha256=%s after_shutdown=%d",
		res.sent.Len(), res.sent.Sum(), res.recv.Len(), res.recv.Sum(), res.afterShutdown)
	if expect == "echo" && (res.recv.Len() != res.sent.Len() || res.recv.Sum() != res.sent.Sum()) {
		return "", fmt.Errorf("reply is not the data sent: %s", details)
	}
	return details, nil
}

func runHalfCloseHost(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	port := p.Uint32("port", defaultPort)
	limit := p.Size("max", 64<<20)
	if err := p.Err(); err != nil {
		return "", err
	}
	ln, err := env.Net.Listen(port)
	if err != nil {
		return "", err
	}
	stopLn := context.AfterFunc(ctx, func() { ln.Close() })
	defer func() { stopLn(); ln.Close() }()
	env.Progress("listening port=%d", port)
	nc, err := ln.Accept()
	if err != nil {
		return "", fmt.Errorf("accept: %w", err)
	}
	ln.Close()
	c, err := asConn(nc)
	if err != nil {
		return "", err
	}
	release := bindConn(ctx, c)
	defer release()
	d := newDigest()
	var data bytes.Buffer
	if err := readAll(io.LimitReader(c, limit+1), d, &data, nil); err != nil {
		return "", fmt.Errorf("before the host's shutdown: %w", err)
	}
	if d.Len() > limit {
		return "", fmt.Errorf("host sent more than max=%d bytes without shutting down", limit)
	}
	if _, err := c.Write(data.Bytes()); err != nil {
		return "", fmt.Errorf("reply after the host's shutdown (EOF after %d bytes): %w", d.Len(), err)
	}
	if err := c.CloseWrite(); err != nil {
		return "", fmt.Errorf("shutdown(SHUT_WR) after the reply: %w", err)
	}
	return fmt.Sprintf("bytes=%d sha256=%s", d.Len(), d.Sum()), nil
}

func runConcurrent(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	t := readDialTarget(p)
	conns := p.Int("conns", 32, 1, 4096)
	size := p.Size("size", 256<<10)
	seed := p.Uint64("seed", 1)
	if err := p.Err(); err != nil {
		return "", err
	}
	errs := make([]error, conns)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			c, release, err := dial(ctx, env, t)
			if err != nil {
				errs[i] = err
				return
			}
			defer release()
			res, err := exchange(c, seed+uint64(i), size)
			if err == nil && (res.recv.Len() != res.sent.Len() || res.recv.Sum() != res.sent.Sum()) {
				err = fmt.Errorf("echo mismatch: sent %d bytes, got back %d (sha256 %s vs %s)",
					res.sent.Len(), res.recv.Len(), res.sent.Sum(), res.recv.Sum())
			}
			errs[i] = err
		})
	}
	wg.Wait()
	failed, first := 0, -1
	for i, err := range errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if failed > 0 {
		return "", fmt.Errorf("%d of %d connections failed; first: connection %d: %w", failed, conns, first, errs[first])
	}
	return fmt.Sprintf("conns=%d bytes_each=%d total=%d", conns, size, int64(conns)*size), nil
}

func runRefused(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	cid := p.Uint32("cid", hostCID)
	port := p.Uint32("port", 9999)
	within := p.Duration("within", time.Second)
	if err := p.Err(); err != nil {
		return "", err
	}
	// Wait longer than `within` so that a slow answer is told apart from none.
	dctx, cancel := context.WithTimeout(ctx, max(3*within, 3*time.Second))
	defer cancel()
	start := time.Now()
	c, err := env.Net.Dial(dctx, cid, port)
	elapsed := time.Since(start)
	if err == nil {
		c.Close()
		return "", fmt.Errorf("connected to %d:%d, where nobody should listen", cid, port)
	}
	var errno syscall.Errno
	name := "none"
	if errors.As(err, &errno) {
		name = unix.ErrnoName(errno)
	}
	if !isRefusal(err) {
		return "", fmt.Errorf("want ECONNRESET or ECONNREFUSED, got errno=%s after %v: %w", name, elapsed.Round(time.Millisecond), err)
	}
	if elapsed > within {
		return "", fmt.Errorf("refused (errno=%s) but only after %v, more than within=%v", name, elapsed.Round(time.Millisecond), within)
	}
	return fmt.Sprintf("errno=%s elapsed=%v", name, elapsed.Round(100*time.Microsecond)), nil
}

func runLoopback(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	cid := p.Uint32("cid", unix.VMADDR_CID_LOCAL)
	port := p.Uint32("port", unix.VMADDR_PORT_ANY)
	size := p.Size("size", 1<<20)
	seed := p.Uint64("seed", 1)
	if err := p.Err(); err != nil {
		return "", err
	}
	ln, err := env.Net.Listen(port)
	if err != nil {
		return "", err
	}
	stopLn := context.AfterFunc(ctx, func() { ln.Close() })
	defer func() { stopLn(); ln.Close() }()
	if a, ok := ln.Addr().(*VsockAddr); ok {
		port = a.Port // the one picked for VMADDR_PORT_ANY
	}
	served := make(chan error, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			served <- fmt.Errorf("accept: %w", err)
			return
		}
		release := bindConn(ctx, nc)
		defer release()
		c, err := asConn(nc)
		if err == nil {
			_, err = io.CopyBuffer(c, c, make([]byte, bufSize))
		}
		if err == nil {
			err = c.CloseWrite()
		}
		served <- err
	}()
	c, release, err := dial(ctx, env, dialTarget{cid: cid, port: port})
	if err != nil {
		return "", err
	}
	res, err := exchange(c, seed, size)
	release()
	if err != nil {
		return "", err
	}
	if err := <-served; err != nil {
		return "", fmt.Errorf("echo side: %w", err)
	}
	if res.recv.Sum() != res.sent.Sum() {
		return "", fmt.Errorf("echo mismatch: sent %d bytes, got back %d", res.sent.Len(), res.recv.Len())
	}
	ln.Close()
	start := time.Now()
	c2, err := env.Net.Dial(ctx, cid, port)
	if err == nil {
		c2.Close()
		return "", fmt.Errorf("dial %d:%d after closing the listener connected", cid, port)
	}
	if !isRefusal(err) {
		return "", fmt.Errorf("dial %d:%d after closing the listener: want a refusal, got %w", cid, port, err)
	}
	var errno syscall.Errno
	errors.As(err, &errno)
	return fmt.Sprintf("bytes=%d sha256=%s refused=%s refused_after=%v",
		res.sent.Len(), res.sent.Sum(), unix.ErrnoName(errno), time.Since(start).Round(100*time.Microsecond)), nil
}

// msgSize is the size of message i of a SEQPACKET exchange with messages of
// at most max bytes: the edges first (1 byte, max, one 4 KiB packet and one
// byte more, which Linux sends as two), then sizes spread over 1..max. The
// host side of the conformance suite computes the same sizes.
func msgSize(i int, max int64) int64 {
	edges := []int64{1, max, 4096, 4097, max - 1}
	if i < len(edges) {
		return min(edges[i], max)
	}
	return 1 + int64(uint64(i)*2654435761%uint64(max))
}

// msgPayload is message i's bytes: the first size bytes of payload seed+i.
func msgPayload(seed uint64, i int, size int64) []byte {
	b := make([]byte, size)
	_, _ = io.ReadFull(newPayload(seed+uint64(i)), b)
	return b
}

// msgExchange sends count messages on c (msgSize, msgPayload, MSG_EOR on
// each), each after the echo of the one before, and checks that each echo
// is one message of exactly the bytes sent: a merged, split or truncated
// message fails it. One message at a time because Linux (6.1) sends a
// SEQPACKET message that outgrows the peer's credit on a non-blocking
// socket in part and then fails with EAGAIN, the part gone: a retry would
// send it again, a blocking send could be restarted by a signal with the
// same effect. With the echo of the last message read, the device's credit
// update for it has arrived and every message of at most the device's
// buffer goes out whole.
func msgExchange(c MsgConn, seed uint64, count int, max int64) (string, error) {
	buf := make([]byte, max+1)
	var sent int64
	eors := 0
	for i := range count {
		m := msgPayload(seed, i, msgSize(i, max))
		n, err := c.WriteMsg(m, true)
		if err == nil && n != len(m) {
			err = fmt.Errorf("wrote %d bytes", n)
		}
		if err != nil {
			return "", fmt.Errorf("message %d (%d bytes): %w", i, len(m), err)
		}
		sent += int64(n)
		n, eor, trunc, err := c.ReadMsg(buf)
		if err != nil {
			return "", fmt.Errorf("reading echo %d of %d: %w", i, count, err)
		}
		if trunc || n != len(m) || !bytes.Equal(buf[:n], m) {
			return "", fmt.Errorf("echo %d: %d bytes (truncated %v), want the %d-byte message: boundaries or content lost", i, n, trunc, len(m))
		}
		if eor {
			eors++
		}
	}
	return fmt.Sprintf("msgs=%d bytes=%d eor=%d", count, sent, eors), nil
}

func runSeqpacket(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	t := readDialTarget(p)
	count := p.Int("count", 64, 1, 1<<20)
	max := p.Size("max", 64<<10)
	seed := p.Uint64("seed", 1)
	if err := p.Err(); err != nil {
		return "", err
	}
	if max < 1 {
		return "", fmt.Errorf("bad parameter max=%d", max)
	}
	c, err := env.Net.DialSeqpacket(ctx, t.cid, t.port)
	if err != nil {
		return "", fmt.Errorf("dial %d:%d with SOCK_SEQPACKET: %w", t.cid, t.port, err)
	}
	release := bindConn(ctx, c)
	defer release()
	res, err := msgExchange(c, seed, count, max)
	if err != nil {
		return "", err
	}
	if err := c.CloseWrite(); err != nil {
		return "", fmt.Errorf("shutdown(SHUT_WR): %w", err)
	}
	return res, nil
}

func runSeqpacketEcho(ctx context.Context, env *Env, p *ScenarioParams) (string, error) {
	port := p.Uint32("port", defaultPort)
	conns := p.Int("conns", 1, 1, 1<<20)
	max := p.Size("max", 64<<10)
	if err := p.Err(); err != nil {
		return "", err
	}
	ln, err := env.Net.ListenSeqpacket(port)
	if err != nil {
		return "", err
	}
	stopLn := context.AfterFunc(ctx, func() { ln.Close() })
	defer func() { stopLn(); ln.Close() }()
	env.Progress("listening port=%d", port)
	var msgs, eors, total int64
	buf := make([]byte, max+1)
	for id := range conns {
		nc, err := ln.Accept()
		if err != nil {
			return "", fmt.Errorf("accept after %d connections: %w", id, err)
		}
		c, err := asMsgConn(nc)
		if err != nil {
			return "", err
		}
		release := bindConn(ctx, c)
		for {
			n, eor, trunc, err := c.ReadMsg(buf)
			if errors.Is(err, io.EOF) {
				break
			}
			if err == nil && trunc {
				err = fmt.Errorf("a message longer than max=%d", max)
			}
			if err == nil {
				_, err = c.WriteMsg(buf[:n], eor)
			}
			if err != nil {
				release()
				return "", fmt.Errorf("connection %d, after %d messages: %w", id, msgs, err)
			}
			msgs++
			total += int64(n)
			if eor {
				eors++
			}
		}
		release()
	}
	return fmt.Sprintf("conns=%d msgs=%d bytes=%d eor=%d", conns, msgs, total, eors), nil
}
