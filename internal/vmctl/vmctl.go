// Package vmctl is a named VM's control API: HTTP with JSON on a Unix
// socket in the VM's state directory (internal/vms), served by the VM's
// own process and called by the CLI (microvm ls, stop, kill) and the Go
// API. docs/api.yaml is its OpenAPI description:
//
//	GET  /vm          the VM: state, configuration, counters (VMInfo)
//	PUT  /vm/state    {"state": "paused" | "running" | "stopped"} (StateRequest)
//	PUT  /vm/snapshot {"path": DIR, "stop": bool, "overwrite": bool} (SnapshotRequest)
//	GET  /metrics     the Prometheus text exposition (docs/metrics.md)
//
// Errors are JSON too: {"error": "..."} with 400 for a request the API
// does not understand, 404 for another path, 405 for another method, 409
// for a state change the VM cannot make now, 500 otherwise.
//
// Unlike the metrics socket of the lean `microvm run` (internal/metricsrv),
// it uses net/http: it runs in the full build (bin/microvm-full), which
// runs named VMs.
package vmctl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/internal/unixsock"
)

// VMInfo is GET /vm's answer.
type VMInfo struct {
	Name          string    `json:"name"`
	State         string    `json:"state"` // starting, running, paused, stopping
	PID           int       `json:"pid"`
	CPUs          int       `json:"cpus"`
	MemoryBytes   uint64    `json:"memory_bytes"`
	Kernel        string    `json:"kernel"`
	Initrd        string    `json:"initrd,omitempty"`
	Agent         bool      `json:"agent"`
	Created       time.Time `json:"created"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	Counters      Counters  `json:"counters"`
}

// Counters are a few of the VM's counters; GET /metrics has them all.
type Counters struct {
	VCPUs []VCPUCounters `json:"vcpus"`
	// Vsock byte counts are the stream and SEQPACKET payload each way.
	VsockTxBytes     uint64 `json:"vsock_tx_bytes"`
	VsockRxBytes     uint64 `json:"vsock_rx_bytes"`
	VsockConnections int64  `json:"vsock_connections"`
}

// VCPUCounters are one vCPU's.
type VCPUCounters struct {
	ID         int     `json:"id"`
	Exits      uint64  `json:"exits"`
	CPUSeconds float64 `json:"cpu_seconds"`
}

// StateRequest is PUT /vm/state's body.
type StateRequest struct {
	// State is what the VM should become: "paused" (the vCPUs held),
	// "running" (resumed), or "stopped": the guest asked to power off
	// (through its agent, when it has one), and the VM stopped after
	// TimeoutMS if it has not by then; with Force, stopped at once.
	State     string `json:"state"`
	Force     bool   `json:"force,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// SnapshotRequest is PUT /vm/snapshot's body: save the VM into Path, an
// absolute path that must not exist (or hold a snapshot, with Overwrite),
// then go on, or end the VM with Stop.
type SnapshotRequest struct {
	Path      string `json:"path"`
	Stop      bool   `json:"stop,omitempty"`
	Overwrite bool   `json:"overwrite,omitempty"`
	// Diff saves only the memory pages written since the VM's previous
	// snapshot (or its restore), against that snapshot; the VM must run
	// with dirty page tracking (run --track-dirty-pages).
	Diff bool `json:"diff,omitempty"`
}

// The states a StateRequest may ask for.
const (
	Paused  = "paused"
	Running = "running"
	Stopped = "stopped"
)

// Errors a Backend returns for a request it refuses.
var (
	// ErrConflict: the VM cannot make that change now (pausing a VM that
	// is stopping, say): 409.
	ErrConflict = errors.New("conflict")
	// ErrBadRequest: the request makes no sense: 400.
	ErrBadRequest = errors.New("bad request")
)

// Backend is the VM behind the API. Its methods are called from the
// server's goroutines, concurrently.
type Backend interface {
	Info() VMInfo
	// SetState carries out req; for "stopped" it returns once the stop
	// has begun, not when the VM has ended.
	SetState(ctx context.Context, req StateRequest) error
	// Snapshot carries out req and returns once the snapshot is written.
	Snapshot(ctx context.Context, req SnapshotRequest) error
	WriteMetrics(w io.Writer) error
}

// Server serves a Backend on a Unix socket.
//
// Owner: the VM's process; Serve starts net/http's accept goroutine (one
// goroutine per connection under it); Close waits for the handlers and
// removes the socket.
type Server struct {
	path   string
	srv    *http.Server
	served chan struct{}
}

// writeTimeout bounds writing a reply, but for a snapshot's (a variable,
// for tests).
var writeTimeout = time.Minute

// Serve creates the socket at path (0600; a stale socket is replaced) and
// serves b on it.
func Serve(path string, b Backend, log logrus.FieldLogger) (*Server, error) {
	ln, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/vm", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			fail(w, http.StatusMethodNotAllowed, "GET /vm only", "GET, HEAD")
			return
		}
		reply(w, http.StatusOK, b.Info())
	})
	mux.HandleFunc("/vm/state", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			fail(w, http.StatusMethodNotAllowed, "PUT /vm/state only", "PUT")
			return
		}
		var req StateRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			fail(w, http.StatusBadRequest, "body: "+err.Error(), "")
			return
		}
		switch req.State {
		case Paused, Running, Stopped:
		default:
			fail(w, http.StatusBadRequest, fmt.Sprintf("state %q: want %s, %s or %s", req.State, Paused, Running, Stopped), "")
			return
		}
		if req.TimeoutMS < 0 {
			fail(w, http.StatusBadRequest, "timeout_ms must not be negative", "")
			return
		}
		if err := b.SetState(r.Context(), req); err != nil {
			failBackend(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/vm/snapshot", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut {
			fail(w, http.StatusMethodNotAllowed, "PUT /vm/snapshot only", "PUT")
			return
		}
		var req SnapshotRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, 8192))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			fail(w, http.StatusBadRequest, "body: "+err.Error(), "")
			return
		}
		if !filepath.IsAbs(req.Path) || filepath.Clean(req.Path) != req.Path || req.Path == "/" {
			fail(w, http.StatusBadRequest, fmt.Sprintf("path %q: want a clean absolute path", req.Path), "")
			return
		}
		// A snapshot takes as long as the memory takes to write: the
		// server's WriteTimeout would cut the reply after the snapshot was
		// made (and, with Stop, after the VM ended). The request is read
		// by now, so only the write deadline goes; a slow client is still
		// bounded by ReadHeaderTimeout and ReadTimeout.
		if err := http.NewResponseController(w).SetWriteDeadline(time.Time{}); err != nil {
			fail(w, http.StatusInternalServerError, "clear the write deadline: "+err.Error(), "")
			return
		}
		if err := b.Snapshot(r.Context(), req); err != nil {
			failBackend(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			fail(w, http.StatusMethodNotAllowed, "GET /metrics only", "GET, HEAD")
			return
		}
		w.Header().Set("Content-Type", promtext.ContentType)
		_ = b.WriteMetrics(w)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, "not found: the API has /vm, /vm/state, /vm/snapshot and /metrics", "")
	})
	s := &Server{path: path, served: make(chan struct{}),
		srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: writeTimeout, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}}
	go func() {
		defer close(s.served)
		if err := s.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).Error("control API stopped")
		}
	}()
	return s, nil
}

