package microvm

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/microvm/microvm/devices/blk"
	"github.com/microvm/microvm/devices/rng"
	"github.com/microvm/microvm/devices/virtio9p"
	"github.com/microvm/microvm/internal/metricsrv"
	"github.com/microvm/microvm/internal/promtext"
	"github.com/microvm/microvm/internal/promtext/promtexttest"
	"github.com/microvm/microvm/internal/testing/testenv"
	"github.com/microvm/microvm/internal/vmm"
	"github.com/microvm/microvm/kvm"
	"github.com/microvm/microvm/virtio"
	"github.com/microvm/microvm/vsock"
)

var update = flag.Bool("update", false, "rewrite testdata/metrics.golden")

// fill sets every integer field of the struct at p (recursively, arrays
// included) to distinct values from next, and returns them by path.
func fill(p any, next *uint64) map[string]uint64 {
	got := map[string]uint64{}
	var walk func(v reflect.Value, path string)
	walk = func(v reflect.Value, path string) {
		switch v.Kind() {
		case reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				if v.Type().Field(i).IsExported() {
					walk(v.Field(i), path+"."+v.Type().Field(i).Name)
				}
			}
		case reflect.Array:
			for i := 0; i < v.Len(); i++ {
				walk(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
			}
		case reflect.Uint64, reflect.Int64:
			*next += 7
			if v.Kind() == reflect.Uint64 {
				v.SetUint(*next)
			} else {
				v.SetInt(int64(*next))
			}
			got[path] = *next
		}
	}
	walk(reflect.ValueOf(p).Elem(), reflect.TypeOf(p).Elem().Name())
	return got
}

// sampleMetrics is a machine's worth of metrics with every device type,
// each counter a distinct value.
func sampleMetrics() (Metrics, map[string]uint64) {
	var next uint64 = 1000
	fields := map[string]uint64{}
	add := func(m map[string]uint64, prefix string) {
		for k, v := range m {
			fields[prefix+k] = v
		}
	}
	m := Metrics{
		VCPUs: []VCPUMetrics{
			{ID: 0, CPUTime: 1500 * time.Millisecond, Exits: map[kvm.ExitReason]uint64{kvm.ExitIO: 12, kvm.ExitMMIO: 3, kvm.ExitIntr: 2}},
			{ID: 1, CPUTime: 250 * time.Microsecond, Exits: map[kvm.ExitReason]uint64{kvm.ExitHLT: 1, kvm.ExitIOAPICEOI: 4, vmm.ExitSlots - 1: 5}},
		},
		PIOUnclaimed: 9, MMIOUnclaimed: 8, PVWaits: 7, PVWakeups: 6,
		DeviceMetrics: DeviceMetrics{
			Vsock:  &VsockMetrics{Name: "vsock0", Dgram: true},
			RNG:    &RNGMetrics{Name: "rng0"},
			Disks:  []DiskMetrics{{Name: "vda", Path: "/img/a"}, {Name: "vdb", Path: "/img/b"}},
			Nets:   []NetMetrics{{Name: "eth0", TAP: "tap0"}},
			Shares: []ShareMetrics{{Name: "work", Path: "/srv/work"}},
		},
	}
	add(fill(&m.Vsock.Stats, &next), "vsock0/")
	add(fill(&m.Vsock.Transport, &next), "vsock0/")
	add(fill(&m.RNG.Stats, &next), "rng0/")
	add(fill(&m.RNG.Transport, &next), "rng0/")
	for i := range m.Disks {
		add(fill(&m.Disks[i].Stats, &next), m.Disks[i].Name+"/")
		add(fill(&m.Disks[i].Transport, &next), m.Disks[i].Name+"/")
	}
	add(fill(&m.Nets[0].Stats, &next), "eth0/")
	add(fill(&m.Nets[0].Transport, &next), "eth0/")
	add(fill(&m.Shares[0].Stats, &next), "work/")
	add(fill(&m.Shares[0].Transport, &next), "work/")
	// A device counts only the guest-error kinds it reports.
	reportedOnly(fields, "vsock0/Stats.GuestErrorsByKind", &m.Vsock.GuestErrorsByKind, vsock.GuestErrorKinds)
	reportedOnly(fields, "rng0/Stats.GuestErrorsByKind", &m.RNG.GuestErrorsByKind, rng.GuestErrorKinds)
	for i := range m.Disks {
		reportedOnly(fields, m.Disks[i].Name+"/Stats.GuestErrorsByKind", &m.Disks[i].GuestErrorsByKind, blk.GuestErrorKinds)
	}
	reportedOnly(fields, "work/Stats.GuestErrorsByKind", &m.Shares[0].GuestErrorsByKind, virtio9p.GuestErrorKinds)
	for name, t := range map[string]*virtio.TransportStats{"vsock0": &m.Vsock.Transport, "rng0": &m.RNG.Transport,
		"vda": &m.Disks[0].Transport, "vdb": &m.Disks[1].Transport, "eth0": &m.Nets[0].Transport, "work": &m.Shares[0].Transport} {
		reportedOnly(fields, name+"/TransportStats.GuestErrors", &t.GuestErrors, virtio.TransportGuestErrorKinds)
	}
	// GuestErrors is the sum of the kinds in a real snapshot.
	m.Vsock.GuestErrors = sum(m.Vsock.GuestErrorsByKind[:])
	delete(fields, "vsock0/Stats.GuestErrors")
	m.RNG.GuestErrors = sum(m.RNG.GuestErrorsByKind[:])
	delete(fields, "rng0/Stats.GuestErrors")
	for i := range m.Disks {
		m.Disks[i].GuestErrors = sum(m.Disks[i].GuestErrorsByKind[:])
		delete(fields, m.Disks[i].Name+"/Stats.GuestErrors")
	}
	m.Shares[0].GuestErrors = sum(m.Shares[0].GuestErrorsByKind[:])
	delete(fields, "work/Stats.GuestErrors")
	return m, fields
}

