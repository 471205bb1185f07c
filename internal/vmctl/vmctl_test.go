package vmctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// fakeVM is a Backend that records what it was asked.
type fakeVM struct {
	snapTime time.Duration // how long Snapshot takes
	mu       sync.Mutex
	state    string
	asked    []StateRequest
	snaps    []SnapshotRequest
}

func (f *fakeVM) Info() VMInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	return VMInfo{Name: "vm1", State: f.state, CPUs: 2, MemoryBytes: 64 << 20,
		Counters: Counters{VCPUs: []VCPUCounters{{ID: 0, Exits: 42}}}}
}

func (f *fakeVM) SetState(_ context.Context, req StateRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, req)
	if f.state == "stopping" {
		return fmt.Errorf("the VM is stopping: %w", ErrConflict)
	}
	f.state = req.State
	return nil
}

func (f *fakeVM) Snapshot(_ context.Context, req SnapshotRequest) error {
	time.Sleep(f.snapTime)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == "stopping" {
		return fmt.Errorf("the VM is stopping: %w", ErrConflict)
	}
	f.snaps = append(f.snaps, req)
	return nil
}

func (f *fakeVM) WriteMetrics(w io.Writer) error {
	_, err := io.WriteString(w, "microvm_vcpu_exits_total{vcpu=\"0\",reason=\"io\"} 42\n")
	return err
}

func serve(t *testing.T) (*fakeVM, *Client, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "vmctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "api.sock")
	vm := &fakeVM{state: "running"}
	l := logrus.New()
	l.SetOutput(io.Discard)
	s, err := Serve(path, vm, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket left after Close: %v", err)
		}
	})
	c := NewClient(path)
	t.Cleanup(c.Close)
	return vm, c, path
}

// TestAPI: the client and the server agree on every call, and refusals
// come back as StatusErrors with their code and message.
func TestAPI(t *testing.T) {
	vm, c, _ := serve(t)
	ctx := context.Background()
	info, err := c.Info(ctx)
	if err != nil || info.Name != "vm1" || info.State != "running" || info.Counters.VCPUs[0].Exits != 42 {
		t.Fatalf("Info: %+v, %v", info, err)
	}
	if err := c.SetState(ctx, StateRequest{State: Paused}); err != nil {
		t.Fatal(err)
	}
	if info, _ := c.Info(ctx); info.State != Paused {
		t.Errorf("state %q after pausing", info.State)
	}
	var m bytes.Buffer
	if err := c.Metrics(ctx, &m); err != nil || !strings.Contains(m.String(), "microvm_vcpu_exits_total") {
		t.Errorf("Metrics: %q, %v", m.String(), err)
	}
	for _, tc := range []struct {
		req  StateRequest
		code int
		msg  string
	}{
		{StateRequest{State: "exploded"}, 400, `state "exploded": want paused, running or stopped`},
		{StateRequest{State: Stopped, TimeoutMS: -1}, 400, "timeout_ms must not be negative"},
	} {
		var se *StatusError
		if err := c.SetState(ctx, tc.req); !errors.As(err, &se) || se.Code != tc.code || se.Msg != tc.msg {
			t.Errorf("SetState(%+v): %v, want %d %q", tc.req, err, tc.code, tc.msg)
		}
	}
	if err := c.Snapshot(ctx, SnapshotRequest{Path: "/var/snap/a", Stop: true}); err != nil {
		t.Errorf("Snapshot: %v", err)
	}
	for _, p := range []string{"", "rel/dir", "/var/../snap", "/"} {
		var se *StatusError
		if err := c.Snapshot(ctx, SnapshotRequest{Path: p}); !errors.As(err, &se) || se.Code != 400 || !strings.Contains(se.Msg, "want a clean absolute path") {
			t.Errorf("Snapshot to %q: %v, want 400", p, err)
		}
	}
	if want := []SnapshotRequest{{Path: "/var/snap/a", Stop: true}}; !reflect.DeepEqual(vm.snaps, want) {
		t.Errorf("snapshots asked: %+v, want %+v", vm.snaps, want)
	}
	vm.mu.Lock()
	vm.state = "stopping"
	vm.mu.Unlock()
	var se *StatusError
	if err := c.SetState(ctx, StateRequest{State: Paused}); !errors.As(err, &se) || se.Code != 409 {
		t.Errorf("pausing a stopping VM: %v, want 409", err)
	}
	if err := c.Snapshot(ctx, SnapshotRequest{Path: "/var/snap/b"}); !errors.As(err, &se) || se.Code != 409 {
		t.Errorf("snapshot of a stopping VM: %v, want 409", err)
	}
}

