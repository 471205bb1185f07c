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
	"syscall"
	"testing"
	"time"

	"github.com/microvm/microvm/internal/testenv"
)

// Bounds on every wait. TCG boots the guest to /init in about a second; these
// leave room for a loaded machine without letting a broken run hang.
const (
	bootTimeout    = 60 * time.Second // QEMU start to a scenario line
	resultTimeout  = 60 * time.Second // a scenario line to its result
	exitTimeout    = 30 * time.Second // init: done to QEMU's exit
	ioTimeout      = 60 * time.Second // one host-side exchange
	backendTimeout = 10 * time.Second // backend start, and its reaction to a front-end leaving
	guestTimeout   = "45s"            // microvm.timeout: each scenario in the guest
	guestCID       = 3
)

// Test binaries, built once per test process into a temporary directory.
var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	bins      struct{ microvm, initrd string }
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// repoRoot is the module root: the tests run in conformance/.
func repoRoot(t testing.TB) string {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("conformance: module root not found above %s: %v", root, err)
	}
	return root
}

func kernelPath(t testing.TB) string {
	if k := os.Getenv("MICROVM_KERNEL"); k != "" {
		return k
	}
	return filepath.Join(repoRoot(t), "build", "kernel", "vmlinux")
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

// need skips (or, under CI=true, fails) when the kernel or QEMU is missing,
// then builds the binaries once.
func need(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("conformance: boots Linux under QEMU; skipped with -short")
	}
	if os.Getenv("MICROVM_CONFORMANCE") == "off" {
		t.Skip("conformance: MICROVM_CONFORMANCE=off (make go-test leaves the suite to make conformance)")
	}
	var missing []string
	if _, err := os.Stat(kernelPath(t)); err != nil {
		missing = append(missing, fmt.Sprintf("guest kernel %s (run make kernel, or set MICROVM_KERNEL)", kernelPath(t)))
	}
	if _, err := exec.LookPath(qemuBinary()); err != nil {
		missing = append(missing, fmt.Sprintf("%s (apt-get install qemu-system-x86, or set MICROVM_QEMU)", qemuBinary()))
	}
	if len(missing) > 0 {
		msg := "conformance: missing " + strings.Join(missing, "; ")
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	buildOnce.Do(func() { buildErr = buildAll(repoRoot(t)) })
	if buildErr != nil {
		t.Fatalf("conformance: build: %v", buildErr)
	}
}

// buildAll builds bin/microvm, the static guest /init and its initramfs.
func buildAll(root string) error {
	dir, err := os.MkdirTemp("", "cfbin")
	if err != nil {
		return err
	}
	buildDir = dir
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("go tool: %w", err)
	}
	run := func(env []string, args ...string) error {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	bins.microvm = filepath.Join(dir, "microvm")
	initBin := filepath.Join(dir, "init")
	mkinit := filepath.Join(dir, "mkinitramfs")
	bins.initrd = filepath.Join(dir, "initramfs.cpio.gz")
	errs := make(chan error, 3)
	go func() { errs <- run(nil, "build", "-o", bins.microvm, "./cmd/microvm") }()
	go func() {
		errs <- run([]string{"CGO_ENABLED=0"}, "build", "-trimpath", "-ldflags=-s", "-o", initBin, "./guest/init")
	}()
	go func() { errs <- run(nil, "build", "-o", mkinit, "./guest/mkinitramfs") }()
	for range 3 {
		if err := <-errs; err != nil {
			return err
		}
	}
	out, err := exec.Command(mkinit, "-o", bins.initrd, "-init", initBin).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkinitramfs: %v\n%s", err, out)
	}
	return nil
}

// backend is a microvm vhost-user-vsock process.
type backend struct {
	dir       string // short temporary directory (sun_path is 108 bytes)
	sock, uds string
	cmd       *exec.Cmd
	log       testenv.SyncBuffer
	done      chan struct{} // closed when the process has exited
	waitErr   error
}

