package containerdshim

import (
	"testing"

	cgroupsv2 "github.com/containerd/cgroups/v2/stats"
	"github.com/containerd/typeurl/v2"

	"github.com/microvm/microvm/guest/agentapi"
)

// The metrics go out as the type URL CRI decodes for cgroup v2 hosts, and
// the agent's counters land in the fields CRI reads (usage, inactive_file
// for the working set, usage_usec).
func TestMetrics(t *testing.T) {
	st := &agentapi.ContainerStatsResponse{
		CpuUsageUsec: 1500, CpuUserUsec: 1000, CpuSystemUsec: 500,
		CpuNrPeriods: 10, CpuNrThrottled: 4, CpuThrottledUsec: 900,
		MemoryCurrentBytes: 8 << 20, PidsCurrent: 3,
		MemoryStat: map[string]uint64{"anon": 4 << 20, "inactive_file": 1 << 20},
	}
	a, err := typeurl.MarshalAny(metrics(st))
	if err != nil {
		t.Fatal(err)
	}
	if a.GetTypeUrl() != "io.containerd.cgroups.v2.Metrics" {
		t.Errorf("type URL %q", a.GetTypeUrl())
	}
	v, err := typeurl.UnmarshalAny(a)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := v.(*cgroupsv2.Metrics)
	if !ok {
		t.Fatalf("decoded %T", v)
	}
	if m.CPU.UsageUsec != 1500 || m.CPU.UserUsec != 1000 || m.Memory.Usage != 8<<20 ||
		m.Memory.Anon != 4<<20 || m.Memory.InactiveFile != 1<<20 || m.Pids.Current != 3 ||
		m.CPU.NrPeriods != 10 || m.CPU.NrThrottled != 4 || m.CPU.ThrottledUsec != 900 {
		t.Errorf("metrics %v", m)
	}
}