// TestRawRequests: what a client other than ours (curl) sees for requests
// the API refuses.
func TestRawRequests(t *testing.T) {
	_, _, path := serve(t)
	for _, tc := range []struct {
		req, status, body string
	}{
		{"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "404", `"error":"not found`},
		{"POST /vm HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", "405", `GET /vm only`},
		{"PUT /vm/state HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot json!", "400", `body: `},
		{"PUT /vm/state HTTP/1.1\r\nHost: x\r\nContent-Length: 35\r\nConnection: close\r\n\r\n{\"state\":\"paused\",\"bogus\":\"field\"}", "400", `unknown field`},
	} {
		conn, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, tc.req)
		b, _ := io.ReadAll(conn)
		conn.Close()
		if !strings.HasPrefix(string(b), "HTTP/1.1 "+tc.status) || !strings.Contains(string(b), tc.body) {
			t.Errorf("%q: got %q; want status %s and %q", strings.SplitN(tc.req, "\r\n", 2)[0], b, tc.status, tc.body)
		}
	}
}

// TestClientNoServer: a client of a socket nobody serves says so, naming
// the socket.
func TestClientNoServer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.sock")
	_, err := NewClient(path).Info(context.Background())
	if err == nil || !strings.Contains(err.Error(), "control API "+path) || strings.Contains(err.Error(), "http://microvm") {
		t.Errorf("Info: %v", err)
	}
}

// TestOpenAPIFile: docs/api.yaml describes every field the API sends and
// takes, and every path it serves.
func TestOpenAPIFile(t *testing.T) {
	doc, err := os.ReadFile("../../docs/api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	var walk func(reflect.Type)
	walk = func(rt reflect.Type) {
		for i := 0; i < rt.NumField(); i++ {
			f := rt.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields = append(fields, name)
			ft := f.Type
			if ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft.PkgPath() == rt.PkgPath() {
				walk(ft)
			}
		}
	}
	walk(reflect.TypeOf(VMInfo{}))
	walk(reflect.TypeOf(StateRequest{}))
	for _, f := range fields {
		if !strings.Contains(string(doc), "        "+f+":") && !strings.Contains(string(doc), " "+f+": {") {
			t.Errorf("docs/api.yaml does not describe field %q", f)
		}
	}
	for _, p := range []string{"/vm:", "/vm/state:", "/metrics:"} {
		if !strings.Contains(string(doc), "\n  "+p) {
			t.Errorf("docs/api.yaml has no path %s", p)
		}
	}
}

// TestSlowSnapshotIsNotCut: a snapshot that takes longer than the server's
// write timeout is reported as made, not cut off with the reply.
func TestSlowSnapshotIsNotCut(t *testing.T) {
	writeTimeout = 100 * time.Millisecond
	defer func() { writeTimeout = time.Minute }()
	vm, c, _ := serve(t)
	vm.snapTime = 400 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Snapshot(ctx, SnapshotRequest{Path: "/var/snap/slow"}); err != nil {
		t.Fatalf("a snapshot slower than the write timeout: %v", err)
	}
	// Other replies keep their write timeout.
	if _, err := c.Info(ctx); err != nil {
		t.Fatal(err)
	}
}