// startBackend starts the back-end in a fresh temporary directory and waits
// until its sockets exist. Cleanup stops it (SIGTERM, then SIGKILL).
func startBackend(t *testing.T, extraArgs ...string) *backend {
	t.Helper()
	dir, err := os.MkdirTemp("", "cf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	b := &backend{dir: dir, sock: filepath.Join(dir, "vhu.sock"), uds: filepath.Join(dir, "v.sock"), done: make(chan struct{})}
	args := append([]string{"vhost-user-vsock", "--socket", b.sock, "--guest-cid", strconv.Itoa(guestCID),
		"--uds-path", b.uds, "--log-level", "info"}, extraArgs...)
	b.cmd = exec.Command(bins.microvm, args...)
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

// alive fails the test if the back-end process has exited.
func (b *backend) alive(t testing.TB) {
	t.Helper()
	select {
	case <-b.done:
		t.Fatalf("backend exited: %v\n%s", b.waitErr, b.log.String())
	default:
	}
}

// count returns how many log lines contain s.
func (b *backend) count(s string) int { return strings.Count(b.log.String(), s) }

// waitLog waits until at least n log lines contain s.
func (b *backend) waitLog(t testing.TB, s string, n int) {
	t.Helper()
	deadline := time.Now().Add(backendTimeout)
	for b.count(s) < n {
		select {
		case <-b.done:
			t.Fatalf("backend exited (%v) while waiting for %q in its log:\n%s", b.waitErr, s, b.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("backend: %q appeared %d times in %v, want %d:\n%s", s, b.count(s), backendTimeout, n, b.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
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

var levelRE = regexp.MustCompile(`\blevel=(\w+)`)

// problems returns the log lines at warning level or above that contain
// none of the allowed strings: protocol errors ("front-end dropped"), device
// failures, guest errors.
func (b *backend) problems(allowed ...string) []string {
	var out []string
lines:
	for _, l := range strings.Split(b.log.String(), "\n") {
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

// checkClean fails the test if the back-end logged any warning or error.
func (b *backend) checkClean(t testing.TB) {
	t.Helper()
	if p := b.problems(); len(p) > 0 {
		t.Errorf("backend logged %d problem(s):\n%s", len(p), strings.Join(p, "\n"))
	}
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

// vm is one QEMU process.
type vm struct {
	cmd     *exec.Cmd
	con     *console
	stderr  testenv.SyncBuffer
	cursor  int // console lines before it are consumed
	done    chan struct{}
	waitErr error
}

// bootOpts selects the QEMU configuration.
type bootOpts struct {
	legacy bool     // leave virtio-mmio at QEMU's legacy default
	params []string // microvm.* kernel parameters
}

// qemuArgs is the command line documented in docs/vhost-user.md.
func qemuArgs(t testing.TB, sock string, o bootOpts) []string {
	acc, cpu := accel(t)
	args := []string{
		"-M", "microvm,acpi=off,memory-backend=mem", "-accel", acc, "-cpu", cpu, "-m", "256M",
		"-object", "memory-backend-memfd,id=mem,size=256M,share=on",
		"-chardev", "socket,id=vc,path=" + sock, "-device", "vhost-user-vsock-device,chardev=vc",
	}
	if !o.legacy {
		args = append(args, "-global", "virtio-mmio.force-legacy=false")
	}
	cmdline := "console=ttyS0 reboot=t panic=-1 quiet microvm.timeout=" + guestTimeout + " " + strings.Join(o.params, " ")
	return append(args, "-kernel", kernelPath(t), "-initrd", bins.initrd, "-append", cmdline,
		"-nodefaults", "-nographic", "-serial", "stdio", "-no-reboot")
}

// boot starts QEMU against the back-end. Cleanup kills it.
func boot(t *testing.T, b *backend, o bootOpts) *vm {
	t.Helper()
	v := &vm{done: make(chan struct{})}
	v.cmd = exec.Command(qemuBinary(), qemuArgs(t, b.sock, o)...)
	out, err := v.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	v.cmd.Stderr = &v.stderr
	if err := v.cmd.Start(); err != nil {
		t.Fatalf("start QEMU: %v", err)
	}
	v.con = newConsole()
	go func() {
		v.con.read(out) // Wait closes the pipe: read to EOF first
		v.waitErr = v.cmd.Wait()
		close(v.done)
	}()
	t.Cleanup(func() {
		v.kill()
		if t.Failed() {
			t.Logf("guest console:\n%s\nQEMU stderr:\n%s", v.con.transcript(), v.stderr.String())
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
// consumes everything up to it. It fails the test on timeout, or when QEMU
// exits first.
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
			t.Fatalf("QEMU exited before %s", what)
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no %s within %v", what, timeout)
		}
	}
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

// finish waits for "init: done ok" and QEMU's exit with status 0.
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
		t.Fatalf("QEMU still running %v after %q", exitTimeout, l)
	}
	if v.waitErr != nil {
		t.Errorf("QEMU: %v", v.waitErr)
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

// hostConnect opens a host-initiated connection (testenv.VsockConnect),
// with ioTimeout as the deadline of what follows. A connection closed
// instead of answered with OK gives an error wrapping io.EOF.
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
	got  *digest // bytes read
	sent *digest // bytes written
	err  error
}

// listenGuest listens on <uds>_port and runs serve on each of conns
// connections (concurrently), reporting each result.
func listenGuest(t *testing.T, b *backend, port uint32, conns int, serve func(c *net.UnixConn) hostResult) *guestListener {
	t.Helper()
	path := fmt.Sprintf("%s_%d", b.uds, port)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
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
