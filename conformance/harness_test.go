package conformance

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// Bounds on every wait. TCG boots the guest to /init in about a second; these
// leave room for a loaded machine without letting a broken run hang. Inside
// the nested-KVM box everything runs under TCG with emulated SVM, where a
// 16 MiB echo was measured at 3.6-15 s and drops to 0.3 MiB/s for seconds
// when the host's two cores are shared: there every bound is boxScale times
// longer, so a slow run is not mistaken for a stalled one.
var (
	bootTimeout    = scaled(60 * time.Second)          // guest start to a scenario line
	resultTimeout  = scaled(60 * time.Second)          // a scenario line to its result
	exitTimeout    = scaled(30 * time.Second)          // init: done to the guest process's exit
	ioTimeout      = scaled(60 * time.Second)          // one host-side exchange
	backendTimeout = scaled(10 * time.Second)          // backend start, and its reaction to a front-end leaving
	guestTimeout   = scaled(45 * time.Second).String() // microvm.timeout: each scenario in the guest
	// stallAfter is how long one host-side exchange may take before the
	// harness asks microvm to log its devices' and connections' state
	// (SIGUSR1, inspectStall): every scenario takes seconds, and the
	// guest gives up on one after guestTimeout, by when its connection
	// and the evidence of why it stalled are gone.
	stallAfter = scaled(15 * time.Second)
)

// inspectStall, when set, asks the machine under test to log its state
// (microvm run: SIGUSR1). startVM sets it for a microvm process; tests do
// not run in parallel, so there is at most one.
var inspectStall atomic.Pointer[func()]

// watchStall calls inspectStall once if the exchange it guards is still
// going after stallAfter; the caller stops the timer it returns when the
// exchange ends.
func watchStall() *time.Timer {
	return time.AfterFunc(stallAfter, func() {
		if f := inspectStall.Load(); f != nil {
			(*f)()
		}
	})
}

const (
	guestCID = 3
	boxScale = 4
)

// scaled is d, or boxScale times d inside the nested-KVM box.
func scaled(d time.Duration) time.Duration {
	if testenv.InBox() {
		return boxScale * d
	}
	return d
}

// artefacts are what a test boots: prebuilt when $MICROVM_BINARY and
// $MICROVM_INITRD name them (make test sets both, and nothing may be built
// inside the nested-KVM box), otherwise brought up to date by make
// (internal/testing/testenv).
type artefacts struct {
	microvm string // bin/microvm
	initrd  string // the guest's initramfs with the Go /init
	kernel  string // build/kernel/vmlinux
}

// where says where the tests run, as testenv.Record takes it.
func where() string {
	if testenv.InBox() {
		return "box"
	}
	return "native"
}

func qemuBinary() string {
	if q := os.Getenv("MICROVM_QEMU"); q != "" {
		return q
	}
	return "qemu-system-x86_64"
}

// accel returns QEMU's -accel and -cpu values. TCG by default: a KVM that
// cannot run Linux (PVM-based hosts) is worse than none.
func accel(t testing.TB) (string, string) {
	switch a := os.Getenv("MICROVM_CONFORMANCE_ACCEL"); a {
	case "", "tcg":
		return "tcg", "max"
	case "kvm":
		return "kvm", "host"
	default:
		t.Fatalf("MICROVM_CONFORMANCE_ACCEL=%q: want tcg or kvm", a)
		return "", ""
	}
}

// suiteEnabled skips the test under -short and MICROVM_CONFORMANCE=off.
func suiteEnabled(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("conformance: boots Linux; skipped with -short")
	}
	if os.Getenv("MICROVM_CONFORMANCE") == "off" {
		t.Skip("conformance: MICROVM_CONFORMANCE=off (make go-test leaves the suite to make conformance)")
	}
}

// need skips (or, under CI=true, fails) when QEMU, the kernel or the
// initramfs is missing, and returns the artefacts of a QEMU-target test.
func need(t *testing.T) artefacts {
	t.Helper()
	suiteEnabled(t)
	if _, err := exec.LookPath(qemuBinary()); err != nil {
		testenv.Missing(t, "conformance: missing %s (apt-get install qemu-system-x86, or set MICROVM_QEMU)", qemuBinary())
	}
	a := artefacts{kernel: testenv.Kernel(t), microvm: testenv.Binary(t), initrd: testenv.Initrd(t)}
	testenv.Record(t, "vhost-user-qemu", where())
	return a
}

