package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// containerControllers are the cgroup v2 controllers the agent enables for
// containers where the guest kernel has them (cpu.stat counts without any).
const containerControllers = "+cpu +memory +pids"

// cgroupDir returns the cgroup of container id, or "" with cgroups off.
func (s *Server) cgroupDir(id string) string {
	if s.opts.CgroupRoot == "" {
		return ""
	}
	return filepath.Join(s.opts.CgroupRoot, id)
}

// containerCgroup makes (create) or opens the cgroup of container id and
// returns a descriptor of it for clone3's CLONE_INTO_CGROUP, or nil with
// cgroups off. The controllers are enabled once per agent, each on its own,
// so a guest kernel without one still gets the others.
func (s *Server) containerCgroup(id string, create bool) (*os.File, error) {
	dir := s.cgroupDir(id)
	if dir == "" {
		return nil, nil
	}
	if create {
		s.cgroupOnce.Do(func() {
			for _, c := range strings.Fields(containerControllers) {
				os.WriteFile(filepath.Join(s.opts.CgroupRoot, "cgroup.subtree_control"), []byte(c), 0)
			}
		})
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	return os.NewFile(uintptr(fd), dir), nil
}

// removeCgroup removes a container's cgroup once its last process is gone:
// the kernel kills the rest of a PID namespace when its init exits, which
// takes a moment, so rmdir's EBUSY is retried for a while. With kill (a
// container in a PID namespace it does not own) the processes left are
// killed first through cgroup.kill.
func removeCgroup(dir string, kill bool) {
	if dir == "" {
		return
	}
	if kill {
		writeCgroupFile(filepath.Join(dir, "cgroup.kill"), "1")
	}
	for i := 0; i < 100; i++ {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) || !errors.Is(err, unix.EBUSY) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ContainerStats reads a running container's cgroup; see agent.proto.
func (s *Server) ContainerStats(_ context.Context, r *agentapi.ContainerStatsRequest) (*agentapi.ContainerStatsResponse, error) {
	if err := s.ctrs.checkRunning("stats", r.Id); err != nil {
		return nil, err
	}
	dir := s.cgroupDir(r.Id)
	if dir == "" {
		return nil, status.Error(codes.FailedPrecondition, "agent: stats: this agent runs containers without cgroups")
	}
	cpu, err := readKeyed(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "agent: stats: %v", err)
	}
	resp := &agentapi.ContainerStatsResponse{
		CpuUsageUsec: cpu["usage_usec"], CpuUserUsec: cpu["user_usec"], CpuSystemUsec: cpu["system_usec"],
		MemoryCurrentBytes: readUint(filepath.Join(dir, "memory.current")),
		MemoryMaxBytes:     readUint(filepath.Join(dir, "memory.max")),
		PidsCurrent:        readUint(filepath.Join(dir, "pids.current")),
		CpuNrPeriods:       cpu["nr_periods"], CpuNrThrottled: cpu["nr_throttled"], CpuThrottledUsec: cpu["throttled_usec"],
	}
	if m, err := readKeyed(filepath.Join(dir, "memory.stat")); err == nil {
		resp.MemoryStat = m
	}
	return resp, nil
}

// readKeyed reads a cgroup file of "key value" lines.
func readKeyed(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
			m[k] = n
		}
	}
	return m, sc.Err()
}

// readUint reads a cgroup file of one number; 0 when it is missing (no
// such controller) or "max".
func readUint(path string) uint64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// UpdateContainer writes a running container's limits; see agent.proto.
func (s *Server) UpdateContainer(_ context.Context, r *agentapi.UpdateContainerRequest) (*agentapi.UpdateContainerResponse, error) {
	if err := s.ctrs.checkRunning("update", r.Id); err != nil {
		return nil, err
	}
	if err := s.setResources(r.Id, r.Resources); err != nil {
		return nil, err
	}
	return &agentapi.UpdateContainerResponse{}, nil
}

// setResources writes r to container id's cgroup; nil r writes nothing.
func (s *Server) setResources(id string, r *agentapi.Resources) error {
	if r == nil {
		return nil
	}
	dir := s.cgroupDir(id)
	if dir == "" {
		return status.Error(codes.FailedPrecondition, "agent: resources: this agent runs containers without cgroups")
	}
	for _, l := range cgroupLimits(r) {
		err := writeCgroupFile(filepath.Join(dir, l.file), l.value)
		if errors.Is(err, os.ErrNotExist) {
			return status.Errorf(codes.FailedPrecondition, "agent: resources: %s: the guest kernel lacks this cgroup controller", l.file)
		}
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "agent: resources: %s = %s: %v", l.file, l.value, err)
		}
	}
	return nil
}

// cgroupLimit is one cgroup v2 file and what setResources writes to it.
type cgroupLimit struct{ file, value string }

// cgroupLimits turns r into cgroup v2 file contents, every limit written
// each time (0 in r is "no limit"), so an update replaces all of them.
// The CPU files come only when r sets a CPU limit, so a guest kernel
// without the cpu controller still takes memory and pids limits.
func cgroupLimits(r *agentapi.Resources) []cgroupLimit {
	orMax := func(v uint64) string {
		if v == 0 {
			return "max"
		}
		return strconv.FormatUint(v, 10)
	}
	ls := []cgroupLimit{{"memory.max", orMax(r.MemoryMaxBytes)}, {"pids.max", orMax(r.PidsMax)}}
	if r.CpuQuotaUsec > 0 || r.CpuPeriodUsec > 0 || r.CpuWeight > 0 {
		period := r.CpuPeriodUsec
		if period == 0 {
			period = 100000
		}
		weight := r.CpuWeight
		if weight == 0 {
			weight = 100
		}
		ls = append(ls, cgroupLimit{"cpu.max", orMax(r.CpuQuotaUsec) + " " + strconv.FormatUint(period, 10)},
			cgroupLimit{"cpu.weight", strconv.FormatUint(weight, 10)})
	}
	return ls
}

// writeCgroupFile writes an existing cgroup file (without O_CREAT: a file
// of a missing controller is then ENOENT, not EACCES).
func writeCgroupFile(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
