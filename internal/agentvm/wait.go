package agentvm

import (
	"context"
	"errors"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
)

// Port is the agent's vsock port.
const Port = agentapi.DefaultPort

// stoppingGrace bounds how long Wait waits for a stopping machine's Run to
// return, so that the caller can say how the guest ended.
const stoppingGrace = 10 * time.Second

// Wait connects to m's agent once it answers (agentapi.ConnectVM over
// Machine.WaitAgent), giving up when the VM ends (vmDone, which closes
// when m's Run has returned) or timeout passes. A VM that ended first
// gives "the VM ended before its agent answered"; a timeout gives
// WaitAgent's error, which names the vsock device's counters, each virtio
// device's status and where each vCPU stands: a guest that hung while
// booting shows how far it got.
func Wait(ctx context.Context, m *microvm.Machine, timeout time.Duration, vmDone <-chan struct{}) (*agentapi.Conn, error) {
	cc, err := agentapi.ConnectVM(ctx, m, Port, timeout)
	if err == nil {
		return cc, nil
	}
	if errors.Is(err, microvm.ErrStopped) {
		// The machine is stopping: Run returns in a moment, and the
		// caller reports how it ended.
		t := time.NewTimer(stoppingGrace)
		select {
		case <-vmDone:
		case <-t.C:
		}
		t.Stop()
	}
	select {
	case <-vmDone:
		return nil, errors.New("the VM ended before its agent answered")
	default:
	}
	return nil, err
}