// guestCmdline is the guest kernel's command line: reboot is "t" under
// QEMU -no-reboot (a triple fault ends QEMU), "k" under microvm (its
// i8042 reset ends microvm with status 0).
func guestCmdline(reboot string, params []string) string {
	return "console=ttyS0 reboot=" + reboot + " panic=-1 quiet microvm.timeout=" + guestTimeout + " " + strings.Join(params, " ")
}

// proc is a child process of a test: its exit and its log.
type proc struct {
	name    string // "backend", "QEMU", "microvm": as failures name it
	cmd     *exec.Cmd
	log     testenv.SyncBuffer // stderr (the back-end's stdout too)
	done    chan struct{}      // closed when the process has exited
	waitErr error              // valid once done is closed
}

// alive fails the test if the process has exited.
func (p *proc) alive(t testing.TB) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("%s exited: %v\n%s", p.name, p.waitErr, p.log.String())
	default:
	}
}

// count returns how many log lines contain s.
func (p *proc) count(s string) int { return strings.Count(p.log.String(), s) }

// waitLog waits until at least n log lines contain s.
func (p *proc) waitLog(t testing.TB, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(backendTimeout)
	for p.count(s) < n {
		exited := false
		select {
		case <-p.done:
			exited = true
		default:
		}
		if exited && p.count(s) < n {
			t.Fatalf("%s exited (%v) while waiting for %q in its log:\n%s", p.name, p.waitErr, s, p.log.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q appeared %d times in %v, want %d:\n%s", p.name, s, p.count(s), backendTimeout, n, p.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var levelRE = regexp.MustCompile(`\blevel=(\w+)`)

// problems returns the log lines at warning level or above that contain
// none of the allowed strings: protocol errors ("front-end dropped"), device
// failures, guest errors.
func (p *proc) problems(allowed ...string) []string {
	var out []string
lines:
	for _, l := range strings.Split(p.log.String(), "\n") {
		m := levelRE.FindStringSubmatch(l)
		if m == nil || (m[1] != "warning" && m[1] != "error" && m[1] != "fatal" && m[1] != "panic") {
			continue
		}
		for _, a := range allowed {
			if strings.Contains(l, a) {
				continue lines
			}
		}
		out = append(out, l)
	}
	return out
}

// checkClean fails the test if the process logged any warning or error.
func (p *proc) checkClean(t testing.TB) {
	t.Helper()
	if pr := p.problems(); len(pr) > 0 {
		t.Errorf("%s logged %d problem(s):\n%s", p.name, len(pr), strings.Join(pr, "\n"))
	}
}

// backend is a microvm vhost-user-vsock process.
type backend struct {
	proc
	art       artefacts
	dir       string // short temporary directory (sun_path is 108 bytes)
	sock, uds string
}

// startBackend starts the back-end in a fresh temporary directory and waits
// until its sockets exist. Cleanup stops it (SIGTERM, then SIGKILL).
func startBackend(t *testing.T, a artefacts, extraArgs ...string) *backend {
	t.Helper()
	dir := shortTempDir(t)
	b := &backend{proc: proc{name: "backend", done: make(chan struct{})}, art: a,
		dir: dir, sock: filepath.Join(dir, "vhu.sock"), uds: filepath.Join(dir, "v.sock")}
	args := append([]string{"vhost-user-vsock", "--socket", b.sock, "--guest-cid", strconv.Itoa(guestCID),
		"--uds-path", b.uds, "--log-level", "info"}, extraArgs...)
	if o := os.Getenv("MICROVM_CONFORMANCE_VSOCK_OPT"); o != "" {
		// The device's switches (docs/notes/performance.md), to compare the
		// real Linux driver's 16 MiB echo with one of them off.
		args = append(args, "--vsock-opt", o)
	}
	b.cmd = exec.Command(a.microvm, args...)
	b.cmd.Stdout = &b.log
	b.cmd.Stderr = &b.log
	if err := b.cmd.Start(); err != nil {
		t.Fatalf("start backend: %v", err)
	}
	go func() { b.waitErr = b.cmd.Wait(); close(b.done) }()
	t.Cleanup(func() {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(backendTimeout):
			_ = b.cmd.Process.Kill()
			<-b.done
		}
		if t.Failed() {
			t.Logf("backend log:\n%s", b.log.String())
		}
	})
	b.waitLog(t, "vhost-user-vsock listening on", 1)
	for _, p := range []string{b.sock, b.uds} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("backend socket: %v", err)
		}
	}
	return b
}

// shortTempDir returns a fresh directory under $TMPDIR (/tmp), not
// t.TempDir: Unix socket paths must fit in sun_path's 108 bytes, and inside
// the nested-KVM box sockets must live on /tmp's tmpfs. Cleanup removes it.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

var featuresRE = regexp.MustCompile(`rings started" features=(0x[0-9a-f]+)`)

// features returns the virtio features of the last ring start in the log.
func (b *backend) features(t testing.TB) uint64 {
	t.Helper()
	m := featuresRE.FindAllStringSubmatch(b.log.String(), -1)
	if m == nil {
		t.Fatalf("no ring start in the backend log:\n%s", b.log.String())
	}
	f, err := strconv.ParseUint(m[len(m)-1][1], 0, 64)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// console collects the guest's serial output line by line.
type console struct {
	mu      sync.Mutex
	lines   []string
	eof     bool
	changed chan struct{} // closed and replaced on every new line and at EOF
}

func newConsole() *console { return &console{changed: make(chan struct{})} }

// read collects r's lines until EOF.
func (c *console) read(r io.Reader) {
	br := bufio.NewReader(r)
	for {
		l, err := br.ReadString('\n')
		if l != "" {
			c.add(strings.TrimRight(l, "\r\n"), false)
		}
		if err != nil {
			c.add("", true)
			return
		}
	}
}

func (c *console) add(l string, eof bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if eof {
		c.eof = true
	} else {
		c.lines = append(c.lines, l)
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *console) transcript() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.lines, "\n")
}

// vm is one guest: a QEMU process (its log: stderr) or a microvm run
// process (its log: stderr, at info level), the serial console on stdout.
type vm struct {
	proc
	con    *console
	cursor int // console lines before it are consumed
}

// bootOpts selects the QEMU configuration.
type bootOpts struct {
	legacy bool     // leave virtio-mmio at QEMU's legacy default
	params []string // microvm.* kernel parameters
	initrd string   // the initramfs, when not the back-end's (guest/init)
}

// qemuArgs is the command line documented in docs/vhost-user.md.
func qemuArgs(t testing.TB, b *backend, o bootOpts) []string {
	acc, cpu := accel(t)
	args := []string{
		"-M", "microvm,acpi=off,memory-backend=mem", "-accel", acc, "-cpu", cpu, "-m", "256M",
		"-object", "memory-backend-memfd,id=mem,size=256M,share=on",
		"-chardev", "socket,id=vc,path=" + b.sock, "-device", "vhost-user-vsock-device,chardev=vc",
	}
	if !o.legacy {
		args = append(args, "-global", "virtio-mmio.force-legacy=false")
	}
	initrd := b.art.initrd
	if o.initrd != "" {
		initrd = o.initrd
	}
	return append(args, "-kernel", b.art.kernel, "-initrd", initrd, "-append", guestCmdline("t", o.params),
		"-nodefaults", "-nographic", "-serial", "stdio", "-no-reboot")
}

// boot starts QEMU against the back-end. Cleanup kills it.
func boot(t *testing.T, b *backend, o bootOpts) *vm {
	t.Helper()
	return startVM(t, "QEMU", exec.Command(qemuBinary(), qemuArgs(t, b, o)...))
}

// startVM starts cmd, a guest whose serial console is its stdout. Cleanup
// kills it, and shows its console and log when the test failed.
func startVM(t *testing.T, name string, cmd *exec.Cmd) *vm {
	t.Helper()
	v := &vm{proc: proc{name: name, cmd: cmd, done: make(chan struct{})}}
	out, err := v.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	v.cmd.Stderr = &v.log
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	v.con = newConsole()
	if name == "microvm" {
		inspect := func() { _ = v.cmd.Process.Signal(syscall.SIGUSR1) }
		inspectStall.Store(&inspect)
		t.Cleanup(func() { inspectStall.CompareAndSwap(&inspect, nil) })
	}
	go func() {
		v.con.read(out) // Wait closes the pipe: read to EOF first
		v.waitErr = v.cmd.Wait()
		close(v.done)
	}()
	t.Cleanup(func() {
		v.kill()
		if t.Failed() {
			t.Logf("guest console:\n%s\n%s stderr:\n%s", v.con.transcript(), name, v.log.String())
		}
	})
	return v
}

// kill sends SIGKILL and waits for the process (bounded: a process in
// uninterruptible sleep must not hang the suite).
func (v *vm) kill() {
	_ = v.cmd.Process.Kill()
	select {
	case <-v.done:
	case <-time.After(exitTimeout):
	}
}

// next returns the first unconsumed console line that match accepts, and
// consumes everything up to it. It fails the test on timeout, or when the
// guest process exits first.
func (v *vm) next(t testing.TB, what string, timeout time.Duration, match func(string) bool) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		v.con.mu.Lock()
		lines, eof, changed := v.con.lines, v.con.eof, v.con.changed
		v.con.mu.Unlock()
		for i := v.cursor; i < len(lines); i++ {
			if match(lines[i]) {
				v.cursor = i + 1
				return lines[i]
			}
		}
		if eof {
			t.Fatalf("%s exited before %s%s", v.name, what, v.lastWords())
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no %s within %v", what, timeout)
		}
	}
}