// Close stops serving, waits up to five seconds for the requests in flight,
// then closes the rest, and removes the socket.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.srv.Close()
	}
	<-s.served
	if rerr := os.Remove(s.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

type apiError struct {
	Error string `json:"error"`
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// failBackend answers a Backend's refusal: 409 for ErrConflict, 400 for
// ErrBadRequest, 500 otherwise.
func failBackend(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	}
	fail(w, code, err.Error(), "")
}

func fail(w http.ResponseWriter, code int, msg, allow string) {
	if allow != "" {
		w.Header().Set("Allow", allow)
	}
	reply(w, code, apiError{msg})
}

// Client calls a VM's control API.
type Client struct {
	path string
	hc   *http.Client
}

// NewClient returns a client of the API at socket path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConns: 1,
	}
	return &Client{path: path, hc: &http.Client{Transport: tr}}
}

// Close drops the client's idle connection.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// do sends a request and decodes a JSON answer into out (nil: none
// expected), turning an error answer into an error.
func (c *Client) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://microvm"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("control API %s: %w", c.path, unwrapURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var e apiError
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return &StatusError{Code: resp.StatusCode, Msg: e.Error}
	}
	if out == nil {
		return nil
	}
	if w, ok := out.(io.Writer); ok {
		_, err := io.Copy(w, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// unwrapURL drops *url.Error's `Get "http://microvm/vm":` prefix, which
// names an address that does not exist.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// StatusError is an error answer of the API.
type StatusError struct {
	Code int
	Msg  string
}

func (e *StatusError) Error() string { return e.Msg }

// Info is GET /vm.
func (c *Client) Info(ctx context.Context) (VMInfo, error) {
	var v VMInfo
	err := c.do(ctx, http.MethodGet, "/vm", nil, &v)
	return v, err
}

// SetState is PUT /vm/state.
func (c *Client) SetState(ctx context.Context, req StateRequest) error {
	return c.do(ctx, http.MethodPut, "/vm/state", req, nil)
}

// Snapshot is PUT /vm/snapshot.
func (c *Client) Snapshot(ctx context.Context, req SnapshotRequest) error {
	return c.do(ctx, http.MethodPut, "/vm/snapshot", req, nil)
}

// Metrics is GET /metrics, written to w.
func (c *Client) Metrics(ctx context.Context, w io.Writer) error {
	return c.do(ctx, http.MethodGet, "/metrics", nil, w)
}