// reportedOnly zeroes the guest-error kinds a device (or the transport)
// does not report, and drops them from fields: the exposition has no
// series for them.
func reportedOnly(fields map[string]uint64, path string, c *virtio.GuestErrorCounts, kinds []virtio.GuestErrorKind) {
	for k := range c {
		if !slices.Contains(kinds, virtio.GuestErrorKind(k)) {
			c[k] = 0
			delete(fields, fmt.Sprintf("%s[%d]", path, k))
		}
	}
}

func sum(ns []uint64) uint64 {
	var t uint64
	for _, n := range ns {
		t += n
	}
	return t
}

// notExported says which device counters the exposition leaves out on
// purpose: the devices' own interrupt counts (vsock's counts RX only), as
// the transport counts every interrupt (microvm_virtio_interrupts_total).
// The GuestErrors of vsock, blk and rng, the sums of their kinds, are left
// out of the fields.
func notExported(path string) bool { return strings.HasSuffix(path, "/Stats.Interrupts") }

// checkGolden compares an exposition with testdata/name (-update rewrites
// the file), parses it, and counts how often each sample value appears:
// the sample metrics give every counter a value of its own, so a count
// other than one shows a counter left out or shown twice.
func checkGolden(t *testing.T, name string, got []byte) (promtexttest.Exposition, map[uint64]int) {
	t.Helper()
	golden := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("exposition (-%s +got):\n%s", golden, diff)
	}
	e := promtexttest.Parse(t, string(got))
	seen := map[uint64]int{}
	for _, v := range e.Values {
		seen[uint64(v)]++
	}
	return e, seen
}