// lastWords is how the guest's machine ended, for a failure's one line:
// the last line of its console and the last warning or error (or "guest
// stopped") line of its log.
func (v *vm) lastWords() string {
	var out []string
	if lines := strings.Split(strings.TrimSpace(v.con.transcript()), "\n"); len(lines) > 0 && lines[len(lines)-1] != "" {
		out = append(out, "console: "+lines[len(lines)-1])
	}
	log := strings.Split(v.log.String(), "\n")
	for i := len(log) - 1; i >= 0; i-- {
		l := log[i]
		if strings.Contains(l, "level=error") || strings.Contains(l, "level=warning") || strings.Contains(l, "guest stopped") {
			out = append(out, v.name+": "+l)
			break
		}
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

var resultRE = regexp.MustCompile(`^init: scenario (\S+) (ok|FAIL)( .*)?$`)

// listening waits for scenario name to listen (or fail) and returns the
// port.
func (v *vm) listening(t testing.TB, name string) uint32 {
	t.Helper()
	prefix := "init: scenario " + name + " "
	l := v.next(t, name+" listening", bootTimeout, func(l string) bool {
		return strings.HasPrefix(l, prefix) && (strings.Contains(l, " listening ") || resultRE.MatchString(l))
	})
	if m := resultRE.FindStringSubmatch(l); m != nil {
		t.Fatalf("scenario %s ended before listening: %s", name, l)
	}
	f := fields(l[strings.Index(l, " listening ")+len(" listening "):])
	p, err := strconv.ParseUint(f["port"], 10, 32)
	if err != nil {
		t.Fatalf("listening line %q: %v", l, err)
	}
	return uint32(p)
}

// result waits for scenario name's result line and returns its key=value
// fields; a FAIL line fails the test.
func (v *vm) result(t testing.TB, name string) map[string]string {
	t.Helper()
	l := v.next(t, name+" result", resultTimeout, func(l string) bool {
		m := resultRE.FindStringSubmatch(l)
		return m != nil && m[1] == name
	})
	m := resultRE.FindStringSubmatch(l)
	if m[2] != "ok" {
		t.Fatalf("guest: %s", l)
	}
	return fields(m[3])
}

// finish waits for "init: done ok" and the guest process's exit with
// status 0.
func (v *vm) finish(t testing.TB) {
	t.Helper()
	l := v.next(t, "init: done", resultTimeout, func(l string) bool { return strings.HasPrefix(l, "init: done ") })
	if l != "init: done ok" {
		t.Errorf("guest: %s", l)
	}
	for _, w := range strings.Split(v.con.transcript(), "\n") {
		if strings.HasPrefix(w, "init: warning") {
			t.Errorf("guest: %s", w)
		}
	}
	select {
	case <-v.done:
	case <-time.After(exitTimeout):
		t.Fatalf("%s still running %v after %q", v.name, exitTimeout, l)
	}
	if v.waitErr != nil {
		t.Errorf("%s: %v", v.name, v.waitErr)
	}
}

// fields parses "k=v k=v".
func fields(s string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// payload is the guest's payload stream for seed (guest/init/payload.go):
// ChaCha8 keyed by the seed as 8 little-endian bytes and 24 zero bytes.
func payload(seed uint64) io.Reader {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	return rand.NewChaCha8(key)
}

func payloadSum(seed uint64, n int64) string {
	h := sha256.New()
	if _, err := io.CopyN(h, payload(seed), n); err != nil {
		panic(err) // neither side fails
	}
	return hex.EncodeToString(h.Sum(nil))
}

// digest counts and hashes what is written to it.
type digest struct {
	h hash.Hash
	n int64
}

func newDigest() *digest { return &digest{h: sha256.New()} }

func (d *digest) Write(p []byte) (int, error) {
	d.h.Write(p)
	d.n += int64(len(p))
	return len(p), nil
}

func (d *digest) Sum() string { return hex.EncodeToString(d.h.Sum(nil)) }

// hostConnect opens a host-initiated connection (testenv.VsockConnect, which
// is hybrid.Dial), with ioTimeout as the deadline of what follows. A
// connection closed instead of answered with OK gives an error wrapping
// hybrid.ErrRefused and io.EOF.
func hostConnect(uds string, port uint32) (*net.UnixConn, error) {
	c, _, err := testenv.VsockConnect(uds, port, ioTimeout)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	return c, nil
}

// exchangeResult is what one host-side send-and-read exchange saw.
type exchangeResult struct {
	sent, got *digest
}

// exchange writes n bytes of src to c (then shuts down writing) while
// reading c to EOF.
func exchange(c *net.UnixConn, src io.Reader, n int64) (exchangeResult, error) {
	res := exchangeResult{sent: newDigest(), got: newDigest()}
	defer watchStall().Stop()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	werr := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.MultiWriter(c, res.sent), src, n)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	_, rerr := io.Copy(res.got, c)
	if err := <-werr; err != nil {
		return res, fmt.Errorf("write after %d bytes: %w", res.sent.n, err)
	}
	if rerr != nil {
		return res, fmt.Errorf("read after %d bytes: %w", res.got.n, rerr)
	}
	return res, nil
}

// guestListener is a host listener for guest connections to port P:
// <uds>_P.
type guestListener struct {
	ln      *net.UnixListener
	results chan hostResult
}

// hostResult is what a host-side handler saw on one guest connection.
type hostResult struct {
	got     *digest // bytes read
	sent    *digest // bytes written
	records int     // SEQPACKET: records read
	err     error
}

// listenGuest listens on <uds>_port and runs serve on each of conns
// connections (concurrently), reporting each result.
func listenGuest(t *testing.T, uds string, port uint32, conns int, serve func(c *net.UnixConn) hostResult) *guestListener {
	t.Helper()
	return listenGuestNet(t, "unix", uds, port, conns, serve)
}

// listenGuestNet is listenGuest for network "unix" or "unixpacket"
// (SOCK_SEQPACKET: guest SEQPACKET connections).
func listenGuestNet(t *testing.T, network, uds string, port uint32, conns int, serve func(c *net.UnixConn) hostResult) *guestListener {
	t.Helper()
	path := fmt.Sprintf("%s_%d", uds, port)
	ln, err := net.ListenUnix(network, &net.UnixAddr{Name: path, Net: network})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	g := &guestListener{ln: ln, results: make(chan hostResult, conns)}
	_ = ln.SetDeadline(time.Now().Add(bootTimeout + resultTimeout))
	go func() {
		for range conns {
			c, err := ln.AcceptUnix()
			if err != nil {
				g.results <- hostResult{err: fmt.Errorf("accept on %s: %w", path, err)}
				return
			}
			go func() {
				defer c.Close()
				defer watchStall().Stop()
				_ = c.SetDeadline(time.Now().Add(ioTimeout))
				g.results <- serve(c)
			}()
		}
	}()
	return g
}

// wait returns the next handler result.
func (g *guestListener) wait(t testing.TB) hostResult {
	t.Helper()
	select {
	case r := <-g.results:
		return r
	case <-time.After(ioTimeout):
		t.Fatalf("host handler on %s: no result within %v", g.ln.Addr(), ioTimeout)
		return hostResult{}
	}
}

// echoServe echoes a guest connection until EOF, then closes it.
func echoServe(c *net.UnixConn) hostResult {
	r := hostResult{got: newDigest(), sent: newDigest()}
	_, err := io.Copy(io.MultiWriter(c, r.got, r.sent), c)
	r.err = err
	return r
}

// checkSum compares a guest result's bytes and sha256 with want.
func checkSum(t testing.TB, what string, f map[string]string, n int64, sum string) {
	t.Helper()
	if f["bytes"] != strconv.FormatInt(n, 10) || f["sha256"] != sum {
		t.Errorf("%s: guest reports bytes=%s sha256=%s, host has bytes=%d sha256=%s", what, f["bytes"], f["sha256"], n, sum)
	}
}
