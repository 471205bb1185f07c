package agentvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/microvm/microvm"
	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/vsock"
)

// Port is the agent's vsock port.
const Port = agentapi.DefaultPort

// Wait connects to m's agent once it answers (before it listens the VMM
// refuses the CONNECT), giving up when the VM ends (vmDone closes) or
// timeout passes. A failure names the vsock device's counters: whether
// the guest's driver ever took a request, refused, or never answered.
func Wait(ctx context.Context, m *microvm.Machine, timeout time.Duration, vmDone <-chan struct{}) (*agentapi.Conn, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout,
		fmt.Errorf("the guest agent did not answer on vsock port %d within %v", Port, timeout))
	defer cancel()
	go func() {
		select {
		case <-vmDone:
			cancel()
		case <-ctx.Done():
		}
	}()
	cc, err := agentapi.Connect(ctx, func(ctx context.Context) (net.Conn, error) { return m.DialVsock(ctx, Port) })
	if errors.Is(err, microvm.ErrStopped) {
		// The machine is stopping: Run returns in a moment, and the
		// caller reports how it ended.
		select {
		case <-vmDone:
		case <-time.After(10 * time.Second):
		}
	}
	select {
	case <-vmDone:
		if err != nil {
			return nil, errors.New("the VM ended before its agent answered")
		}
	default:
	}
	if err != nil {
		return nil, fmt.Errorf("%w [%s]", err, vsockBrief(m.VsockStats()))
	}
	return cc, nil
}

// vsockBrief is the part of the vsock device's counters that tells a
// connection that was never answered from one the guest refused.
func vsockBrief(st vsock.Stats) string {
	return fmt.Sprintf("vsock device: %d connections opened, %d refused, %d open; %d packets from the guest, %d to it; "+
		"%d TX kicks, %d RX kicks, %d RX interrupts, %d passes without RX buffers, %d guest errors",
		st.ConnsOpened, st.ConnsRefused, st.ConnsOpen, st.TxPackets, st.RxPackets,
		st.TxKicks, st.RxKicks, st.Interrupts, st.RxQueueFull, st.GuestErrors)
}
