package agent

import (
	"context"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// Version is the agent version Info reports unless Options.Version is set.
const Version = "0.1.0"

// DefaultMaxExecs is the default bound on concurrent Exec calls.
const DefaultMaxExecs = 256

// Options configure a Server. Callbacks are called from gRPC handler
// goroutines and must not block for long.
type Options struct {
	// Shutdown is called, at most once, by the first Shutdown call, before
	// that call returns; it should start powering off (or exiting) without
	// waiting for it, e.g. in a goroutine that first calls GracefulStop so
	// that the reply still reaches the client. Nil refuses Shutdown with
	// codes.Unimplemented.
	Shutdown func()
	// Idle, when set, is called each time the number of running Exec
	// calls drops to zero.
	Idle func()
	// Reaper, when set, waits for the processes Exec starts (PID 1 mode,
	// where every orphan must be reaped too). When nil each process is
	// waited for on its own, leaving other children of the process alone.
	Reaper *Reaper
	// MaxExecs bounds concurrent Exec calls (DefaultMaxExecs when 0).
	MaxExecs int
	// Version overrides the version Info reports.
	Version string
	// CgroupRoot, when set, is a cgroup v2 directory below which each
	// container gets a cgroup of its own (ContainerStats reads it).
	CgroupRoot string
	// Self is the agent's own executable, run as ContainerInitArg0 to set
	// up container processes; "/proc/self/exe" when empty.
	Self string
	// Logf, when set, receives one line per started and ended process.
	Logf func(format string, args ...any)
}

// Server is the agent's gRPC service: agentapi.AgentServer plus the
// standard health service. Its methods are called by gRPC on a goroutine
// per call; see Exec for the goroutines a call owns.
type Server struct {
	agentapi.UnimplementedAgentServer

	opts     Options
	starter  starter
	maxExecs int
	grpc     *grpc.Server
	health   *health.Server

	mu      sync.Mutex
	running int // guarded by mu: Exec calls between enterExec and leaveExec

	ctrs       containers // the running containers (Exec with ExecStart.container)
	cgroupOnce sync.Once  // enables the containers' cgroup controllers

	shutdownOnce sync.Once
}

// New returns a Server; Serve starts it.
func New(opts Options) *Server {
	s := &Server{opts: opts, starter: directStarter{}, maxExecs: opts.MaxExecs}
	if opts.Reaper != nil {
		s.starter = opts.Reaper
	}
	if s.maxExecs <= 0 {
		s.maxExecs = DefaultMaxExecs
	}
	if s.opts.Version == "" {
		s.opts.Version = Version
	}
	s.grpc = grpc.NewServer()
	agentapi.RegisterAgentServer(s.grpc, s)
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(agentapi.Agent_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	return s
}

// Serve accepts connections on ln until Stop or GracefulStop; it returns
// nil after those and the listener's error otherwise. It may be called for
// several listeners.
func (s *Server) Serve(ln net.Listener) error {
	if err := s.grpc.Serve(ln); err != nil {
		return fmt.Errorf("agent: serve %v: %w", ln.Addr(), err)
	}
	return nil
}

// GracefulStop stops accepting calls and waits for running ones to end.
func (s *Server) GracefulStop() {
	s.health.Shutdown()
	s.grpc.GracefulStop()
}

// Stop ends every call at once: each running Exec kills its process group
// (its stream context ends), as when a client goes away.
func (s *Server) Stop() {
	s.health.Shutdown()
	s.grpc.Stop()
}

// Shutdown calls Options.Shutdown once; see Options.
func (s *Server) Shutdown(context.Context, *agentapi.ShutdownRequest) (*agentapi.ShutdownResponse, error) {
	if s.opts.Shutdown == nil {
		return nil, status.Error(codes.Unimplemented, "agent: shutdown: not supported by this host")
	}
	s.shutdownOnce.Do(s.opts.Shutdown)
	return &agentapi.ShutdownResponse{}, nil
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf != nil {
		s.opts.Logf(format, args...)
	}
}