// TestPrometheusGolden: the exposition of a machine with every device type
// is exactly testdata/metrics.golden (go test -run TestPrometheusGolden
// -update rewrites it), well-formed, and shows every counter the devices
// keep, each once: a field left out, or shown in another's place, fails.
func TestPrometheusGolden(t *testing.T) {
	m, fields := sampleMetrics()
	var b bytes.Buffer
	if err := m.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	e, seen := checkGolden(t, "metrics.golden", b.Bytes())
	for path, v := range fields {
		if notExported(path) {
			if seen[v] != 0 {
				t.Errorf("%s (%d) is exported, but notExported says it is not", path, v)
			}
			continue
		}
		if seen[v] != 1 {
			t.Errorf("%s (%d) appears %d times in the exposition, want once", path, v, seen[v])
		}
	}
	// Spot checks of the mapping, by name.
	for series, want := range map[string]uint64{
		`microvm_vsock_tx_bytes_total{device="vsock0"}`:                                m.Vsock.TxBytes,
		`microvm_vsock_rx_bytes_total{device="vsock0"}`:                                m.Vsock.RxBytes,
		`microvm_vsock_connections_refused_total{device="vsock0"}`:                     m.Vsock.ConnsRefused,
		`microvm_vsock_guest_errors_total{device="vsock0",kind="credit"}`:              m.Vsock.GuestErrorsByKind[virtio.GuestErrCredit],
		`microvm_virtio_kicks_total{device="vsock0",queue="tx"}`:                       m.Vsock.TxKicks,
		`microvm_virtio_interrupts_total{device="vda",kind="used_buffer"}`:             m.Disks[0].Transport.UsedBufferInterrupts,
		`microvm_virtio_guest_errors_total{device="eth0",kind="status"}`:               m.Nets[0].Transport.GuestErrors[virtio.GuestErrStatus],
		`microvm_virtio_queue_full_total{device="eth0",queue="rx"}`:                    m.Nets[0].RxStalls,
		`microvm_blk_requests_total{device="vdb",op="write_zeroes"}`:                   m.Disks[1].WriteZeroes,
		`microvm_blk_guest_errors_total{device="vdb",kind="layout"}`:                   m.Disks[1].GuestErrorsByKind[virtio.GuestErrLayout],
		`microvm_rng_guest_errors_total{device="rng0",kind="queue"}`:                   m.RNG.GuestErrorsByKind[virtio.GuestErrQueue],
		`microvm_net_rx_bytes_total{device="eth0"}`:                                    m.Nets[0].RxBytes,
		`microvm_rng_bytes_total{device="rng0"}`:                                       m.RNG.Bytes,
		`microvm_vcpu_exits_total{vcpu="1",reason="other"}`:                            5,
		`microvm_vcpu_exits_total{vcpu="1",reason="ioapic_eoi"}`:                       4,
		`microvm_vcpu_exits_total{vcpu="1",reason="io"}`:                               0,
		`microvm_bus_unclaimed_accesses_total{bus="mmio"}`:                             8,
		`microvm_vsock_seqpacket_messages_total{device="vsock0",direction="to_guest"}`: m.Vsock.SeqToGuest,
	} {
		got, ok := e.Values[series]
		if !ok || uint64(got) != want {
			t.Errorf("%s = %v (present %v), want %d", series, got, ok, want)
		}
	}
	if got := e.Get(t, `microvm_vcpu_cpu_seconds_total{vcpu="0"}`); got != 1.5 {
		t.Errorf("vCPU 0 CPU seconds %v, want 1.5", got)
	}
}

// TestPrometheusVhostUser: vhost-user-vsock's exposition is exactly
// testdata/metrics-vhost-user.golden (-update rewrites it), well-formed,
// shows every counter of its device and back-end once, and no family of
// the virtio-mmio transport it does not have.
func TestPrometheusVhostUser(t *testing.T) {
	var next uint64 = 5000
	m := VhostUserVsockMetrics{Vsock: VsockMetrics{Name: "vsock0", Dgram: true}}
	fields := fill(&m, &next)
	reportedOnly(fields, "VhostUserVsockMetrics.Vsock.Stats.GuestErrorsByKind", &m.Vsock.GuestErrorsByKind, vsock.GuestErrorKinds)
	reportedOnly(fields, "VhostUserVsockMetrics.Vsock.Transport.GuestErrors", &m.Vsock.Transport.GuestErrors, virtio.TransportGuestErrorKinds)
	m.Vsock.GuestErrors = 0
	for _, n := range m.Vsock.GuestErrorsByKind {
		m.Vsock.GuestErrors += n
	}
	delete(fields, "VhostUserVsockMetrics.Vsock.Stats.GuestErrors")
	var b bytes.Buffer
	if err := m.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	e, seen := checkGolden(t, "metrics-vhost-user.golden", b.Bytes())
	for path, v := range fields {
		want := 1
		if strings.HasPrefix(path, "VhostUserVsockMetrics.Vsock.Transport.") || notExported("/"+strings.TrimPrefix(path, "VhostUserVsockMetrics.Vsock.")) {
			want = 0 // no virtio-mmio transport; RX interrupts only
		}
		if seen[v] != want {
			t.Errorf("%s (%d) appears %d times in the exposition, want %d", path, v, seen[v], want)
		}
	}
	for _, f := range e.Order {
		if strings.HasPrefix(f, "microvm_vcpu") || f == "microvm_virtio_interrupts_total" || f == "microvm_virtio_guest_errors_total" {
			t.Errorf("family %s in a vhost-user exposition", f)
		}
	}
	for series, want := range map[string]uint64{
		`microvm_vsock_tx_bytes_total{device="vsock0"}`:          m.Vsock.TxBytes,
		`microvm_virtio_kicks_total{device="vsock0",queue="tx"}`: m.Vsock.TxKicks,
		`microvm_vhost_user_frontends_total`:                     m.Frontends,
		`microvm_vhost_user_frontend_errors_total`:               m.FrontendErrors,
		`microvm_vhost_user_device_failures_total`:               m.DeviceFailures,
	} {
		if got := e.Get(t, series); uint64(got) != want {
			t.Errorf("%s = %v, want %d", series, got, want)
		}
	}
}

