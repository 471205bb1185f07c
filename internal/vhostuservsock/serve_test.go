package vhostuservsock

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/microvm/microvm/internal/promtext/promtexttest"
	"github.com/microvm/microvm/vsock"
	"github.com/microvm/microvm/vsock/hybrid"
)

// testConfig is a back-end on sockets in a fresh directory.
func testConfig(t *testing.T) Config {
	t.Helper()
	dir := t.TempDir()
	opts := vsock.DefaultOptions
	return Config{
		Socket:        filepath.Join(dir, "vhu.sock"),
		UDS:           filepath.Join(dir, "v.sock"),
		MetricsSocket: filepath.Join(dir, "m.sock"),
		Device: vsock.Config{
			CID:            3,
			MaxConns:       4,
			ConnBuffer:     64 << 10,
			ConnectTimeout: time.Second,
			Options:        &opts,
		},
		VsockOpt: "kick-suppress=on",
	}
}

// hooks records the order Serve calls Options' hooks in.
type hooks struct {
	mu     sync.Mutex
	called []string
}

func (h *hooks) add(s string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.called = append(h.called, s)
}

func (h *hooks) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.called)
}

// options are Options whose hooks record into h; Interruptible's context
// is cancelled with cause by the returned function.
func (h *hooks) options(log logrus.FieldLogger, listening io.Writer) (Options, func(cause error)) {
	stopCh := make(chan error, 1)
	return Options{
		Log: log,
		StartCPUProfile: func() (func(), error) {
			h.add("profile")
			return func() { h.add("profile stop") }, nil
		},
		Interruptible: func(parent context.Context) (context.Context, func()) {
			h.add("interruptible")
			ctx, cancel := context.WithCancelCause(parent)
			go func() {
				select {
				case cause := <-stopCh:
					cancel(cause)
				case <-ctx.Done():
				}
			}()
			return ctx, func() { h.add("interruptible stop"); cancel(nil) }
		},
		Confine: func() error {
			h.add("confine")
			return nil
		},
		Listening: listening,
	}, func(cause error) { stopCh <- cause }
}

// caught is a context's cause carrying a signal, as the CLI's.
type caught struct{ sig syscall.Signal }

func (c caught) Error() string          { return "stopped by " + c.sig.String() }
func (c caught) Signal() syscall.Signal { return c.sig }

// TestServe: Serve listens on the three sockets, calls the hooks in order
// before it says it listens, serves metrics and host clients (a CONNECT is
// refused while no front-end drives the device), and on the context's end
// with a signal cause logs it, returns nil and removes its sockets.
func TestServe(t *testing.T) {
	cfg := testConfig(t)
	log, logs := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	var h hooks
	pr, pw := io.Pipe()
	o, stop := h.options(log, pw)
	res := make(chan error, 1)
	go func() { res <- Serve(context.Background(), cfg, o) }()

	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	want := "microvm: vhost-user-vsock listening on " + cfg.Socket + " (guest CID 3, host sockets " + cfg.UDS + ")\n"
	if line != want {
		t.Errorf("listening line %q, want %q", line, want)
	}
	if got, want := h.list(), []string{"profile", "interruptible", "confine"}; !slices.Equal(got, want) {
		t.Errorf("hooks %q, want %q", got, want)
	}
	for _, p := range []string{cfg.Socket, cfg.UDS, cfg.MetricsSocket} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Type() != os.ModeSocket {
			t.Errorf("%s: %v, want a socket", p, err)
		}
	}
	text, _ := promtexttest.Scrape(t, cfg.MetricsSocket)
	e := promtexttest.Parse(t, text)
	if v := e.Get(t, "microvm_vhost_user_frontends_total"); v != 0 {
		t.Errorf("frontends_total = %v, want 0", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := hybrid.Dial(ctx, cfg.UDS, 52); !errors.Is(err, hybrid.ErrRefused) {
		if err == nil {
			c.Close()
		}
		t.Errorf("CONNECT without a front-end: %v, want refused", err)
	}

	stop(caught{syscall.SIGTERM})
	select {
	case err := <-res:
		if err != nil {
			t.Errorf("Serve after the context's end: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after the context's end")
	}
	if got, want := h.list(), []string{"profile", "interruptible", "confine", "interruptible stop", "profile stop"}; !slices.Equal(got, want) {
		t.Errorf("hooks %q, want %q", got, want)
	}
	var msgs []string
	for _, e := range logs.AllEntries() {
		msgs = append(msgs, e.Message)
	}
	if !slices.Contains(msgs, "stopping on terminated") {
		t.Errorf("log %q has no %q", msgs, "stopping on terminated")
	}
	if e := findEntry(logs, "vsock device options"); e == nil || e.Data["vsock-opt"] != "kick-suppress=on" {
		t.Errorf("vsock device options entry %v, want vsock-opt=kick-suppress=on", e)
	}
	for _, p := range []string{cfg.Socket, cfg.UDS, cfg.MetricsSocket} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Serve: %v, want it removed", p, err)
		}
	}
}

func findEntry(h *logtest.Hook, msg string) *logrus.Entry {
	for _, e := range h.AllEntries() {
		if e.Message == msg {
			return e
		}
	}
	return nil
}

// TestServeConfigError: a device vsock.New refuses is a ConfigError with
// vsock.New's text, before any socket or hook.
func TestServeConfigError(t *testing.T) {
	cfg := testConfig(t)
	cfg.Device.CID = 2
	var h hooks
	o, _ := h.options(nil, nil)
	err := Serve(context.Background(), cfg, o)
	var ce ConfigError
	if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), "vsock: guest CID 2 is reserved") {
		t.Errorf("Serve: %v, want a ConfigError from vsock.New", err)
	}
	if got := h.list(); len(got) != 0 {
		t.Errorf("hooks called: %q", got)
	}
	for _, p := range []string{cfg.Socket, cfg.UDS, cfg.MetricsSocket} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want no socket", p, err)
		}
	}
}

// TestServeConfineFails: Confine's error is Serve's, nothing is served,
// and every socket is closed and removed, the profile stopped.
func TestServeConfineFails(t *testing.T) {
	cfg := testConfig(t)
	var h hooks
	var lines strings.Builder
	o, _ := h.options(nil, &lines)
	errConfine := errors.New("no filter")
	o.Confine = func() error { h.add("confine"); return errConfine }
	if err := Serve(context.Background(), cfg, o); !errors.Is(err, errConfine) {
		t.Errorf("Serve: %v, want %v", err, errConfine)
	}
	if lines.Len() != 0 {
		t.Errorf("listening line %q after a failed Confine", lines.String())
	}
	if got, want := h.list(), []string{"profile", "interruptible", "confine", "interruptible stop", "profile stop"}; !slices.Equal(got, want) {
		t.Errorf("hooks %q, want %q", got, want)
	}
	for _, p := range []string{cfg.Socket, cfg.UDS, cfg.MetricsSocket} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Serve: %v, want it removed", p, err)
		}
	}
}
