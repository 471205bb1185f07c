package containerdshim

import (
	"context"
	"fmt"

	cgroupsv2 "github.com/containerd/cgroups/v2/stats"
	taskAPI "github.com/containerd/containerd/api/runtime/task/v2"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/microvm/microvm/guest/agentapi"
)

// Stats and Update reach the container's cgroup in the guest through the
// agent (ContainerStats, UpdateContainer).

// Stats reports the container's CPU, memory and pids from its cgroup in
// the guest (the agent's ContainerStats), as cgroup v2 metrics: what runc's
// shim reports on a cgroup v2 host, so CRI (crictl stats, kubelet's
// summary API) reads it unchanged. The memory is the guest's view: pages
// the container uses inside the VM, not the VM's host RSS.
func (s *Service) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	vm, err := s.vmOf(r.ID)
	if err != nil {
		return nil, err
	}
	st, err := vm.client.ContainerStats(ctx, &agentapi.ContainerStatsRequest{Id: r.ID})
	if err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("stats of %s: %w", r.ID, agentErr(err)))
	}
	any, err := typeurl.MarshalAny(metrics(st))
	if err != nil {
		return nil, errdefs.ToGRPC(err)
	}
	return &taskAPI.StatsResponse{Stats: protobuf.FromAny(any)}, nil
}

// Update sets the container's memory, pids and CPU limits on its cgroup in
// the guest (kubelet's UpdateContainerResources, crictl update). A request
// that asks for nothing the guest applies (block I/O only, say) is refused.
func (s *Service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*emptypb.Empty, error) {
	vm, err := s.vmOf(r.ID)
	if err != nil {
		return nil, err
	}
	v, err := typeurl.UnmarshalAny(r.Resources)
	if err != nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "update of %s: resources: %v", r.ID, err)
	}
	lr, ok := v.(*specs.LinuxResources)
	if !ok {
		return nil, errdefs.ToGRPCf(errdefs.ErrInvalidArgument, "update of %s: resources of type %T, want Linux resources", r.ID, v)
	}
	res := resources(lr)
	if res == nil {
		return nil, errdefs.ToGRPCf(errdefs.ErrNotImplemented, "update of %s: only memory, pids and CPU limits are applied in a microvm guest", r.ID)
	}
	if _, err := vm.client.UpdateContainer(ctx, &agentapi.UpdateContainerRequest{Id: r.ID, Resources: res}); err != nil {
		return nil, errdefs.ToGRPC(fmt.Errorf("update of %s: %w", r.ID, agentErr(err)))
	}
	return &emptypb.Empty{}, nil
}

// metrics converts the agent's counters to containerd's cgroup v2 metrics.
func metrics(st *agentapi.ContainerStatsResponse) *cgroupsv2.Metrics {
	m := st.MemoryStat
	return &cgroupsv2.Metrics{
		Pids: &cgroupsv2.PidsStat{Current: st.PidsCurrent},
		CPU: &cgroupsv2.CPUStat{UsageUsec: st.CpuUsageUsec, UserUsec: st.CpuUserUsec, SystemUsec: st.CpuSystemUsec,
			NrPeriods: st.CpuNrPeriods, NrThrottled: st.CpuNrThrottled, ThrottledUsec: st.CpuThrottledUsec},
		Memory: &cgroupsv2.MemoryStat{
			Usage: st.MemoryCurrentBytes, UsageLimit: st.MemoryMaxBytes,
			Anon: m["anon"], File: m["file"], KernelStack: m["kernel_stack"], Slab: m["slab"],
			Sock: m["sock"], Shmem: m["shmem"], FileMapped: m["file_mapped"], FileDirty: m["file_dirty"],
			InactiveAnon: m["inactive_anon"], ActiveAnon: m["active_anon"],
			InactiveFile: m["inactive_file"], ActiveFile: m["active_file"], Unevictable: m["unevictable"],
			Pgfault: m["pgfault"], Pgmajfault: m["pgmajfault"],
		},
	}
}

// agentErr maps an agent call's gRPC status to containerd's error kinds,
// keeping the agent's message.
func agentErr(err error) error {
	var kind error = errdefs.ErrUnknown
	switch status.Code(err) {
	case codes.NotFound:
		kind = errdefs.ErrNotFound
	case codes.FailedPrecondition:
		kind = errdefs.ErrFailedPrecondition
	case codes.InvalidArgument:
		kind = errdefs.ErrInvalidArgument
	case codes.Unavailable, codes.Canceled:
		kind = errdefs.ErrUnavailable
	}
	return fmt.Errorf("%w: %s", kind, status.Convert(err).Message())
}