// TestPrometheusMinimal: a machine without devices writes the VM families
// only, and no family without samples.
func TestPrometheusMinimal(t *testing.T) {
	m := Metrics{VCPUs: []VCPUMetrics{{ID: 0, Exits: map[kvm.ExitReason]uint64{}}}}
	var b bytes.Buffer
	if err := m.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	e := promtexttest.Parse(t, b.String())
	want := []string{"microvm_vcpu_exits_total", "microvm_vcpu_cpu_seconds_total", "microvm_bus_unclaimed_accesses_total",
		"microvm_pvwait_waits_total", "microvm_pvwait_wakeups_total"}
	if diff := cmp.Diff(want, e.Order); diff != "" {
		t.Errorf("families (-want +got):\n%s", diff)
	}
	if got := e.Get(t, `microvm_vcpu_exits_total{vcpu="0",reason="hlt"}`); got != 0 {
		t.Errorf("hlt exits %v, want a zero sample", got)
	}
}

// TestParseExpositionRejects: the checker the KVM tests rely on fails on
// malformed text.
func TestParseExpositionRejects(t *testing.T) {
	for name, text := range map[string]string{
		"no TYPE":          "# HELP a_total x\na_total 1\n",
		"sample elsewhere": "# HELP a_total x\n# TYPE a_total counter\nb_total 1\n",
		"bad escape":       "# HELP a_total x\n# TYPE a_total counter\na_total{l=\"\\t\"} 1\n",
		"unquoted":         "# HELP a_total x\n# TYPE a_total counter\na_total{l=x} 1\n",
		"counter suffix":   "# HELP a x\n# TYPE a counter\na 1\n",
		"bad value":        "# HELP a_total x\n# TYPE a_total counter\na_total one\n",
		"no newline":       "# HELP a_total x\n# TYPE a_total counter\na_total 1",
		"empty family":     "# HELP a_total x\n# TYPE a_total counter\n# HELP b_total x\n# TYPE b_total counter\nb_total 1\n",
		"duplicate series": "# HELP a_total x\n# TYPE a_total counter\na_total 1\na_total 2\n",
	} {
		t.Run(name, func(t *testing.T) {
			ft := &testenv.FakeTB{}
			func() {
				defer func() { _ = recover() }()
				promtexttest.Parse(ft, text)
			}()
			if !ft.Failed() {
				t.Errorf("accepted %q", text)
			}
		})
	}
}

// bareMachine is a Machine with the parts Metrics reads and nothing else:
// no KVM.
func bareMachine() *Machine {
	return &Machine{vm: vmm.NewCountersOnly(1)}
}

// quietLog is a logger that writes nowhere.
func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// TestMetricsServer: the server answers GET and HEAD at /metrics with the
// format's content type, refuses other methods and paths, and close waits
// for a request in flight, then removes the socket.
func TestMetricsServer(t *testing.T) {
	m := bareMachine()
	path := filepath.Join(testenv.ShortDir(t), "m.sock")
	entered, release := make(chan struct{}), make(chan struct{})
	var slow atomic.Bool
	s, err := metricsrv.Start(path, func(w io.Writer) error {
		if slow.Load() {
			close(entered)
			<-release
		}
		return m.writeMetrics(w)
	}, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.Close()
		}
	})
	if fi, err := os.Stat(path); err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %s: %v, %v; want a socket with mode 0600", path, fi, err)
	}
	text, resp := promtexttest.Scrape(t, path)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != promtext.ContentType {
		t.Errorf("GET: %s, Content-Type %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	promtexttest.Parse(t, text)

	c := testenv.UnixClient(path)
	defer c.CloseIdleConnections()
	for _, tc := range []struct {
		method, path string
		status       int
		body         bool
	}{
		{http.MethodHead, "/metrics", http.StatusOK, false},
		{http.MethodPost, "/metrics", http.StatusMethodNotAllowed, true},
		{http.MethodGet, "/", http.StatusNotFound, true},
		{http.MethodGet, "/metricsx", http.StatusNotFound, true},
	} {
		req, _ := http.NewRequest(tc.method, "http://microvm"+tc.path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || (len(b) > 0) != tc.body {
			t.Errorf("%s %s: %s with %d body bytes, want %d", tc.method, tc.path, resp.Status, len(b), tc.status)
		}
	}

	// A request in flight holds close until it finishes.
	slow.Store(true)
	got := make(chan error, 1)
	go func() {
		resp, err := c.Get("http://microvm/metrics")
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		got <- err
	}()
	<-entered
	closeDone := make(chan error, 1)
	go func() { closeDone <- s.Close() }()
	closed = true
	select {
	case err := <-closeDone:
		t.Fatalf("close returned (%v) while a handler was still running", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-closeDone; err != nil {
		t.Errorf("close: %v", err)
	}
	<-got // the client's result does not matter: its connection was closed
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after close: %v", err)
	}
	if _, err := net.Dial("unix", path); err == nil {
		t.Error("dial after close succeeded")
	}
}

// TestMetricsSocketErrors: paths the server cannot use are refused with a
// message naming the path and what is wrong, and nothing is left behind.
func TestMetricsSocketErrors(t *testing.T) {
	dir := testenv.ShortDir(t)
	file := filepath.Join(dir, "regular")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, tc := range []struct {
		name, path, want string
	}{
		{"missing directory", filepath.Join(dir, "nope", "m.sock"), "directory " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{"directory is a file", filepath.Join(file, "m.sock"), file + " is not a directory"},
		{"a regular file", file, "exists and is not a socket"},
		{"a live socket", live, "in use by another process"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := metricsrv.Start(tc.path, bareMachine().writeMetrics, quietLog())
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "metrics socket") {
				t.Errorf("metricsrv.Start(%s): %v, want an error containing %q", tc.path, err, tc.want)
			}
		})
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("%d entries left in %s, want the 2 the test made", len(entries), dir)
	}
	long := "/tmp/" + strings.Repeat("x", maxSunPath)
	_, err = (&Config{Kernel: "k", MetricsSocket: long}).withDefaults()
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "metrics socket path") {
		t.Errorf("a %d-byte path: %v, want an ErrConfig naming the metrics socket", len(long), err)
	}
	if _, err := (&Config{Kernel: "k", MetricsSocket: "/tmp/" + strings.Repeat("x", maxSunPath-5)}).withDefaults(); err != nil {
		t.Errorf("a %d-byte path: %v", maxSunPath, err)
	}
}

// TestMetricsDocs: docs/metrics.md's tables list every family microvm
// writes, and no other.
func TestMetricsDocs(t *testing.T) {
	m, _ := sampleMetrics()
	var b bytes.Buffer
	if err := m.WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	e := promtexttest.Parse(t, b.String())
	b.Reset()
	if err := (VhostUserVsockMetrics{Vsock: VsockMetrics{Name: "vsock0", Dgram: true}}).WritePrometheus(&b); err != nil {
		t.Fatal(err)
	}
	for _, f := range promtexttest.Parse(t, b.String()).Order {
		if _, ok := e.Types[f]; !ok {
			e.Order = append(e.Order, f)
			e.Types[f] = ""
		}
	}
	doc, err := os.ReadFile(filepath.Join("docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(doc))
	name := regexp.MustCompile("^\\| `(microvm_[a-z0-9_]+)`")
	for sc.Scan() {
		if m := name.FindStringSubmatch(sc.Text()); m != nil {
			documented[m[1]] = true
		}
	}
	for _, f := range e.Order {
		if !documented[f] {
			t.Errorf("family %s is not in docs/metrics.md's tables", f)
		}
		delete(documented, f)
	}
	for f := range documented {
		t.Errorf("docs/metrics.md lists %s, which microvm does not write", f)
	}
}
